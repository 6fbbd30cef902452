"""Study reports: a JSON summary and PNG plots (Optuna's matplotlib visualisations, Agg backend)."""

from __future__ import annotations

import re
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import optuna

__all__ = ["plot_comparison", "plot_study", "study_summary", "write_summary"]


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name)


def study_summary(study: optuna.Study, top: int = 10) -> dict[str, Any]:
    """Counts per state, the best trial and the ``top`` trials (value, plan, parameters, user attributes)."""
    from optuna.trial import TrialState

    trials = study.get_trials(deepcopy=False)
    complete = sorted((t for t in trials if t.state == TrialState.COMPLETE), key=lambda t: t.value, reverse=True)

    def row(t: optuna.trial.FrozenTrial) -> dict[str, Any]:
        return {
            "number": t.number,
            "value": t.value,
            "plan": t.user_attrs.get("plan"),
            "params": t.params,
            "user_attrs": t.user_attrs,
        }

    return {
        "study": study.study_name,
        "n_trials": len(trials),
        "states": {s.name: sum(t.state == s for t in trials) for s in TrialState if any(t.state == s for t in trials)},
        "best": row(complete[0]) if complete else None,
        "top": [row(t) for t in complete[:top]],
    }


def plot_study(
    study: optuna.Study, out_dir: str | Path, prefix: str = "", groups: dict[str, list[str]] | None = None
) -> dict[str, str]:
    """Render Optuna's plots of ``study`` to PNG files in ``out_dir``.

    Always the optimization history (and the intermediate values, when trials report them)
    and the parameter importances over the parameters every trial has. Then, for a conditional
    space, slice, parallel-coordinate and importance plots per group of parameters (e.g. one
    group per plan family), each over the complete trials that have the group's parameters.
    Without ``groups`` there is one group: all parameters.

    Returns:
        ``{plot name: file name}`` for the plots drawn, and ``{plot name: "skipped: reason"}`` for
        those that could not be drawn (e.g. importances before two distinct values).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import optuna
    from optuna.visualization import matplotlib as ovm

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    complete = [t for t in study.get_trials(deepcopy=False) if t.state == optuna.trial.TrialState.COMPLETE]
    if groups is None:
        groups = {"": sorted({p for t in complete for p in t.params})}
    jobs: list[tuple[str, str, dict[str, Any]]] = [("optimization_history", "optimization_history", {})]
    if any(t.intermediate_values for t in study.get_trials(deepcopy=False)):  # learning curves (pruned ones too)
        jobs.append(("intermediate_values", "intermediate_values", {}))
    common = sorted(set.intersection(*(set(t.params) for t in complete))) if complete else []
    jobs.append(("param_importances", "param_importances", {"params": common}))
    for group, params in groups.items():
        have = [t for t in complete if all(p in t.params for p in params[:1])]
        params = [p for p in params if have and all(p in t.params for t in have)]
        tag = f"{_safe(group)}_" if group else ""
        jobs.append((f"{tag}slice", "slice", {"params": params, "_trials": have}))
        if len(params) >= 2:  # one axis is what the slice plot already shows
            jobs.append((f"{tag}parallel_coordinate", "parallel_coordinate", {"params": params, "_trials": have}))
        if group and len(params) >= 2 and len(have) >= 4:  # importances from fewer trials say nothing
            jobs.append((f"{tag}param_importances", "param_importances", {"params": params, "_trials": have}))
    drawn: dict[str, str] = {}
    verbosity = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    try:
        for name, kind, kw in jobs:
            trials = kw.pop("_trials", complete)
            if kind not in ("optimization_history", "intermediate_values") and not kw.get("params"):
                drawn[name] = "skipped: no parameters in common"
                continue
            if kind not in ("optimization_history", "intermediate_values") and len({t.value for t in trials}) < 2:
                drawn[name] = "skipped: needs two complete trials with different values"
                continue
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    ax = getattr(ovm, f"plot_{kind}")(study, **kw)
            except (ValueError, RuntimeError, TypeError, ZeroDivisionError, IndexError) as err:
                drawn[name] = f"skipped: {type(err).__name__}: {err}"
                plt.close("all")
                continue
            fig = (ax.flat[0] if hasattr(ax, "flat") else ax).figure
            w, h = fig.get_size_inches()
            fig.set_size_inches(max(w, 8), max(h, 5))
            file = f"{prefix}{name}.png"
            fig.savefig(out_dir / file, dpi=90, bbox_inches="tight")
            plt.close(fig)
            drawn[name] = file
    finally:
        optuna.logging.set_verbosity(verbosity)
    return drawn


def plot_comparison(rows: list[dict[str, Any]], title: str, path: str | Path, highlight: str | None = None) -> Path:
    """Bar chart of tokens/s per method (``rows``: ``{"plan", "tokens_per_s"}``), fastest on top.

    The autoregressive baseline is grey and ``highlight`` (the tuned plan) orange.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = sorted(rows, key=lambda r: r["tokens_per_s"], reverse=True)
    fig, ax = plt.subplots(figsize=(8, 0.5 + 0.45 * len(rows)))
    names = [r["plan"] for r in rows]
    values = [r["tokens_per_s"] for r in rows]
    colors = ["tab:gray" if n == "autoregressive" else "tab:orange" if n == highlight else "tab:blue" for n in names]
    ax.barh(names[::-1], values[::-1], color=colors[::-1])
    for y, v in enumerate(values[::-1]):
        ax.text(v, y, f" {v:.1f}", va="center", fontsize=8)
    ax.set_xlabel("tokens/s (median over repeats)")
    ax.set_title(title)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_summary(summary: dict[str, Any], out_dir: str | Path) -> Path:
    """Write ``summary.json`` in ``out_dir`` (atomically)."""
    from adaptive_spec.files import write_json_atomic

    return write_json_atomic(summary, Path(out_dir) / "summary.json")
