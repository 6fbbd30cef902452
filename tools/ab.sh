#!/usr/bin/env bash
# A/B of two commits, alternating, on one machine (run it alone: nothing else may run beside a timing).
#
#   tools/ab.sh BASE OUT KIND PLANS [ROUNDS] [-- extra bench options]
#
#   BASE    the commit to compare with (checked out once as a detached worktree under /work/wt/ab-BASE)
#   OUT     the folder for the JSON and logs: OUT/<prefix>-{base,main}-<round>.json, <prefix> = ab or ov
#   KIND    e2e: `bench e2e --target smollm2` on the demo prompts (4 x 48 tokens, T = 0 and 1, no HF rows)
#           ov:  `bench overhead` with the built-in pair (4 prompts x 64 tokens)
#   PLANS   comma-separated plans
#   ROUNDS  rounds of base then main (default 2)
#   PREFIX  (environment) another file prefix than ab / ov, for a second run into one folder
#
# Main is the working tree this script sits in. `python tools/abstat.py OUT` prints the e2e means;
# `python tools/abstat.py OUT ov` the overhead ones (OUT PREFIX for another prefix).
set -u
if [ $# -lt 4 ]; then
  sed -n 2,14p "$0"
  exit 2
fi
BASE=$1 OUT=$2 KIND=$3 PLANS=$4
shift 4
ROUNDS=2
if [ $# -gt 0 ] && [ "$1" != "--" ]; then ROUNDS=$1; shift; fi
[ $# -gt 0 ] && [ "$1" = "--" ] && shift
MAIN=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-$MAIN/.venv/bin/python}
WT=/work/wt/ab-$(git -C "$MAIN" rev-parse --short "$BASE") || exit 2
if [ ! -d "$WT" ]; then
  git -C "$MAIN" worktree add --detach "$WT" "$BASE" >/dev/null || exit 2
fi
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
case $KIND in
  e2e) PREFIX=${PREFIX:-ab} ;;
  ov) PREFIX=${PREFIX:-ov} ;;
  *) echo "KIND must be e2e or ov, got $KIND" >&2; exit 2 ;;
esac
for round in $(seq 1 "$ROUNDS"); do
  for v in base main; do
    if [ $v = base ]; then D=$WT; else D=$MAIN; fi
    J=$OUT/$PREFIX-$v-$round.json
    if [ "$KIND" = e2e ]; then
      (cd "$D" && PYTHONPATH=$D "$PY" -m adaptive_spec bench e2e --target smollm2 \
        --prompts adaptive_spec/zoo/smollm2/prompts.jsonl --limit 4 --max-new-tokens 48 --temperatures 0,1 \
        --plans "$PLANS" --no-hf --no-lookup --no-hf-generate --no-progress --json "$J" "$@") >"${J%.json}.log" 2>&1
    else
      (cd "$D" && PYTHONPATH=$D "$PY" -m adaptive_spec bench overhead --plans "$PLANS" --limit 4 \
        --max-new-tokens 64 --json "$J" "$@") >"${J%.json}.log" 2>&1
    fi
    echo "$v round $round rc=$? $(date +%T)"
  done
done
