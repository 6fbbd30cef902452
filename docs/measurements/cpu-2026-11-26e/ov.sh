#!/usr/bin/env bash
# bench overhead, base (4c7c851) and main alternating, built-in pair, alone.
set -u
PLANS="delayed:1x3x2/traversal,wor:2x2x1/traversal,eagle:6:48:6:4:wor/traversal,iid:3x5/specinfer,iid:4x12/specinfer,wor:2x2x1/rrsw"
for round in 1 2; do
  for v in base main; do
    if [ $v = base ]; then D=/work/wt/base; else D=/work/main; fi
    (cd $D && PYTHONPATH=$D /work/main/.venv/bin/python -m adaptive_spec bench overhead --plans "$PLANS" \
      --limit 4 --max-new-tokens 64 --json /work/runs/e/ov-$v-$round.json) > /work/runs/e/ov-$v-$round.log 2>&1
    echo "$v round $round rc=$?"
  done
done
