"""Fitting a profile's bookkeeping term: the measured step time minus the predicted forwards and verifier.

Non-negative least squares, robust to outliers: ``const_ms + per_level_ms * depth + per_node_ms *
nodes + first_step_ms * [first step]``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def _robust_nnls(A: Any, b: Any) -> tuple[Any, Any]:
    """NNLS, then once more without the points whose residual is > 4 MADs from the median; (coef, kept)."""
    import numpy as np
    from scipy.optimize import nnls

    coef, _ = nnls(A, b)
    resid = b - A @ coef
    dev = np.abs(resid - np.median(resid))
    mad = float(np.median(dev)) or 1e-9
    keep = dev <= 4 * 1.4826 * mad
    if keep.sum() >= A.shape[1] and not keep.all():
        coef, _ = nnls(A[keep], b[keep])
    else:
        keep = np.ones(len(b), dtype=bool)
    return coef, keep


def fit_overhead(profile: dict[str, Any], steps: Sequence[dict[str, Any]], temperature: float) -> dict[str, Any]:
    """Fit the steps' time beyond the predicted forwards and verifier (see the module docstring).

    Model: ``const_ms + per_level_ms * depth + per_node_ms * nodes + first_step_ms * [step == 0]``,
    fitted phase by phase with non-negative least squares, so that the noisy target phase does
    not blur the draft's per-level cost: the draft phase's excess over the predicted draft
    forwards on ``(1, depth)``; the target phase's excess over the predicted target forward on
    ``(1, nodes, first step)`` (the first step of a generation runs the first target block after
    the prefill, which is slower); ``verify + other`` beyond the predicted verifier on
    ``(1, nodes)``. Each fit drops, once, the steps more than 4 median absolute deviations from
    the median residual (load spikes on a shared machine). The coefficients add up.
    """
    import numpy as np

    from adaptive_spec.planner.actions import plan_structure
    from adaptive_spec.planner.latency import LatencyModel

    if not steps:
        raise ValueError("fit_overhead needs at least one measured step")
    base = LatencyModel({**profile, "overhead": {}})
    feats, excess = [], {"draft": [], "target": [], "rest": []}
    for row in steps:
        s = plan_structure(row["plan"])
        pred = base.predict(row["plan"], row["context_length"], temperature=temperature)
        t = row["times"]
        feats.append((s.depth, s.num_nodes, float(row["step"] == 0)))
        excess["draft"].append(1e3 * (t.get("draft", 0.0) - pred.draft_s))
        excess["target"].append(1e3 * (t.get("target", 0.0) - pred.target_s))
        excess["rest"].append(1e3 * (t.get("verify", 0.0) + t.get("other", 0.0) - pred.verify_s))
    F = np.asarray(feats)  # [steps, 3]: depth, nodes, first step
    one = np.ones(len(F))
    designs = {
        "draft": np.stack([one, F[:, 0]], 1),  # const, per level
        "target": np.stack([one, F[:, 1], F[:, 2]], 1),  # const, per node, first step
        "rest": np.stack([one, F[:, 1]], 1),  # const, per node
    }
    fits, total_resid, kept = {}, 0.0, np.ones(len(F), dtype=bool)
    for phase, A in designs.items():
        b = np.asarray(excess[phase])
        coef, keep = _robust_nnls(A, b)
        fits[phase] = coef
        total_resid = total_resid + (b - A @ coef)
        kept &= keep
    per_phase = {
        "draft": {"const_ms": float(fits["draft"][0]), "per_level_ms": float(fits["draft"][1])},
        "target": {
            "const_ms": float(fits["target"][0]),
            "per_node_ms": float(fits["target"][1]),
            "first_step_ms": float(fits["target"][2]),
        },
        "verify_other": {"const_ms": float(fits["rest"][0]), "per_node_ms": float(fits["rest"][1])},
    }
    return {
        "model": "const_ms + per_level_ms * depth + per_node_ms * nodes + first_step_ms * [step == 0] (NNLS per phase)",
        "const_ms": float(fits["draft"][0] + fits["target"][0] + fits["rest"][0]),
        "per_level_ms": float(fits["draft"][1]),
        "per_node_ms": float(fits["target"][1] + fits["rest"][1]),
        "first_step_ms": float(fits["target"][2]),
        "per_phase": per_phase,
        "residual_rms_ms": float(np.sqrt(np.mean(total_resid[kept] ** 2))),
        "steps": len(steps),
        "outliers": int((~kept).sum()),
        "plans": sorted({r["requested"] for r in steps}),
        "temperature": temperature,
    }
