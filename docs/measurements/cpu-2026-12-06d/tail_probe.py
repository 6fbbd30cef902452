"""Host time a step from the verifier's return (its host read is its last work) to the next step's first launch (the draft's replay, or the target's
pass for plain decoding and lookup): the other window in which a GPU stands idle, on this CPU through the stand-in
graphs (`bench overhead --stand-in-graphs`, SmolLM2 and its head), timed by patches, with cProfile's view of it.
Run from the repository root, alone on the machine:

    python docs/measurements/cpu-2026-12-06d/tail_probe.py PLAN PROMPTS TOKENS

prints one JSON line: the median and mean ms from the step's last host read to the next draft replay or target
forward, and the steps seen.
"""

import json
import statistics
import sys
import time

import adaptive_spec.engine.runner as runner
import adaptive_spec.engine.step as step
from adaptive_spec.cli import main

plan, prompts, tokens = sys.argv[1], sys.argv[2], sys.argv[3]
mark: dict[str, float | None] = {"read": None}
gaps: list[float] = []


def launched() -> None:
    if mark["read"] is not None:
        gaps.append(time.perf_counter() - mark["read"])
        mark["read"] = None


real_verify = step.StepMixin._verify


def verify(self, *args, **kwargs):  # its one host read is its last work
    out = real_verify(self, *args, **kwargs)
    mark["read"] = time.perf_counter()
    return out


step.StepMixin._verify = verify
for name in ("captured_draft", "block_forward", "chain_forward"):
    real = getattr(runner.ModelRunner, name)

    def patched(self, *args, _real=real, **kwargs):
        launched()
        return _real(self, *args, **kwargs)

    setattr(runner.ModelRunner, name, patched)


real_ar = step.StepMixin._autoregressive_step


def autoregressive_step(self, run):  # its one read is a tolist inside: the step's end stands for it
    out = real_ar(self, run)
    mark["read"] = time.perf_counter()
    return out


step.StepMixin._autoregressive_step = autoregressive_step
args = ["bench", "overhead", "--target", "smollm2", "--plans", plan, "--limit", prompts, "--max-new-tokens", tokens]
try:
    main([*args, "--stand-in-graphs"])
except SystemExit:
    pass
ms = [1e3 * g for g in gaps]
print(
    json.dumps(
        {
            "plan": plan,
            "read_to_next_launch_ms_median": round(statistics.median(ms), 3),
            "read_to_next_launch_ms_mean": round(statistics.mean(ms), 3),
            "steps": len(ms),
        }
    )
)
