"""``adaptive-spec bench latency-model``: how well the latency model predicts real engine steps.

Runs the engine with several static plans (chains, i.i.d., delayed and without-replacement
trees of different sizes, none of them the profile's calibration plans) on built-in prompts,
and compares each step's measured time (the sum of ``StepResult.times``) with
:meth:`LatencyModel.predict` for the plan the step ran and its context length. Reports the mean
absolute percentage error (MAPE) per step, per plan and overall, the signed bias, and the
error of each plan's *mean* step time and the rank correlation of the plans' mean step
times (what a planner ranking plans by speed relies on).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

CHECK_PLANS = (
    "chain:2/token,chain:6/block,iid:2x4/specinfer,iid:3x6/traversal,delayed:2x2x4/gbv,delayed:4x4x4/traversal,"
    "wor:2x2x1/traversal,wor:3x2x2/rrsw"
)


def compare(model: Any, steps: Sequence[dict[str, Any]], temperature: float) -> dict[str, Any]:
    """Per-step predictions and error summaries (per plan and overall) for rows of ``measure_steps``."""
    from adaptive_spec.planner.actions import plan_structure

    rows = []
    for r in steps:
        pred = model.predict(r["plan"], r["context_length"], temperature=temperature, first_step=r["step"] == 0)
        rows.append({**r, "predicted_s": pred.total_s, "predicted": pred.as_dict()})

    def summary(group: list[dict[str, Any]]) -> dict[str, Any]:
        ape = [abs(g["predicted_s"] - g["measured_s"]) / g["measured_s"] for g in group]
        signed = [(g["predicted_s"] - g["measured_s"]) / g["measured_s"] for g in group]
        mean_meas = statistics.fmean(g["measured_s"] for g in group)
        mean_pred = statistics.fmean(g["predicted_s"] for g in group)
        return {
            "steps": len(group),
            "measured_ms": 1e3 * mean_meas,
            "predicted_ms": 1e3 * mean_pred,
            "mape": statistics.fmean(ape),
            "median_ape": statistics.median(ape),
            "bias": statistics.fmean(signed),
            "mean_step_ape": abs(mean_pred - mean_meas) / mean_meas,
            "mean_nodes": statistics.fmean(g["num_nodes"] for g in group),
            "max_nodes": plan_structure(group[0]["requested"]).num_nodes,
            "measured_phase_ms": {
                k: 1e3 * statistics.fmean(g["times"].get(k, 0.0) for g in group) for k in group[0]["times"]
            },
            "predicted_phase_ms": {
                k: 1e3 * statistics.fmean(g["predicted"][f"{k}_s"] for g in group)
                for k in ("draft", "target", "verify", "overhead")
            },
        }

    plans = list(dict.fromkeys(r["requested"] for r in rows))
    per_plan = {p: summary([r for r in rows if r["requested"] == p]) for p in plans}
    overall = summary(rows)
    overall.pop("max_nodes")
    overall["plan_mean_step_mape"] = statistics.fmean(v["mean_step_ape"] for v in per_plan.values())
    overall["plan_rank_spearman"] = _spearman(
        [v["measured_ms"] for v in per_plan.values()], [v["predicted_ms"] for v in per_plan.values()]
    )
    return {"per_plan": per_plan, "overall": overall, "steps": rows}


def _spearman(xs: list[float], ys: list[float]) -> float | None:
    """Spearman rank correlation (None for fewer than 3 points or constant ranks)."""
    if len(xs) < 3:
        return None
    from scipy.stats import spearmanr

    rho = float(spearmanr(xs, ys).statistic)
    return None if rho != rho else rho  # NaN for constant input


def plot_comparison(report: dict[str, Any], path: str | Path) -> Path:
    """Scatter of predicted against measured step time, one colour per plan, with the y = x line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    fig, ax = plt.subplots(figsize=(6.5, 5.5))
    hi = 0.0
    for plan, s in report["per_plan"].items():
        pts = [(1e3 * r["measured_s"], 1e3 * r["predicted_s"]) for r in report["steps"] if r["requested"] == plan]
        xs, ys = zip(*pts, strict=True)
        ax.scatter(xs, ys, s=8, alpha=0.5, label=f"{plan} (MAPE {100 * s['mape']:.0f}%)")
        hi = max(hi, *xs, *ys)
    ax.plot([0, hi], [0, hi], color="black", lw=1, ls="--")
    ax.set_xlim(0, hi * 1.05)
    ax.set_ylim(0, hi * 1.05)
    ax.set_xlabel("measured step time (ms)")
    ax.set_ylabel("predicted step time (ms)")
    ax.set_title(f"latency model: step MAPE {100 * report['overall']['mape']:.1f}%")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
