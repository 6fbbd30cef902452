"""Expected block efficiency of EAGLE-style trees at the same contexts, T = 1: each plan's first tree at every
context, its traversal verification's E[accepted + 1] computed exactly (adaptive_spec.analysis.expected) against the
target's rows. The contexts are the 12 demo prompts with every STRIDE-th prefix of the answer the engine samples at
T = 1 (plain decoding, seed = the prompt's index). Paired over contexts: no verifier coin flips, no diverging texts.

Usage: python tree_expected_be.py OUT.json PLAN [PLAN ...]   (env STRIDE, default 16; SEEDS,
default 1; PROMPTS, default 12)
"""

import json
import math
import os
import sys

from adaptive_spec.analysis.expected import expected_block_efficiency
from adaptive_spec.engine.load import load_engine
from adaptive_spec.zoo.user_prompts import demo_prompts

out, plans = sys.argv[1], sys.argv[2:]
stride, seeds = int(os.environ.get("STRIDE", "16")), int(os.environ.get("SEEDS", "1"))
engine = load_engine("smollm2", None, "cpu", None)
tok = engine.tokenizer
first: list = []


def log(tree, fed, target_probs, temperature, drawn=None):  # noqa: ARG001 - the engine's node_log hook
    if not first:
        first.append((tree, target_probs.detach().cpu()))


contexts = []
for i, prompt in enumerate(demo_prompts("smollm2")[: int(os.environ.get("PROMPTS", "12"))]):
    ids = tok.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=True)
    ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
    answer = engine.generate(ids, max_new_tokens=128, temperature=1.0, plan="autoregressive", seed=i).token_ids
    contexts += [ids + list(answer[:k]) for k in range(0, len(answer) - 8, stride)]
engine.node_log = log
values: dict[str, list[float]] = {p: [] for p in plans}
for n, ctx in enumerate(contexts):
    for plan in plans:
        for s in range(seeds):
            first.clear()
            engine.generate(ctx, max_new_tokens=8, temperature=1.0, plan=plan, seed=1000 * n + s)
            tree, rows = first[0]
            values[plan].append(expected_block_efficiency("traversal", tree, rows)[0])
    if n % 10 == 0:
        print(n, len(contexts), {p: round(sum(v) / len(v), 4) for p, v in values.items()}, flush=True)
base = plans[0]
res = {"contexts": len(contexts), "seeds": seeds, "stride": stride, "plans": {}}
for p in plans:
    v, d = values[p], [a - b for a, b in zip(values[p], values[base], strict=True)]
    mean_d = sum(d) / len(d)
    sd = math.sqrt(sum((x - mean_d) ** 2 for x in d) / max(len(d) - 1, 1))
    res["plans"][p] = {
        "expected_be": round(sum(v) / len(v), 4),
        f"minus_{base}": round(mean_d, 4),
        "standard_error": round(sd / math.sqrt(len(d)), 4),
    }
print(json.dumps(res, indent=2))
with open(out, "w") as f:
    json.dump(res, f, indent=2)
