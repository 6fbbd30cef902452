#!/bin/bash
# Tuned plan files for the SmolLM2 head trained on the H100 (2026-11-27c); the plan files it replaces are tried too.
set -x
cd /work/main
PY=.venv/bin/python
T=/work/runs/tune2
Z=adaptive_spec/zoo/smollm2
$PY -m adaptive_spec tune sources --target smollm2 --prompts $Z/tune_prompts.jsonl --prompts $Z/tune_lookup_prompts.jsonl \
  --temperatures 0,1 --trials 6 --gate $Z/source_gate.json --out-file $T/adaptive.yaml --json $T/sources.json \
  --storage sqlite:///$T/optuna.db --study-prefix smollm2-gate7 --no-progress > $T/log 2>&1
R0=$(grep -A2 "'0':" $T/adaptive.yaml | sed -n "s/ *plan: //p" | head -1)
OLD0=$(grep -A2 "'0':" $T/adaptive.before.yaml | sed -n "s/ *plan: //p" | head -1)
dd() { echo "$1" | tr ',' '\n' | awk '!s[$0]++' | paste -sd, ; }
GATE="source:chain:1/block+lookup:3x8/nss?gate=$Z/source_gate.json&margin=1.000"
$PY -m adaptive_spec bench e2e --target smollm2 --prompts $Z/prompts.jsonl --limit 12 --max-new-tokens 48 --temperatures 0 \
  --no-hf --no-lookup --no-hf-generate --plans "$(dd "$R0,$OLD0,$GATE,chain:1/block,lookup:8/block")" --no-progress --json $T/demo_t0.json > $T/demo_t0.log 2>&1
R1=$(grep -A2 "'1':" $T/adaptive.yaml | sed -n "s/ *plan: //p" | head -1)
$PY -m adaptive_spec bench e2e --target smollm2 --prompts $Z/prompts.jsonl --limit 12 --max-new-tokens 48 --temperatures 1 \
  --no-hf --no-lookup --no-hf-generate --plans "$(dd "$R1,$GATE,chain:1/block,lookup:8/block")" --no-progress --json $T/demo_t1.json > $T/demo_t1.log 2>&1
$PY -m adaptive_spec tune policies --target smollm2 --prompts $Z/tune_prompts.jsonl --limit 8 --temperatures 0,1 \
  --out-file $T/in-draft.yaml --json $T/policies.json --no-progress > $T/policies.log 2>&1
echo done > $T/DONE
