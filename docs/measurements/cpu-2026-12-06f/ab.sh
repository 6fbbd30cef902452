#!/usr/bin/env bash
# bench e2e, base (7f45127 with the version-1 weight-order cache in OLD_HOME: stock/column-major) against main
# (the packed copy too, the real user data folder), alternated, 3 rounds; alone on the machine. OUT: the JSON folder.
BASE=/work/wt/ab-7f45127
[ -d $BASE ] || git -C /work/main worktree add --detach $BASE 7f45127 >/dev/null
PY=/work/main/.venv/bin/python
PLANS="chain:1/block,chain:2/block,chain:3/block,lookup:8/block,lookup:3x8/nss,lookup:8+m3x3/nss,eagle:5:31:4:4:wor/traversal,adaptive"
OUT=${OUT:-/tmp/s30/ab2}
for round in 1 2 3; do
  for v in base main; do
    if [ $v = base ]; then D=$BASE; H=${OLD_HOME:-/tmp/s30/home_v1}; else D=/work/main; H=/root/.local/share/adaptive-spec; fi
    J=$OUT/ab-$v-$round.json
    (cd $D && ADAPTIVE_SPEC_HOME=$H PYTHONPATH=$D $PY -m adaptive_spec bench e2e --target smollm2 \
      --prompts adaptive_spec/zoo/smollm2/prompts.jsonl --limit 4 --max-new-tokens 48 --temperatures 0,1 \
      --plans "$PLANS" --no-hf --no-lookup --no-hf-generate --no-progress --json $J) > ${J%.json}.log 2>&1
    echo "$v round $round rc=$? $(date +%T)"
  done
done
