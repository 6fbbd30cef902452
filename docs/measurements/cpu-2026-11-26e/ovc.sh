#!/usr/bin/env bash
# bench overhead, base (4c7c851) and main alternating, built-in pair, alone.
set -u
PLANS="conf-chain:6:0.3/block,cum-chain:6:0.2/block,learned-chain:6:0.15/block"
for round in 1 2; do
  for v in base main; do
    if [ $v = base ]; then D=/work/wt/base; else D=/work/main; fi
    (cd $D && PYTHONPATH=$D /work/main/.venv/bin/python -m adaptive_spec bench overhead --plans "$PLANS" \
      --limit 4 --max-new-tokens 64 --json /work/runs/e/ovc-$v-$round.json) > /work/runs/e/ovc-$v-$round.log 2>&1
    echo "$v round $round rc=$?"
  done
done
