#!/bin/bash
# After run.sh: the tuned rules beside the rules they replace and the fastest static plans on the 12 demo prompts,
# one interleaved run per temperature and round (each plan against the engine's plain decoding in the same run).
set -x
cd /work/main
PY=.venv/bin/python
T=/work/runs/tune-g
Z=adaptive_spec/zoo/smollm2
while [ ! -f $T/TUNED ]; do sleep 20; done
pick() { python3 -c "import yaml,sys; d=yaml.safe_load(open(sys.argv[1])); print(d['plans'][sys.argv[2]]['plan'])" "$1" "$2"; }
dd() { echo "$1" | tr ',' '\n' | awk '!s[$0]++' | paste -sd, ; }
for t in 0 1; do
  NEW=$(pick $T/adaptive.yaml $t); OLD=$(pick $T/adaptive.before.yaml $t)
  PLANS=$(dd "$NEW,$OLD,chain:1/block,chain:2/block,lookup:8+m3x3/nss,lookup:3x8/nss")
  for r in 1 2; do
    $PY -m adaptive_spec bench e2e --target smollm2 --prompts $Z/prompts.jsonl --max-new-tokens 64 --temperatures $t \
      --no-hf --no-lookup --no-hf-generate --plans "$PLANS" --no-progress --json $T/demo_t${t}_r$r.json > $T/demo_t${t}_r$r.log 2>&1
  done
done
echo done > $T/DEMO
