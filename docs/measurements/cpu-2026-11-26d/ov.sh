#!/usr/bin/env bash
# bench overhead, base (726eff7) and main alternating, built-in pair, alone.
set -u
PLANS="iid:3x5/specinfer,wor:2x2x1/rrsw,delayed:1x3x2/traversal,iid:4x12/specinfer,conf-chain:6:0.3/block,eagle:6:48:6:4:wor/traversal"
for round in 1 2; do
  for v in base main; do
    if [ $v = base ]; then D=/work/wt/base; else D=/work/main; fi
    (cd $D && PYTHONPATH=$D /work/main/.venv/bin/python -m adaptive_spec bench overhead --plans "$PLANS" \
      --limit 4 --max-new-tokens 64 --json /work/runs/d/ov-$v-$round.json) > /work/runs/d/ov-$v-$round.log 2>&1
    echo "$v round $round rc=$?"
  done
done
