#!/usr/bin/env bash
# item 9 over the whole issue: base 79f022d (main when issue 30 was filed, with today's head weights) vs main, ABBA
OUT=/work/runs/item9
PLANS=chain:3/block,lookup:8/block,iid:3x4/specinfer,eagle:6:48:6:4:wor/traversal
PY=/work/main/.venv/bin/python
i=0
for order in base main main base base main main base; do
  i=$((i+1))
  if [ $order = base ]; then D=/work/wt/ab-79f022d; EXTRA=""; else D=/work/main; EXTRA=""; fi
  J=$OUT/ab-$order-$i.json
  (cd $D && PYTHONPATH=$D $PY -m adaptive_spec bench e2e --target smollm2 \
    --prompts adaptive_spec/zoo/smollm2/prompts.jsonl --limit 4 --max-new-tokens 48 --temperatures 0,1 \
    --plans "$PLANS" --no-hf --no-lookup --no-progress $EXTRA --json "$J") > ${J%.json}.log 2>&1
  echo "$(date +%T) done $J rc=$?" >> $OUT/progress.txt
done
echo finished >> $OUT/progress.txt
