# The T = 1 acceptance check of README.md (its JSON: t1-{base,main}-{0,1}.json here); /work/wt/ab-03c8141 is tools/ab.sh's worktree of the base.
for seed in 0 1; do for v in base main; do
  if [ $v = base ]; then D=/work/wt/ab-03c8141; else D=/work/main; fi
  (cd $D && PYTHONPATH=$D /work/main/.venv/bin/python -m adaptive_spec bench e2e --target smollm2 --prompts adaptive_spec/zoo/smollm2/prompts.jsonl --limit 12 --max-new-tokens 128 --temperatures 1 --plans chain:1/block --no-hf --no-lookup --no-hf-generate --no-progress --seed $seed --json /work/runs/headt1/$v-$seed.json) > /work/runs/headt1/$v-$seed.log 2>&1
  echo "$v $seed $(date +%T)"
done; done
