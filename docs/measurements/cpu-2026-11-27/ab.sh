#!/usr/bin/env bash
# Base (0a304ee, the start of this session) and main alternating, SmolLM2 on 4 demo prompts x 48 tokens, T=0 and T=1, alone.
set -u
PLANS="eagle:6:48:6:4:wor/traversal,eagle:4:16:4:3:wor/traversal,eagle:6:48:6:4:wor/rrsw,chain:3/block,lookup:8/block"
for round in 1 2; do
  for v in base main; do
    if [ $v = base ]; then D=/work/wt/base0; else D=/work/main; fi
    (cd $D && PYTHONPATH=$D /work/main/.venv/bin/python -m adaptive_spec bench e2e --target smollm2 \
      --prompts adaptive_spec/zoo/smollm2/prompts.jsonl --limit 4 --max-new-tokens 48 --temperatures 0,1 \
      --plans "$PLANS" --no-hf --no-lookup --no-hf-generate --no-progress --json /work/runs/f/ab-$v-$round.json) \
      > /work/runs/f/ab-$v-$round.log 2>&1
    echo "$v round $round rc=$? $(date +%T)"
  done
done
