"""In one process, interleaved: SmolLM2 `iid:3x4/specinfer` at T = 0 (4 demo prompts x 48 tokens) with this round's
changes on its path (new) against them undone by patches (old): the runners reading `model.device`/`dtype` each time,
`isfinite` checks, no slicing of cut shapes' tensors. Run from the repository root:
python docs/measurements/cpu-2026-11-27e/iidexp.py"""
import functools
import statistics as st

import torch

from adaptive_spec.engine import drafting, runner, step
from adaptive_spec.engine.load import load_engine
from adaptive_spec.files import read_prompts, render_prompt
from adaptive_spec.trees import slots

e = load_engine("smollm2", None, "cpu", None)
prompts = [render_prompt(e.tokenizer, p) for p in read_prompts("adaptive_spec/zoo/smollm2/prompts.jsonl", 4)]


def old_finite(logits, probs=None):
    total = logits.sum(dtype=torch.float32)
    if probs is not None:
        total = total + probs.sum(dtype=torch.float32)
    return torch.isfinite(total)


def old_rows_ok(probs):
    return torch.isfinite(probs.sum())


new = {
    "device": runner.ModelRunner.device,
    "dtype": runner.ModelRunner.dtype,
    "finite": drafting.finite_flag,
    "rows_ok": drafting.rows_ok,
    "layout": drafting.slot_layout,
}
old = {
    "device": property(lambda self: self.model.device),
    "dtype": property(lambda self: self.model.dtype),
    "finite": old_finite,
    "rows_ok": old_rows_ok,
    "layout": functools.lru_cache(maxsize=64)(slots.build_layout),
}


def use(v):
    runner.ModelRunner.device, runner.ModelRunner.dtype = v["device"], v["dtype"]
    drafting.finite_flag = step.finite_flag = v["finite"]
    drafting.rows_ok = step.rows_ok = v["rows_ok"]
    drafting.slot_layout = v["layout"]


res = {}
for _ in range(4):
    for name, v in (("old", old), ("new", new)):
        use(v)
        steps = secs = toks = 0
        for i, p in enumerate(prompts):
            r = e.generate(p, max_new_tokens=48, temperature=0.0, plan="iid:3x4/specinfer", seed=i)
            secs += r.stats.wall_time_s
            toks += r.stats.new_tokens
            steps += r.stats.steps
        res.setdefault(name, []).append(toks / secs)
        print(name, round(toks / secs, 2), "tok/s", steps, "steps", flush=True)
for k, v in res.items():
    print(k, " ".join(f"{x:.2f}" for x in v), "median", round(st.median(v), 2))
