"""Showing a latency profile: its plot and a printed summary."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def plot_profile(profile: dict[str, Any], path: str | Path) -> Path:
    """Three panels: draft and target forward latency against tokens (one line per context), verifiers."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    tokens = profile["tokens"]
    for ax, name in zip(axes[:2], ("draft", "target"), strict=True):
        q1, q3 = profile.get(f"{name}_q1_ms"), profile.get(f"{name}_q3_ms")
        for ci, (ctx, row) in enumerate(zip(profile["contexts"], profile[f"{name}_ms"], strict=True)):
            line = ax.plot(tokens, row, marker="o", ms=3, label=f"context {ctx}")[0]
            if q1 and q3:  # interquartile band
                ax.fill_between(tokens, q1[ci], q3[ci], color=line.get_color(), alpha=0.15, lw=0)
        model = profile.get("models", {}).get(name, {})
        ax.set_title(f"{name} forward ({model.get('parameters', 0) / 1e6:.1f}M params)")
        ax.set_xlabel("tokens per forward")
        ax.set_ylabel("median ms")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    ax = axes[2]
    for name, laws in sorted(profile.get("verify_ms", {}).items()):
        law = next((x for x in ("iid", "chain") if x in laws), next(iter(laws)))
        ax.plot(laws[law]["nodes"], laws[law]["ms"], marker="o", ms=3, label=f"{name} ({law})")
    ax.set_title(f"verifiers (V = {profile.get('vocab_size', '?')})")
    ax.set_xlabel("tree nodes")
    ax.set_ylabel("median ms per verify")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    dev = profile.get("device", {})
    fig.suptitle(
        f"latency profile: {dev.get('name', '?')} ({dev.get('type', '?')}, {dev.get('torch_threads', '?')} threads), "
        f"{profile.get('dtype', '?')}, {profile.get('created', '')}",
        fontsize=10,
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def print_summary(profile: dict[str, Any]) -> None:
    """A few lines: one-token and largest forwards at the smallest and largest context; the fit."""
    dev = profile["device"]
    print(f"device {dev['name']} ({dev['type']}, {dev['torch_threads']} threads), dtype {profile['dtype']}")
    t_lo, t_hi = profile["tokens"][0], profile["tokens"][-1]
    names = [n for n in ("draft", "target", "target_row_major", "target_column_major") if profile.get(f"{n}_ms")]
    width = max(len(n) for n in names)
    for name in names:
        grid = profile[f"{name}_ms"]
        for ci in sorted({0, len(profile["contexts"]) - 1}):
            print(
                f"  {name:<{width}} context {profile['contexts'][ci]:>5}: {grid[ci][0]:8.3f} ms at {t_lo} tokens, "
                f"{grid[ci][-1]:8.3f} ms at {t_hi}"
            )
    if profile.get("weight_order"):
        _print_weight_order(profile["weight_order"])
    ovh = profile.get("overhead") or {}
    if ovh:
        print(
            f"  bookkeeping: {ovh['const_ms']:.3f} ms + {ovh['per_level_ms']:.3f} ms/level + "
            f"{ovh['per_node_ms']:.4f} ms/node, +{ovh['first_step_ms']:.2f} ms on a first step "
            f"(rms residual {ovh['residual_rms_ms']:.2f} ms over {ovh['steps']} steps)"
        )


def _print_weight_order(report: dict[str, Any]) -> None:
    """The engine target's weight order on this host (:func:`.measure.weight_order_report`)."""
    counts = report["target"]
    print(
        f"  weight order ({report['variable']}={report['setting']}): the engine's target has {counts['column']} "
        f"weights column-major, {counts['per-size']} per forward size, {counts['row']} in the stock order"
    )
    for shape in report["shapes"]:
        wins = {
            w: [str(n) for n, x in zip(shape["sizes"], shape["wins"], strict=True) if x == w]
            for w in ("column", "packed", "row")
        }
        ratio = " ".join(
            f"{n}:{c / r:.2f}" for n, r, c in zip(shape["sizes"], shape["row_ms"], shape["column_ms"], strict=True)
        )
        packed = shape.get("packed_ms")
        packed_ratio = (
            " ".join(f"{n}:{q / r:.2f}" for n, r, q in zip(shape["sizes"], shape["row_ms"], packed, strict=True))
            if packed
            else "not measured"
        )
        print(
            f"    {shape['shape']}: {shape['order']} (column-major wins at {','.join(wins['column']) or 'no'} rows, "
            f"packed at {','.join(wins['packed']) or 'no'}, the stock order at {','.join(wins['row']) or 'no'}; "
            f"column/stock time {ratio}; packed/stock {packed_ratio})"
        )
