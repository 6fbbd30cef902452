"""Host time a step between the captured EAGLE-style tree's replay and the target's pass (the window in which a GPU
would stand idle), on this CPU through the stand-in graphs: `bench overhead --stand-in-graphs` with SmolLM2 and its
head, timed by patches. Run from the repository root, alone on the machine:

    ADAPTIVE_SPEC_EARLY_PASS=0 python docs/measurements/cpu-2026-12-06d/gap_probe.py PLAN PROMPTS TOKENS

prints one JSON line: the median and mean ms from the draft replay's return to the target's block_forward call, the
median ms of eagle_outcome (the read and the host's work on the tree), and the steps seen.
"""

import json
import os
import statistics
import sys
import time

import adaptive_spec.engine.drafting as drafting
import adaptive_spec.engine.runner as runner
from adaptive_spec.cli import main
from adaptive_spec.engine.eagle import EagleRunner

plan, prompts, tokens = sys.argv[1], sys.argv[2], sys.argv[3]
mark: dict[str, float | None] = {"drafted": None}
gaps: list[float] = []
outcomes: list[float] = []
real_draft, real_block, real_outcome = (
    runner.ModelRunner.captured_draft,
    runner.ModelRunner.block_forward,
    drafting.eagle_outcome,
)


def captured_draft(self, *args, **kwargs):
    out = real_draft(self, *args, **kwargs)
    mark["drafted"] = time.perf_counter()
    return out


def block_forward(self, *args, **kwargs):
    if not isinstance(self, EagleRunner) and mark["drafted"] is not None:
        gaps.append(time.perf_counter() - mark["drafted"])
        mark["drafted"] = None
    return real_block(self, *args, **kwargs)


def eagle_outcome(*args, **kwargs):
    t = time.perf_counter()
    try:
        return real_outcome(*args, **kwargs)
    finally:
        outcomes.append(time.perf_counter() - t)


runner.ModelRunner.captured_draft = captured_draft
runner.ModelRunner.block_forward = block_forward
drafting.eagle_outcome = eagle_outcome
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
            "early_pass": os.environ.get("ADAPTIVE_SPEC_EARLY_PASS", "1"),
            "draft_to_pass_ms_median": round(statistics.median(ms), 3),
            "draft_to_pass_ms_mean": round(statistics.mean(ms), 3),
            "eagle_outcome_ms_median": round(1e3 * statistics.median(outcomes), 3),
            "steps": len(ms),
        }
    )
)
