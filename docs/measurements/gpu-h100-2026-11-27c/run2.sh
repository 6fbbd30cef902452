# The second device call of 2026-11-27c, after the four carrying calls (the last one ran
# `DRAFT_MINUTES=6 tools/gpu-check.sh --steps drafts` and unpacked its drafts into /tmp/newd): the drafts trained
# there replace the committed ones (in the tree and in /tmp/stage, so later calls get them too), then compiled
# forwards end to end and the 12-prompt check at T = 0 with them.
# As it ran, it missed them: the build writes sharded files (model-0000N-of-00002.safetensors and an index), not
# eagle/model.safetensors, so it said "no new drafts" and both steps ran with the drafts committed before.
set -u
export PYTHONPATH=/tmp/site:$PWD ADAPTIVE_SPEC_HOME=/tmp/ash PYTHONUNBUFFERED=1
tools/gpu-check.sh --device cuda --out /tmp/x --steps none >/dev/null 2>&1  # restores the weight files
Z=adaptive_spec/zoo/smollm2
if [ -f /tmp/newd/drafts/eagle/model.safetensors ]; then
  for d in eagle draft; do
    rm -f $Z/$d/*.safetensors; rm -f /tmp/stage/$Z/$d/*.safetensors
    cp /tmp/newd/drafts/$d/* $Z/$d/ && cp /tmp/newd/drafts/$d/* /tmp/stage/$Z/$d/
  done
  echo "run2: the new drafts in place"; ls -l $Z/eagle $Z/draft
else
  echo "run2: no new drafts in /tmp/newd: the committed ones"
fi
tools/gpu-check.sh --device cuda --out $OUT --steps compile_e2e,e2e_t0 2>&1 | grep -v Converting | tail -40
