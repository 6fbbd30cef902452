"""Host time a step in the two windows where a GPU would stand idle, on this CPU through the stand-in graphs
(`bench overhead --stand-in-graphs` with SmolLM2 and its head, timed by patches). Run from the repository root, alone
on the machine:

    [ADAPTIVE_SPEC_EARLY_PASS=0] python docs/measurements/cpu-2026-12-06d/window_probe.py gap PLAN PROMPTS TOKENS
    python docs/measurements/cpu-2026-12-06d/window_probe.py tail PLAN PROMPTS TOKENS

``gap``: ms from a captured draft replay's return to the target's ``block_forward`` call, and ms of
``drafting.eagle_outcome`` (the tree's read and the host's work on it). ``tail``: ms from the verifier's return (its
host read is its last work; for plain decoding the step's end) to the next step's first draft replay or target
forward. Prints one JSON line with the medians, means and the steps seen.
"""

import json
import os
import statistics
import sys
import time

import adaptive_spec.engine.drafting as drafting
import adaptive_spec.engine.runner as runner
import adaptive_spec.engine.step as step
from adaptive_spec.cli import main
from adaptive_spec.engine.eagle import EagleRunner

mode, plan, prompts, tokens = sys.argv[1:5]
mark: dict[str, float | None] = {"t": None}
gaps: list[float] = []
outcomes: list[float] = []


def wrap(owner, name, before=None, after=None):
    real = getattr(owner, name)

    def patched(*args, **kwargs):
        if before is not None:
            before(*args)
        t = time.perf_counter()
        try:
            return real(*args, **kwargs)
        finally:
            if after is not None:
                after(t)

    setattr(owner, name, patched)


def start(_t=None) -> None:
    mark["t"] = time.perf_counter()


def stop(*_args) -> None:
    if mark["t"] is not None:
        gaps.append(time.perf_counter() - mark["t"])
        mark["t"] = None


if mode == "gap":
    wrap(runner.ModelRunner, "captured_draft", after=start)
    wrap(runner.ModelRunner, "block_forward", before=lambda self, *a: None if isinstance(self, EagleRunner) else stop())
    wrap(drafting, "eagle_outcome", after=lambda t: outcomes.append(time.perf_counter() - t))
elif mode == "tail":
    wrap(step.StepMixin, "_verify", after=start)
    wrap(step.StepMixin, "_autoregressive_step", after=start)
    for name in ("captured_draft", "block_forward", "chain_forward"):
        wrap(runner.ModelRunner, name, before=stop)
else:
    sys.exit(f"window_probe: mode {mode!r}: gap or tail")
args = ["bench", "overhead", "--target", "smollm2", "--plans", plan, "--limit", prompts, "--max-new-tokens", tokens]
try:
    main([*args, "--stand-in-graphs"])
except SystemExit:
    pass
ms = [1e3 * g for g in gaps]
row = {"mode": mode, "plan": plan, "early_pass": os.environ.get("ADAPTIVE_SPEC_EARLY_PASS", "1")}
row |= {"ms_median": round(statistics.median(ms), 3), "ms_mean": round(statistics.mean(ms), 3), "steps": len(ms)}
if outcomes:
    row["eagle_outcome_ms_median"] = round(1e3 * statistics.median(outcomes), 3)
print(json.dumps(row))
