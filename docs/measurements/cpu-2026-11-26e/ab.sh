#!/usr/bin/env bash
# Old main (4c7c851) and new main alternating, SmolLM2 on 4 demo prompts x 48 tokens, T=0 and T=1, alone.
set -u
PLANS="iid:3x4/specinfer,wor:2x2x1/rrsw,delayed:1x3x2/traversal,wor:2x2x1/traversal,eagle:6:48:6:4:wor/traversal"
for round in 1 2; do
  for v in base main; do
    if [ $v = base ]; then D=/work/wt/base; else D=/work/main; fi
    (cd $D && PYTHONPATH=$D /work/main/.venv/bin/python -m adaptive_spec bench e2e --target smollm2 \
      --prompts adaptive_spec/zoo/smollm2/prompts.jsonl --limit 4 --max-new-tokens 48 --temperatures 0,1 \
      --plans "$PLANS" --no-hf --no-lookup --no-hf-generate --no-progress --json /work/runs/e/ab-$v-$round.json) \
      > /work/runs/e/ab-$v-$round.log 2>&1
    echo "$v round $round rc=$?"
  done
done
