"""A synthetic latency profile: bilinear forward times, so interpolation must reproduce them exactly."""

from __future__ import annotations

from adaptive_spec.planner.latency import PROFILE_FORMAT, PROFILE_VERSION

CONTEXTS = [0, 100, 300]
TOKENS = [1, 2, 8, 32]


def draft_f(c: float, t: float) -> float:  # bilinear: interpolation must reproduce it exactly
    return 0.5 + 0.001 * c + 0.1 * t + 0.0001 * c * t


def target_f(c: float, t: float) -> float:
    return 5.0 + 0.01 * c + 0.5 * t + 0.001 * c * t


def synthetic_profile() -> dict:
    return {
        "format": PROFILE_FORMAT,
        "version": PROFILE_VERSION,
        "device": {"type": "cpu", "name": "test"},
        "contexts": CONTEXTS,
        "tokens": TOKENS,
        "draft_ms": [[draft_f(c, t) for t in TOKENS] for c in CONTEXTS],
        "target_ms": [[target_f(c, t) for t in TOKENS] for c in CONTEXTS],
        "verify_ms": {
            "traversal": {"iid": {"nodes": [3, 33], "ms": [0.3, 3.3]}, "chain": {"nodes": [2, 10], "ms": [0.2, 1.0]}},
            "greedy": {"iid": {"nodes": [3, 33], "ms": [0.01, 0.01]}},
        },
        "overhead": {"const_ms": 1.0, "per_level_ms": 0.25, "per_node_ms": 0.01, "first_step_ms": 7.0},
    }
