"""In one process, interleaved: SmolLM2 tree plans (4 demo prompts x 48 tokens) with this round's changes on their path
(new) against them undone (old): a result's prefix built from every node's prefixes (`tree.prefixes`), and traversal's
host walk with a mask cloned per rejection and a `where` per residual (the module at `da2b1a1`, read from git).
Run from the repository root: python docs/measurements/cpu-2026-11-27f/treeexp.py [PLAN T ROUNDS]
"""
import importlib.util
import statistics as st
import subprocess
import sys
import tempfile
from pathlib import Path

from adaptive_spec.engine import step
from adaptive_spec.engine.load import load_engine
from adaptive_spec.files import read_prompts, render_prompt
from adaptive_spec.verifiers import base, block, hsd, rrs, token, traversal, walk

plan = sys.argv[1] if len(sys.argv) > 1 else "iid:3x4/specinfer"
T = float(sys.argv[2]) if len(sys.argv) > 2 else 1.0
rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 4
source = subprocess.run(
    ["git", "show", "da2b1a1:adaptive_spec/verifiers/traversal.py"], capture_output=True, text=True, check=True
).stdout
path = Path(tempfile.mkdtemp()) / "traversal_before.py"
path.write_text(source)
spec = importlib.util.spec_from_file_location("traversal_before", path)
before = importlib.util.module_from_spec(spec)
spec.loader.exec_module(before)
e = load_engine("smollm2", None, "cpu", None)
prompts = [render_prompt(e.tokenizer, p) for p in read_prompts("adaptive_spec/zoo/smollm2/prompts.jsonl", 4)]
new_result_for, new_impl = base.result_for, traversal.traversal_impl


def old_result_for(tree, node, token, bonus, ride=(), on_device=None):
    prefix = tree.prefixes[node]
    return base.VerifyResult(node, len(prefix), prefix + (int(token),), bonus, tuple(ride), on_device)


def use(result_for, impl):
    for m in (step, traversal, rrs, base, hsd, walk, block, token, before):
        if hasattr(m, "result_for"):
            m.result_for = result_for
    traversal.traversal_impl = impl


res = {}
for _ in range(rounds):
    for name, v in (("old", (old_result_for, before.traversal_impl)), ("new", (new_result_for, new_impl))):
        use(*v)
        steps = secs = toks = 0
        for i, p in enumerate(prompts):
            r = e.generate(p, max_new_tokens=48, temperature=T, plan=plan, seed=i)
            secs += r.stats.wall_time_s
            toks += r.stats.new_tokens
            steps += r.stats.steps
        res.setdefault(name, []).append(toks / secs)
        print(name, round(toks / secs, 2), "tok/s", steps, "steps", flush=True)
for k, v in res.items():
    print(plan, "T", T, k, " ".join(f"{x:.2f}" for x in v), "median", round(st.median(v), 2))
