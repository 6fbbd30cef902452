"""``adaptive-spec profile``: measure a draft/target pair's latency profile on this device.

Three measurements, all through the engine's own code paths, saved as one JSON profile that
:class:`adaptive_spec.planner.latency.LatencyModel` reads:

1. **Forwards.** For each context length ``c`` and block size ``t`` of the grid: one
   ``ModelRunner.block_forward`` of ``t`` tokens under a tree (here causal) mask over a KV
   cache prefilled to ``c`` rows, rolled back after each call. Draft and target calls
   alternate (warm-up calls first, then ``repeats`` timed pairs), so that changes in machine
   load hit both alike; the profile keeps medians and quartiles in milliseconds.
2. **Verifiers.** Each registered lossless verifier (``greedy`` included, for temperature 0),
   on every drafting law it accepts, on synthetic trees of several sizes at the models'
   vocabulary size (target logits ~ N(0, 3^2), draft logits = target + N(0, 1)): median
   milliseconds per ``verify`` call against the tree's node count.
3. **Bookkeeping.** The engine generates from a few prompts with a few calibration plans;
   for every step, the measured time (the sum of ``StepResult.times``) minus the predicted
   forwards and verifier is fitted by non-negative least squares as ``const_ms +
   per_level_ms * depth + per_node_ms * nodes + first_step_ms * [first step]``: the
   per-level term is the draft's sampling and host sync after each forward, the per-node
   term turning logits into probabilities and the tree masks, the first-step term the slower
   first target block after a prefill.

``adaptive-spec bench latency-model`` then checks the predictions against other plans' steps.

Modules: :mod:`.measure` (the measurements and the whole profile), :mod:`.fit` (the bookkeeping
fit), :mod:`.cache` (a pair's profile cached in the user data folder), :mod:`.report` (plot and
summary).
"""

from adaptive_spec.bench.profile.cache import cached_profile_path, latency_for_selector
from adaptive_spec.bench.profile.fit import fit_overhead
from adaptive_spec.bench.profile.measure import (
    CALIBRATION_PLANS,
    DEFAULT_CONTEXTS,
    DEFAULT_TOKENS,
    VERIFY_SHAPES,
    RecordingPlanner,
    device_info,
    measure_forwards,
    measure_profile,
    measure_steps,
    measure_verifiers,
    model_info,
)
from adaptive_spec.bench.profile.report import plot_profile, print_summary

__all__ = [
    "CALIBRATION_PLANS",
    "DEFAULT_CONTEXTS",
    "DEFAULT_TOKENS",
    "VERIFY_SHAPES",
    "RecordingPlanner",
    "cached_profile_path",
    "device_info",
    "fit_overhead",
    "latency_for_selector",
    "measure_forwards",
    "measure_profile",
    "measure_steps",
    "measure_verifiers",
    "model_info",
    "plot_profile",
    "print_summary",
]
