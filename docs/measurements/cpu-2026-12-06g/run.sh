#!/bin/bash
# The SmolLM2 pair's CPU source rules tuned again after the packed weights (cpu-2026-12-06f), this host, alone.
# The plan file starts as the shipped one, so its rules are the studies' first trials.
set -x
cd /work/main
PY=.venv/bin/python
T=/work/runs/tune-g
Z=adaptive_spec/zoo/smollm2
$PY -m adaptive_spec tune sources --target smollm2 --prompts $Z/tune_prompts.jsonl --prompts $Z/tune_lookup_prompts.jsonl \
  --temperatures 0,1 --trials 6 --gate $Z/source_gate.json --out-file $T/adaptive.yaml --json $T/sources.json \
  --storage sqlite:///$T/optuna.db --study-prefix smollm2-packed --no-progress > $T/log 2>&1
echo tuned > $T/TUNED
