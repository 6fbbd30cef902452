#!/usr/bin/env bash
# One-call GPU check (issue: a speculative step that costs one captured target pass).
#
#   tools/gpu-check.sh [--device cuda|cpu] [--out DIR] [--limit N] [--tokens N] [--steps pytest,passes,e2e_t0,e2e_t1]
#
# Runs, each step under its own timeout, writing everything to DIR (default data/gpu-check):
#   env.txt        the machine, torch, transformers, the GPU
#   pytest.xml     the `gpu` tests (tests/engine/test_cuda.py, the fused kernels' tests/verifiers/test_kernels.py and
#                  tests/engine/test_draft_kernels.py; skipped without CUDA), JUnit XML
#   passes.json    one SmolLM2 pass and one EAGLE-head level per row count, eager vs captured, each also with the
#                  decoder layers' own modules (--layers-too: the engine runs them in fewer kernels, engine.decoder)
#   e2e_t0.json    bench e2e at T=0: transformers' generate, assisted and prompt lookup, the
#                  engine's plain decoding and plans, on the 12 demo prompts, interleaved
#   e2e_t1.json    the same at T=1 (each step at most 280 s. The H200 took 136 and 167 s with four plans; the six
#                  added since, about 8 s each there, should bring them to about 190 and 220 s)
#   status.txt     one line per step: its exit status and seconds
# and, only when named in --steps:
#   phases.json    bench e2e --phase-sync on 3 prompts at T=0 (chain:2/block, lookup:8/block, the 48-node
#                  tree; no transformers baselines): a device sync at every phase boundary, so each plan's
#                  step splits into draft, target pass, verification and the rest (about 40 s)
#   compile_tests.xml  the `gpu` tests of compiled forwards (left out of the pytest step: they compile)
#   compile.json   bench passes --compile: each size's pass and head level captured from torch.compile's code
#                  beside the eager-captured ones, with the seconds each bucket took to compile (up to 5 min)
#   hostprof.json, hostprof.txt  tools/hostprof.py: per plan (plain decoding, chain:3/block, lookup:8/block, the
#                  48-node tree; 3 prompts x 64 tokens at T=0, after a warm-up), the Python functions by their own host
#                  time a step (cProfile) and the aten ops a step by name (about 60 s)
#   fused_{0,1}_{1,2}.json  bench e2e at T = 1 on 4 prompts (the 48-node trees with traversal and SpecInfer,
#                  iid:3x4/specinfer) with the fused kernels (verifiers; the i.i.d. EAGLE tree's draft levels) off
#                  (ADAPTIVE_SPEC_FUSED=0) and on, alternated
#                  over two rounds (about 3 minutes: not measured yet)
#   attention_{sdpa,timed}_{1,2}.json  bench e2e at T = 0 on 4 prompts (plain decoding, chain:3/block, lookup:8/block)
#                  with the captured passes' attention as sdpa alone and the projections split
#                  (ADAPTIVE_SPEC_ATTENTION=sdpa ADAPTIVE_SPEC_LINEARS=split, as before 2026-11-28i) and with each
#                  bucket's fastest form (engine.decoder.attention_forms: sdpa or matrix products, fused projections or not),
#                  alternated over two rounds (about 3 minutes: not measured yet); passes.json and capacity_*.json
#                  hold both forms' replay ms of every bucket side by side (attention_replay_ms)
#   chains_passes.json  bench passes --chains 1,2,3,4,6 at T = 0 and chains_passes_t1.json at T = 1: a whole chain
#                  draft with the head, level by level against one replay of its captured graph (ModelSlot.draft_graph)
#   chains_{off,on}_t{0,1}_{1,2}.json  bench e2e on 4 prompts (plain decoding, chain:2/block, chain:3/block,
#                  chain:4/block) with the chain graphs off (ADAPTIVE_SPEC_DRAFT_GRAPHS=0: chains drafted level by
#                  level, as before 2026-12-01) and on, alternated over two rounds at each temperature (about 5
#                  minutes: not measured yet)
#   trees_{off,on}_t{0,1}_{1,2}.json  the same for EAGLE-style trees without replacement grown in one replay
#                  (eagle:6:48:6:4:wor/traversal, eagle:4:16:4:3:wor/traversal; about 5 minutes: not measured yet)
#   early_{0,1}_t{0,1}_{1,2}.json  bench e2e on 4 prompts (eagle:5:31:4:4:wor/traversal, the 48-node tree and
#                  lookup:3x8+2+m3x3/nss) with the target's pass waiting for the draft (ADAPTIVE_SPEC_EARLY_PASS=0, as
#                  before 2026-12-06: the captured tree read first, the trie beside the head's path copied from
#                  pageable memory) and not (1), alternated over two rounds at each temperature (about 5 minutes: not
#                  measured yet); the tokens are the same both ways, so the tok/s ratio is the step's time
#   policies_{off,on}_t{0,1}_{1,2}.json  the same for policy chains drafted whole in one replay and cut at their stop
#                  (cum-chain:4:0.2/block, learned-chain:4:0.25/block), hybrid drafts (hybrid:6:2/block: the head's
#                  looked-up run and tail in one replay, level by level before 2026-12-02) and a static tree drafted
#                  in one replay (iid:3x4/specinfer; about 6 minutes: not measured yet)
#   graphs_{off,on}_t{0,1}.json  the three steps above in one (about 5 minutes: not measured yet): bench e2e on 2
#                  prompts with every captured family's plans (chains, the two EAGLE-style trees without
#                  replacement and one with i.i.d. children, eagle:6:48:6:4/specinfer, cum- and learned-chain,
#                  hybrid, iid:3x4/specinfer, conf-delayed:6:0.5:3/traversal), draft graphs off then on at each
#                  temperature, one round
#   syncs.json     bench overhead --syncs --plans families with SmolLM2 on this device: host syncs (by kind and
#                  where, inside the forwards too) and aten ops a step, one plan per family (about 60 s)
#   capacity_512.json, capacity_2048.json  bench passes (1, 4 and 16 rows; the head at 1 and 4) with static caches
#                  of 512 and 2048 rows: what rows beyond a request cost a captured pass, which attends over all
#                  of them (about 40 s)
#   compile_e2e.json  bench e2e --compile-forwards on 4 prompts at T=0 (plain decoding, chain:2/block,
#                  lookup:8/block): the engine with compiled forwards end to end (compiling is done in the
#                  warm-up, on the longest prompt with the timed runs' tokens, so no cache grows after it;
#                  compiled_while_timed_s in the JSON says how much fell inside the timed runs)
#   tune.json, adaptive.yaml  `tune sources --device cuda` on the pair's 14 tuning prompts at T = 0 and 1 (6 trials
#                  each): the per-step source rule tuned on this GPU (the shipped rules were tuned on a CPU, where a
#                  pass costs what its rows cost), written into a copy of the pair's plan file (its `devices: cuda`
#                  section) and installed over the shipped file on this machine (kept in /tmp/gpu-tuned for the
#                  later calls on it), so that a later e2e step plays it as `adaptive` (estimated 4 minutes: not
#                  measured yet; TUNE_TRIALS and TUNE_TEMPERATURES change the 6 trials and T = 0,1). To keep it,
#                  copy that section into adaptive_spec/zoo/smollm2/adaptive.yaml.
# and (a call of its own: it takes the whole budget of one device call):
#   drafts.tar.*   `zoo drafts --device cuda --minutes 7 --init shipped`: the SmolLM2 head and draft trained
#                  further on the device, with build_info.json (the figures before and after), as a tar
#                  split into 15 MiB parts (the machine returns files of at most 16 MiB)
#   datastore.npz, datastore_curve.json, datastore_curve.png  `zoo datastore --extend --device cuda`: the committed
#                  corpus of lookup:WxL+K/nss grown by DS_SHARDS more shards of DS_BATCH self-written requests (by
#                  default 60 x 192, up to about 2.5 M tokens), no new shard after DS_MINUTES (by default 5), then
#                  `bench datastore` with it: the lookup plans' block efficiency at T = 0 by its size on the demo
#                  prompts (docs/measurements/cpu-2026-12-02d/: about 0.1 a doubling of distinct text on this corpus).
#                  To keep it, copy datastore.npz to adaptive_spec/zoo/smollm2/ (its info records every build).
# --device cpu is the dry run (the same steps, fewer prompts and tokens): it must pass anywhere.
# On the GPU machine the whole check takes about 6 minutes (budget: 7): on an H100 on 2026-11-27, the set-up
# 45 s, pytest 60 s, passes 23 s (before --layers-too, which times twice as many forwards), e2e_t0 136 s,
# e2e_t1 175 s; on an H200 the same day pytest 62 s, passes 22 s,
# e2e_t0 139 s, e2e_t1 171 s (the four default steps: 394 s; split them over two calls, as a device call's
# command is limited to 600 s and the set-up comes first). After the set-up of ../shared/tools/gpu (its
# /tmp/site, /tmp/ash and /tmp/stage), a later call on the same warm machine runs this script alone, e.g.
# `tools/gpu-check.sh --steps e2e_t0,e2e_t1 --out $OUT`: it restores the weight files from /tmp/stage.
set -uo pipefail
DEVICE=cuda OUT=data/gpu-check LIMIT="" TOKENS="" STEPS=pytest,passes,e2e_t0,e2e_t1
while [ $# -gt 0 ]; do
  case "$1" in
    --device) DEVICE=$2; shift 2;;
    --out) OUT=$2; shift 2;;
    --limit) LIMIT=$2; shift 2;;
    --tokens) TOKENS=$2; shift 2;;
    --steps) STEPS=$2; shift 2;;
    -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d'; exit 0;;
    *) echo "gpu-check: unknown argument $1 (see --help)"; exit 2;;
  esac
done
if [ "$DEVICE" = cpu ]; then LIMIT=${LIMIT:-2} TOKENS=${TOKENS:-8}; else LIMIT=${LIMIT:-12} TOKENS=${TOKENS:-128}; fi
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
# On the GPU machine, after ../shared/tools/gpu's setup.sh: its packages, its models' home, and the weight
# files, which a later device call's copy of the working tree leaves out (they are untracked there).
STAGE=${GPU_STAGE:-/tmp/stage}
[ -d /tmp/site ] && export PYTHONPATH=/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}
[ -d /tmp/ash ] && export ADAPTIVE_SPEC_HOME=${ADAPTIVE_SPEC_HOME:-/tmp/ash}
if [ -d "$STAGE" ]; then
  (cd "$STAGE" && find . -name '*.safetensors' | sed 's#^\./##') | while read -r f; do
    [ -f "$f" ] || { mkdir -p "$(dirname "$f")" && cp "$STAGE/$f" "$f" && echo "gpu-check: restored $f"; }
  done
fi
# A source rule tuned on this machine by an earlier call's `tune` step (a new call's copy of the working tree has the
# shipped plan file): played by this call's e2e steps.
TUNED=/tmp/gpu-tuned/adaptive.yaml
PAIR_FILE=adaptive_spec/zoo/smollm2/adaptive.yaml
if [ "$DEVICE" != cpu ] && [ -f "$TUNED" ]; then cp "$TUNED" "$PAIR_FILE" && echo "gpu-check: the source rule tuned here ($TUNED)"; fi
mkdir -p "$OUT"; touch "$OUT/status.txt"
FAILED=0
step() {  # step NAME SECONDS COMMAND...: runs when NAME is one of --steps
  local name=$1 limit=$2; shift 2
  case ",$STEPS," in *",$name,"*) ;; *) return 0;; esac
  local t0=$SECONDS
  echo "== $name (at most ${limit}s): $*"
  timeout --kill-after=10 "$limit" "$@"
  local rc=$?
  echo "$name rc=$rc seconds=$((SECONDS - t0))" | tee -a "$OUT/status.txt"
  [ $rc -eq 0 ] || FAILED=1
}
{
  date -u; uname -a
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  $PY -c "import torch, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'transformers', transformers.__version__)"
  lscpu | grep -m1 'Model name'
} > "$OUT/env.txt" 2>&1
step pytest 240 $PY -m pytest -q -p no:cacheprovider -m gpu tests/engine/test_cuda.py tests/verifiers/test_kernels.py \
  tests/engine/test_draft_kernels.py \
  -o addopts="-ra" -k "not compiled" --junitxml="$OUT/pytest.xml"
if [ "$DEVICE" = cpu ]; then PASSES="--repeats 1 --rows 1,2 --draft-rows 1 --context 32"; else PASSES="--repeats 20"; fi
step passes 150 $PY -m adaptive_spec bench passes --target smollm2 --device "$DEVICE" $PASSES --layers-too \
  --no-progress --json "$OUT/passes.json"
PROMPTS=adaptive_spec/zoo/smollm2/prompts.jsonl
# lookup:3x8+2+m3x3/nss and lookup:8+m3x3/nss: lookup tries with the head's greedy path and its top 3 tokens at the
# root (T = 0 on a CPU: 2.52 and 2.24, docs/measurements/cpu-2026-12-06b/), and lookup:2x6+2+m3x3/nss, at most 30
# rows so always the 32-row graph (2.46, where the first has 24 rows on average and up to 46);
# eagle:5:16:4:3:wor (17 rows with the pending token) and eagle:5:31:4:4:wor (32): the 32-row graph, not the 48-node
# tree's 64-row one; at T = 1 on a CPU over three seed sets 1.81 and 1.95 against the 48-node tree's 1.98 on one
# (docs/measurements/cpu-2026-12-06c/). None of them has run on a GPU yet.
PLANS="chain:3/block,eagle:6:48:6:4:wor/traversal,eagle:5:16:4:3:wor/traversal,eagle:5:31:4:4:wor/traversal"
PLANS="$PLANS,lookup:8/block,lookup:3x8+2/nss"
PLANS="$PLANS,lookup:3x8+2+m3x3/nss,lookup:2x6+2+m3x3/nss,lookup:8+m3x3/nss,adaptive"
for T in 0 1; do
  step "e2e_t$T" 280 $PY -m adaptive_spec bench e2e --target smollm2 --device "$DEVICE" --prompts "$PROMPTS" \
    --limit "$LIMIT" --max-new-tokens "$TOKENS" --temperatures "$T" --plans "$PLANS" --no-progress \
    --json "$OUT/e2e_t$T.json"
done
step phases 120 $PY -m adaptive_spec bench e2e --target smollm2 --device "$DEVICE" --prompts "$PROMPTS" \
  --limit 3 --max-new-tokens "$TOKENS" --temperatures 0 --no-hf --no-lookup --no-hf-generate --phase-sync \
  --plans "chain:2/block,lookup:8/block,eagle:6:48:6:4:wor/traversal" --no-progress --json "$OUT/phases.json"
# The fused kernels (adaptive_spec.verifiers.kernels; engine.draft_kernels: eagle:6:48:6:4's draft levels) against
# the torch code, at T = 1 on the trees they verify: ADAPTIVE_SPEC_FUSED=0 and =1 alternated, two rounds (4 prompts each, no transformers baselines).
FUSED_PLANS="eagle:6:48:6:4:wor/traversal,eagle:6:48:6:4/specinfer,iid:3x4/specinfer"
step fused 300 bash -c 'for r in 1 2; do for f in 0 1; do ADAPTIVE_SPEC_FUSED=$f '"$PY"' -m adaptive_spec bench e2e \
  --target smollm2 --device '"$DEVICE"' --prompts '"$PROMPTS"' --limit 4 --max-new-tokens '"$TOKENS"' \
  --temperatures 1 --no-hf --no-lookup --no-hf-generate --plans '"$FUSED_PLANS"' --no-progress \
  --json '"$OUT"'/fused_${f}_$r.json || exit 1; done; done'
# The captured passes' forms: sdpa with split projections (as before 2026-11-28i) against each bucket's fastest (unset),
# at T = 0 on 4 prompts, alternated over two rounds (no transformers baselines).
step attention 300 bash -c 'for r in 1 2; do for a in sdpa timed; do [ $a = timed ] && v= l= || v=$a l=split; \
  ADAPTIVE_SPEC_ATTENTION=$v ADAPTIVE_SPEC_LINEARS=$l '"$PY"' -m adaptive_spec bench e2e --target smollm2 --device '"$DEVICE"' \
  --prompts '"$PROMPTS"' --limit 4 --max-new-tokens '"$TOKENS"' --temperatures 0 --no-hf --no-lookup --no-hf-generate \
  --plans chain:3/block,lookup:8/block --no-progress --json '"$OUT"'/attention_${a}_$r.json || exit 1; done; done'
# Whole chain drafts in one replay (engine.graphs ModelSlot.draft_graph) against level by level: the drafts alone, then
# end to end with ADAPTIVE_SPEC_DRAFT_GRAPHS=0 and =1 alternated, two rounds a temperature (no transformers baselines).
if [ "$DEVICE" = cpu ]; then CHAINS="--rows 1 --draft-rows 1 --repeats 1 --context 32 --chains 1,3"; else CHAINS="--rows 1 --draft-rows 1 --repeats 20 --chains 1,2,3,4,6"; fi
step chains 420 bash -c "$PY -m adaptive_spec bench passes --target smollm2 --device $DEVICE $CHAINS --no-progress \
  --json $OUT/chains_passes.json && $PY -m adaptive_spec bench passes --target smollm2 --device $DEVICE $CHAINS \
  --chain-temperature 1 --no-progress --json $OUT/chains_passes_t1.json && for T in 0 1; do for r in 1 2; do \
  for c in off on; do [ \$c = on ] && v=1 || v=0; ADAPTIVE_SPEC_DRAFT_GRAPHS=\$v $PY -m adaptive_spec bench e2e \
  --target smollm2 --device $DEVICE --prompts $PROMPTS --limit 4 --max-new-tokens $TOKENS --temperatures \$T \
  --no-hf --no-lookup --no-hf-generate --plans chain:2/block,chain:3/block,chain:4/block --no-progress \
  --json $OUT/chains_\${c}_t\${T}_\$r.json || exit 1; done; done; done"
step trees 420 bash -c "for T in 0 1; do for r in 1 2; do for c in off on; do [ \$c = on ] && v=1 || v=0; \
  ADAPTIVE_SPEC_DRAFT_GRAPHS=\$v $PY -m adaptive_spec bench e2e --target smollm2 --device $DEVICE --prompts $PROMPTS \
  --limit 4 --max-new-tokens $TOKENS --temperatures \$T --no-hf --no-lookup --no-hf-generate \
  --plans eagle:6:48:6:4:wor/traversal,eagle:4:16:4:3:wor/traversal --no-progress \
  --json $OUT/trees_\${c}_t\${T}_\$r.json || exit 1; done; done; done"
# The target's pass queued without waiting for the draft (a captured EAGLE-style tree read after it, engine.drafting.
# DeferredTree; a lookup trie beside the head's path copied without blocking) against waiting, as before.
step early 420 bash -c "for T in 0 1; do for r in 1 2; do for e in 0 1; do \
  ADAPTIVE_SPEC_EARLY_PASS=\$e $PY -m adaptive_spec bench e2e --target smollm2 --device $DEVICE --prompts $PROMPTS \
  --limit 4 --max-new-tokens $TOKENS --temperatures \$T --no-hf --no-lookup --no-hf-generate \
  --plans eagle:5:31:4:4:wor/traversal,eagle:6:48:6:4:wor/traversal,lookup:3x8+2+m3x3/nss --no-progress \
  --json $OUT/early_\${e}_t\${T}_\$r.json || exit 1; done; done; done"
# The same for policy chains (drafted to their depth in one replay, cut at the stop with one read), a model's hybrid
# drafts (the looked-up run fed in the chain's replay; the head's hybrid drafts stay level by level) and a static tree.
step policies 420 bash -c "for T in 0 1; do for r in 1 2; do for c in off on; do [ \$c = on ] && v=1 || v=0; \
  ADAPTIVE_SPEC_DRAFT_GRAPHS=\$v $PY -m adaptive_spec bench e2e --target smollm2 --device $DEVICE --prompts $PROMPTS \
  --limit 4 --max-new-tokens $TOKENS --temperatures \$T --no-hf --no-lookup --no-hf-generate \
  --plans cum-chain:4:0.2/block,learned-chain:4:0.25/block,hybrid:6:2/block,iid:3x4/specinfer --no-progress \
  --json $OUT/policies_\${c}_t\${T}_\$r.json || exit 1; done; done; done"
# Every family a whole draft is captured for, in one step that fits one device call beside the pytest step (about 4
# minutes): off then on at each temperature, one round of 2 prompts (the three steps above, for more rounds, take a
# call each).
GRAPH_PLANS="chain:2/block,chain:3/block,chain:4/block,eagle:6:48:6:4:wor/traversal,eagle:4:16:4:3:wor/traversal"
GRAPH_PLANS="$GRAPH_PLANS,eagle:6:48:6:4/specinfer,cum-chain:4:0.2/block,learned-chain:4:0.25/block,hybrid:6:2/block"
GRAPH_PLANS="$GRAPH_PLANS,iid:3x4/specinfer,conf-delayed:6:0.5:3/traversal"
step graphs 330 bash -c "for T in 0 1; do for c in off on; do [ \$c = on ] && v=1 || v=0; \
  ADAPTIVE_SPEC_DRAFT_GRAPHS=\$v $PY -m adaptive_spec bench e2e --target smollm2 --device $DEVICE --prompts $PROMPTS \
  --limit 2 --max-new-tokens $TOKENS --temperatures \$T --no-hf --no-lookup --no-hf-generate \
  --plans $GRAPH_PLANS --no-progress --json $OUT/graphs_\${c}_t\${T}.json || exit 1; done; done"
# Host syncs and aten ops a step on this device's own paths (captured forwards, fused kernels), one plan per family
# (SmolLM2 with its head; about 60 s): the counts of issue 30's item 6, which a CPU counts on the accelerator's path.
if [ "$DEVICE" = cpu ]; then SYNCS="--limit 1 --max-new-tokens 8"; else SYNCS="--limit 2 --max-new-tokens 32"; fi
step syncs 150 $PY -m adaptive_spec bench overhead --syncs --target smollm2 --device "$DEVICE" --plans families \
  $SYNCS --json "$OUT/syncs.json"
# Where the host's time goes in a step (cProfile's functions and aten ops per step; about 60 s): a drafting step is
# bound by the host on a GPU (2.7 ms of host time for three captured head levels of about 0.2 ms each).
if [ "$DEVICE" = cpu ]; then HOSTPROF="--prompts 1 --tokens 8 --plans autoregressive,chain:3/block"; else HOSTPROF=""; fi
step hostprof 150 $PY tools/hostprof.py --device "$DEVICE" --out "$OUT" $HOSTPROF
# What the rows a static cache holds cost a captured pass, which attends over all of them (an eager one attends
# over the context only): the same passes with caches of 512 and 2048 rows.
if [ "$DEVICE" = cpu ]; then CAP="--rows 1 --draft-rows 1 --repeats 1 --context 32"; else CAP="--rows 1,4,16 --draft-rows 1,4 --repeats 20"; fi
for C in 512 2048; do
  step capacity 60 $PY -m adaptive_spec bench passes --target smollm2 --device "$DEVICE" $CAP --capacity $C \
    --no-progress --json "$OUT/capacity_$C.json"
done
if [ "$DEVICE" = cpu ]; then COMPILE="--rows 1,4 --draft-rows 1 --repeats 1 --context 32"; else COMPILE="--rows 1,2,4,8 --draft-rows 1,2,4 --repeats 10"; fi
step compile_tests 200 $PY -m pytest -q -p no:cacheprovider -m gpu tests/engine/test_cuda.py -o addopts="-ra" \
  -k compiled --junitxml="$OUT/compile_tests.xml"
step compile 300 $PY -m adaptive_spec bench passes --target smollm2 --device "$DEVICE" --compile $COMPILE \
  --no-progress --json "$OUT/compile.json"
step compile_e2e 200 $PY -m adaptive_spec bench e2e --target smollm2 --device "$DEVICE" --prompts "$PROMPTS" \
  --limit 4 --max-new-tokens "$TOKENS" --temperatures 0 --no-hf --no-lookup --no-hf-generate --compile-forwards \
  --plans "chain:2/block,lookup:8/block" --no-progress --json "$OUT/compile_e2e.json"
# The source rule tuned on this device; on a GPU it replaces the shipped plan file here, and in later calls on this
# machine (kept in /tmp/gpu-tuned); not on a CPU (a dry run).
TUNE_PROMPTS="--prompts adaptive_spec/zoo/smollm2/tune_prompts.jsonl --prompts adaptive_spec/zoo/smollm2/tune_lookup_prompts.jsonl"
if [ "$DEVICE" = cpu ]; then
  TUNE="--limit 1 --max-new-tokens 8 --trials 1 --temperatures 0 --static chain:1/block"; INSTALL=true
else
  TUNE="--trials ${TUNE_TRIALS:-6} --temperatures ${TUNE_TEMPERATURES:-0,1}"
  INSTALL="cp $OUT/adaptive.yaml $PAIR_FILE && mkdir -p /tmp/gpu-tuned && cp $OUT/adaptive.yaml $TUNED"
fi
# optuna is not on the GPU machine (2026-11-28): ship it as wheels beside the set-up's, e.g. `pip download --no-deps
# --only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux2014_x86_64 -d .gpu/part4/extra
# optuna==4.9.0 alembic colorlog Mako SQLAlchemy MarkupSafe`, then `pip install --no-index --no-deps --target /tmp/site
# .gpu/part4/extra/*.whl` there after setup.sh (docs/measurements/gpu-h200-2026-11-28c/).
case ",$STEPS," in *",tune,"*)
  $PY -c "import optuna" 2>/dev/null || echo "gpu-check: tune needs optuna, which this machine lacks: ship its wheels (see above this step in $0)";;
esac
step tune 450 bash -c "cp $PAIR_FILE $OUT/adaptive.yaml && $PY -m adaptive_spec tune sources --target smollm2 \
  --device $DEVICE $TUNE_PROMPTS $TUNE --out-file $OUT/adaptive.yaml --storage sqlite:///$OUT/tune.db \
  --json $OUT/tune.json --no-progress && $INSTALL"
# The drafts build: a budget of 8 minutes on the device; a token run of it on a CPU.
if [ "$DEVICE" = cpu ]; then
  DRAFTS="--minutes 3 --shards 1 --batch 4 --spec-bench 2"
else
  # DRAFT_MINUTES: a shorter build when less device time is left. DRAFT_SEED: by default the first seed the
  # committed builds did not use, so that the build writes new conversations instead of theirs again.
  [ -n "${DRAFT_SEED:-}" ] || DRAFT_SEED=$($PY -c 'from adaptive_spec.zoo.drafts import unused_seed; print(unused_seed("adaptive_spec/zoo/smollm2"))')
  DRAFTS="--minutes ${DRAFT_MINUTES:-7} --seed ${DRAFT_SEED:-0}"
fi
step drafts 520 $PY -m adaptive_spec zoo drafts smollm2 --device "$DEVICE" --init shipped $DRAFTS \
  --work "$OUT/drafts-work" --out "$OUT/drafts" --no-progress
case ",$STEPS," in *",drafts,"*)
  rm -rf "$OUT/drafts-work"
  [ -d "$OUT/drafts" ] && tar -cf - -C "$OUT" drafts | split -b 15M - "$OUT/drafts.tar." && rm -rf "$OUT/drafts";;
esac
# A larger datastore, written on the device, and its curve (the bench decodes the demo prompts' greedy answers once).
case ",$STEPS," in *",datastore,"*)
  cp adaptive_spec/zoo/smollm2/datastore.npz "$OUT/datastore.npz"
  DS_BASE=$($PY -c "from adaptive_spec.trees.datastore import Datastore as D; print(D.load('$OUT/datastore.npz').info['shards'])");;
esac
if [ "$DEVICE" = cpu ]; then
  DS="--shards $((${DS_BASE:-0} + 1)) --batch 2 --answer-tokens 16"; DSB="--fractions 0.5,1 --samples 1"
else
  DS="--shards $((${DS_BASE:-0} + ${DS_SHARDS:-60})) --batch ${DS_BATCH:-192} --minutes ${DS_MINUTES:-5}"; DSB=""
fi
step datastore 420 $PY -m adaptive_spec zoo datastore smollm2 --extend --device "$DEVICE" $DS \
  --work "$OUT/datastore-work" --out "$OUT/datastore.npz" --no-progress
step datastore 120 $PY -m adaptive_spec bench datastore --target smollm2 --device "$DEVICE" --datastore \
  "$OUT/datastore.npz" --limit "$LIMIT" --max-new-tokens "$TOKENS" $DSB --json "$OUT/datastore_curve.json" \
  --plot "$OUT/datastore_curve.png" --no-progress
case ",$STEPS," in *",datastore,"*) rm -rf "$OUT/datastore-work";; esac
echo "gpu-check: wrote $OUT ($(ls "$OUT" | tr '\n' ' '))"
exit $FAILED
