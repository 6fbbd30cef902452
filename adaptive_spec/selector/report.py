"""The selector training report: ``report.json``, ``report.md`` and ``report.png`` in one folder."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from adaptive_spec.files import atomic_write, write_json_atomic

ORDER = ("adaptive", "neural", "hgb", "logistic", "best_static", "oracle")


def write_report(report: dict[str, Any], out_dir: str | Path) -> dict[str, str]:
    """Write ``report`` (from :func:`adaptive_spec.selector.train.build_report`) as JSON, Markdown and PNG.

    Returns:
        The written paths: ``{"json", "markdown", "plot"}``.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    files = {k: str(out_dir / f"report.{ext}") for k, ext in (("json", "json"), ("markdown", "md"), ("plot", "png"))}
    write_json_atomic({**report, "files": files}, files["json"])
    atomic_write(files["markdown"], _markdown(report))
    _plot(report, Path(files["plot"]))
    return files


def _ordered(scores: dict[str, dict[str, float]]) -> list[str]:
    return [k for k in ORDER if k in scores] + [k for k in scores if k not in ORDER]


def _markdown(report: dict[str, Any]) -> str:
    scores, split = report["scores"], report["split"]
    lines = [
        "# Selector training report",
        "",
        f"Labels: `{report.get('labels')}`; validation on {split['val_prompts']} held-out prompts "
        f"({split['val_rows']} contexts), training on {split['train_prompts']} prompts "
        f"({split['train_rows']} contexts).",
        f"Checkpoint: `{report.get('checkpoint')}`; hidden states used: {report.get('use_hidden')}.",
        _trainer_line(report.get("trainer") or {}),
        "",
        "Tokens/s relative to the best static action of each sampling setting (chosen on the train split):",
        "`agg_rel_tps` is the ratio of the split's total tokens to its total time (what a benchmark measures),",
        "`rel_tps` the mean over contexts of tps[choice] / tps[static], `accuracy` how often the choice is the",
        "per-context best action (largest net value). `adaptive` is the network with the static fallback per",
        "sampling setting below; `oracle` maximises each setting's aggregate on these very contexts.",
        "",
        "| selector | agg_rel_tps | rel_tps | accuracy |",
        "|---|---:|---:|---:|",
    ]
    for name in _ordered(scores):
        s = scores[name]
        lines.append(f"| {name} | {s['agg_rel_tps']:.4f} | {s['rel_tps']:.4f} | {s['accuracy']:.3f} |")
    groups = report.get("groups") or {}
    if groups:
        static = report.get("static_groups") or {}
        lines += [
            "",
            f"Per sampling setting (network vs best static). The selector plays the network where the "
            f"{report.get('gain_quantile', 0.1):g} quantile of its agg_rel_tps over bootstrap resamples of the "
            f"validation prompts (`q`) is at least 1 + {report.get('min_gain', 0):g}, else the static action.",
            "",
            "`R²`: cross-validated (by prompt, train split) R² of the best static action's E[τ+1] from the",
            "features; near 0, the features cannot tell good contexts from bad ones.",
            "",
            "| setting | rows | best static | network agg_rel_tps | q | oracle agg_rel_tps | R² | selector plays |",
            "|---|---:|---|---:|---:|---:|---:|---|",
        ]
        for g, sc in groups.items():
            play = f"static `{static[g]}`" if g in static else "the network"
            lines.append(
                f"| {g} | {sc['rows']} | `{report['best_static'].get(g)}` | {sc['agg_rel_tps']:.4f} | "
                f"{sc.get('agg_rel_tps_quantile', float('nan')):.4f} | "
                f"{sc.get('oracle_agg_rel_tps', float('nan')):.4f} | "
                f"{sc.get('static_be_r2', float('nan')):.2f} | {play} |"
            )
    else:
        lines += ["", "Best static action per sampling setting:", ""]
        lines += [f"- `{g}`: `{a}`" for g, a in report["best_static"].items()]
    share = {a: s for a, s in report.get("neural_action_share", {}).items() if s > 0}
    if share:
        lines += ["", "Neural selector's choices on the validation contexts:", ""]
        lines += [f"- `{a}`: {s:.1%}" for a, s in sorted(share.items(), key=lambda kv: -kv[1])]
    lines += ["", "![report](report.png)", ""]
    return "\n".join(lines)


def _trainer_line(info: dict[str, Any]) -> str:
    if not info:
        return ""
    return (
        f"Trained {info.get('epochs')} epochs ({info.get('global_step')} optimizer steps) on "
        f"{info.get('world_size')} process(es), {info.get('strategy')}."
    )


def _plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    scores, history = report["scores"], report.get("history", [])
    fig, (ax0, ax1) = plt.subplots(1, 2, figsize=(11, 4))
    names = _ordered(scores)
    values = [scores[n]["agg_rel_tps"] for n in names]
    kind = {"adaptive": "tab:green", "neural": "tab:blue", "best_static": "tab:gray", "oracle": "tab:gray"}
    colors = [kind.get(n, "tab:orange") for n in names]
    bars = ax0.bar(names, values, color=colors)
    ax0.bar_label(bars, fmt="%.3f")
    ax0.axhline(1.0, color="black", lw=0.8, ls="--")
    lo = min(values)
    ax0.set_ylim(min(0.9, lo - 0.02), max(values) * 1.03)
    ax0.set_ylabel("tokens/s relative to best static (val, ratio of sums)")
    ax0.set_title("Selectors on held-out prompts")
    epochs = [h["epoch"] for h in history]
    for key, style in (("val/agg_rel_tps", "-o"), ("val/rel_tps", "-"), ("val/oracle_rel_tps", "--")):
        pts = [(e, h[key]) for e, h in zip(epochs, history, strict=True) if key in h]
        if pts:
            ax1.plot(*zip(*pts, strict=True), style, label=key, ms=3)
    ax1.set_xlabel("epoch")
    ax1.set_ylabel("relative tokens/s")
    ax2 = ax1.twinx()
    for key, color in (("train/loss", "tab:red"), ("val/loss", "tab:purple")):
        pts = [(e, h[key]) for e, h in zip(epochs, history, strict=True) if key in h]
        if pts:
            ax2.plot(*zip(*pts, strict=True), color=color, alpha=0.6, label=key)
    ax2.set_ylabel("loss")
    handles = ax1.get_legend_handles_labels()[0] + ax2.get_legend_handles_labels()[0]
    if handles:
        ax1.legend(handles=handles, fontsize=8, loc="lower right")
    ax1.set_title("Training curves")
    fig.tight_layout()
    try:
        atomic_write(path, lambda f: fig.savefig(f, format="png", dpi=110))
    finally:
        plt.close(fig)
