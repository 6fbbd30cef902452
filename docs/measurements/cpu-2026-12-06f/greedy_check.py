"""Greedy tokens of three speculative plans against plain decoding, SmolLM2 with this host's weight forms (packed
from 2 rows up), the 12 demo prompts x 64 tokens. From the repository root: python docs/measurements/cpu-2026-12-06f/greedy_check.py"""
import json
from adaptive_spec.engine import SpecEngine
eng = SpecEngine.from_pretrained("smollm2")
prompts = [json.loads(l) for l in open("adaptive_spec/zoo/smollm2/prompts.jsonl")]
same = {p: 0 for p in ("lookup:8+m3x3/nss", "chain:3/block", "lookup:3x8/nss")}
for i, pr in enumerate(prompts):
    kw = {"messages": pr["messages"]} if "messages" in pr else {"prompt": pr["prompt"]}
    ref = eng.generate(**kw, max_new_tokens=64, temperature=0.0, plan="autoregressive").token_ids
    for plan in same:
        out = eng.generate(**kw, max_new_tokens=64, temperature=0.0, plan=plan).token_ids
        same[plan] += out == ref
        if out != ref:
            k = next((j for j, (a, b) in enumerate(zip(out, ref)) if a != b), None)
            print("prompt", i, plan, "differs at", k)
print({p: f"{n}/{len(prompts)}" for p, n in same.items()})
