# The second device call of 2026-11-27b (after the four carrying calls and `DRAFT_MINUTES=6 tools/gpu-check.sh
# --steps drafts`): the head trained in that call (carried back in as .gpu/newhead) end to end, then the
# shipped head's compiled-forward steps.
set -u
export PYTHONPATH=/tmp/site:$PWD ADAPTIVE_SPEC_HOME=/tmp/ash PYTHONUNBUFFERED=1
tools/gpu-check.sh --device cuda --out /tmp/x --steps none >/dev/null 2>&1
E=adaptive_spec/zoo/smollm2/eagle
cp -r $E /tmp/oldeagle && rm -f $E/model.safetensors && cp .gpu/newhead/*.json .gpu/newhead/*.safetensors $E/
ls $E
timeout 110 python3 -m adaptive_spec bench e2e --target smollm2 --device cuda --prompts adaptive_spec/zoo/smollm2/prompts.jsonl --limit 6 --max-new-tokens 128 --temperatures 0 --no-hf --no-lookup --no-hf-generate --plans chain:2/block,chain:3/block,eagle:6:48:6:4:wor/traversal,lookup:8/block --no-progress --json $OUT/newhead_t0.json 2>&1 | tail -15
rm -rf $E && cp -r /tmp/oldeagle $E && ls $E
tools/gpu-check.sh --device cuda --out $OUT --steps compile_e2e,compile_tests 2>&1 | grep -v Converting | tail -30
