#!/bin/bash
# The SmolLM2 pair's in-draft policies tuned again on this host with the packed weights, alone on the machine.
set -x
cd /work/main
T=/work/runs/tune-g
Z=adaptive_spec/zoo/smollm2
.venv/bin/python -m adaptive_spec tune policies --target smollm2 --prompts $Z/tune_prompts.jsonl --limit 8 --temperatures 0,1 \
  --out-file $T/in-draft.yaml --json $T/policies.json --no-progress > $T/policies.log 2>&1
echo done > $T/POLICIES
