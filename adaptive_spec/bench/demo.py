"""``adaptive-spec demo``: speculative decoding on the built-in pair, with a report.

Loads the default draft/target pair, runs the built-in held-out prompts in one interleaved
run over all temperatures (autoregressive decoding, the demo plans, transformers' assisted
generation), prints a table of tokens/s, speedup and block efficiency per plan and
temperature, and writes a report folder: ``summary.md``, ``results.json`` and three PNG plots
(speedup per plan, histogram of accepted lengths, block efficiency against tree size).

When a learned selector is installed (by ``make selector``, in the user data folder; else
shipped with the built-in pair; else ``data/selector/selector.onnx``), the demo adds the ``adaptive`` plan
(the selector choosing every step's plan) and ``best-static`` (the best single static plan on
the selector's training prompts); otherwise the summary says how to build one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

# Static plans shown by the demo, one per tree family; measured on the default pair
# (see README) until the tuned best-static plans of `adaptive-spec tune plans` replace them.
DEMO_PLANS = "in-draft,chain:2/block,chain:4/block"
# The real pair (SmolLM2 + its EAGLE-style head): its tuned in-draft planner and two static chains.
SMOLLM2_PLANS = "in-draft,chain:2/block,chain:4/block"


def text_report(tokenizer, prompts: list[str], outputs: dict) -> dict:
    """Per temperature: a sample completion, the loop figures, and at T=0 the identity check.

    At temperature 0 every lossless plan must reproduce autoregressive decoding token for
    token; ``identical[plan] = (prompts identical, prompts)``.
    """
    from adaptive_spec.bench.text_quality import quality_summary
    from adaptive_spec.files import render_prompt

    rendered = [render_prompt(tokenizer, p) for p in prompts]
    prompt_ids = [r if isinstance(r, list) else tokenizer(r)["input_ids"] for r in rendered]
    out = {}
    for temp, rows in outputs.items():
        ar = rows["autoregressive"]
        entry = {
            "prompt": str(prompts[0]),
            "sample": tokenizer.decode(ar[0], skip_special_tokens=True) if ar else "",
            "quality": quality_summary(tokenizer, prompt_ids, ar),
            "answers": [
                {"prompt": str(p), "answer": tokenizer.decode(a, skip_special_tokens=True)}
                for p, a in zip(prompts[:3], ar[:3], strict=False)
            ],
        }
        if float(temp) == 0:
            entry["identical"] = {
                name: (sum(a == b for a, b in zip(toks, ar, strict=True)), len(ar))
                for name, toks in rows.items()
                if name != "autoregressive"
            }
        out[temp] = entry
    return out


def summary_markdown(report: dict, plots: list[str]) -> str:
    """The report's Markdown summary: one table per temperature, then the plots."""
    lines = ["# adaptive-spec demo", ""]
    pair = report.get("pair", {})
    if pair:
        lines += [
            "Built-in pair: " + ", ".join(f"{k}={v}" for k, v in pair.items() if not isinstance(v, (dict, list)))[:600],
            "",
        ]
    cfg = report["config"]
    lines += [
        f"{cfg['num_prompts']} held-out prompts, {cfg['max_new_tokens']} new tokens each, device {cfg['device']}, "
        f"{cfg['threads']} threads. All methods and temperatures interleaved per prompt in one run.",
        "",
    ]
    if cfg.get("selector"):
        lines += [
            f"`adaptive`: the learned selector `{cfg['selector']}` picks every step's plan (latency features from "
            f"{cfg.get('latency_profile') or 'no profile: zeros'}).",
            "",
        ]
        if cfg.get("best_static"):
            lines += [f"`best-static`: {cfg['best_static']['source']}.", ""]
    lines += [*report.get("notes", []), ""] if report.get("notes") else []

    def f(x: float | None, spec: str = ".2f") -> str:
        return "-" if x is None else format(x, spec)

    for temp, res in report["runs"].items():
        text = report.get("text", {}).get(temp)
        lines += [f"## Temperature {temp}", ""]
        if text:
            q = text["quality"]
            lines += [
                "Sample completion (autoregressive decoding; the prompt, then the model's text):",
                "",
                "```python",
                text["prompt"] + text["sample"],
                "```",
                "",
                f"Generated tokens in whitespace-only lines: {100 * q['whitespace_share']:.1f}%; in repeated "
                f"{q['repeat_n']}-token n-grams: {100 * q['repeated_ngram_share']:.1f}%; either: "
                f"{100 * q['either_share']:.1f}% (autoregressive outputs).",
                "",
            ]
            for name, (same, total) in text.get("identical", {}).items():
                lines.append(f"- `{name}`: {same}/{total} identical to autoregressive decoding")
            if text.get("identical"):
                lines.append("")
        lines += ["| plan | tokens/s | vs AR | vs HF assisted | block efficiency |", "|---|---|---|---|---|"]
        for row in [*res["baselines"].values(), *res["results"]]:
            name = f"{row['plan']} (`{row['static_plan']}`)" if row.get("static_plan") else row["plan"]
            lines.append(
                f"| {name} | {f(row['tokens_per_s'], '.1f')} | {f(row['speedup_vs_ar'])} | "
                f"{f(row['ratio_to_hf_assisted'])} | {f(row['block_efficiency'])} |"
            )
        lines.append("")
        for row in res["results"]:
            if "chosen_actions" in row:
                ch, lat = row["chosen_actions"], row["decision_latency_us"]
                top = ", ".join(f"`{a['action']}` {100 * a['share']:.0f}%" for a in ch["top"])
                lines += [
                    f"`{row['plan']}`: {ch['decisions']} decisions, median {f(lat['median'], '.0f')} µs each, "
                    f"{ch['distinct']} distinct actions; most chosen: {top}",
                    "",
                ]
            if row.get("policy_decision_us_per_level") is not None:
                share = row.get("policy_decision_share_of_draft_forward")
                lines += [
                    f"`{row['plan']}`: the drafting policy decides in {f(row['policy_decision_us_per_level'], '.1f')} "
                    f"µs per draft level, {f(100 * share if share else None, '.1f')}% of one draft forward",
                    "",
                ]
    lines += [f"![{p}]({p})" for p in plots]
    return "\n".join(lines) + "\n"


def write_plots(report: dict, out: Path) -> list[str]:
    """Speedup per plan, accepted-length histograms, block efficiency vs tree size, accepted length per
    depth and a timeline of the headline plan's trees (PNG); the file names written in ``out``.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = report["runs"]
    plots = (
        ("speedup.png", _plot_speedup),
        ("accepted_lengths.png", _plot_accepted_lengths),
        ("block_efficiency_vs_tree_size.png", _plot_block_efficiency),
        ("depth_and_timeline.png", _plot_depth_and_timeline),
    )
    for name, plot in plots:
        fig = plot(plt, runs, list(runs))
        fig.tight_layout()
        fig.savefig(out / name, dpi=110)
        plt.close(fig)
    return [name for name, _ in plots]


def _plot_speedup(plt: Any, runs: dict, temps: list[str]) -> Any:
    names = [r["plan"] for r in runs[temps[0]]["results"]]
    hf = [t for t in temps if runs[t]["baselines"].get("hf_assisted", {}).get("speedup_vs_ar")]
    fig, ax = plt.subplots(figsize=(9, 4.5))
    labels = [*names, "hf_assisted"] if hf else names
    width = 0.8 / len(temps)
    for j, t in enumerate(temps):
        vals = [r["speedup_vs_ar"] or 0 for r in runs[t]["results"]]
        if hf:
            vals.append(runs[t]["baselines"].get("hf_assisted", {}).get("speedup_vs_ar") or 0)
        ax.bar([i + j * width for i in range(len(vals))], vals, width, label=f"T={t}")
    ax.axhline(1.0, color="gray", lw=1, ls="--")
    ax.set_xticks([i + width * (len(temps) - 1) / 2 for i in range(len(labels))], labels, rotation=20, ha="right")
    ax.set_ylabel("speedup over autoregressive (tokens/s ratio)")
    ax.set_title("Speedup per plan")
    ax.legend()
    return fig


def _plot_accepted_lengths(plt: Any, runs: dict, temps: list[str]) -> Any:
    fig, axes = plt.subplots(1, len(temps), figsize=(5 * len(temps), 4), squeeze=False)
    for ax, t in zip(axes[0], temps, strict=True):
        for r in runs[t]["results"]:
            hist = {int(k): v for k, v in r["accept_histogram"].items()}
            total = sum(hist.values()) or 1
            xs = list(range(max(hist, default=0) + 1))  # lengths never seen count as zero
            ax.plot(xs, [hist.get(x, 0) / total for x in xs], marker="o", label=r["plan"])
        ax.set_xlabel("accepted draft tokens per step")
        ax.set_ylabel("fraction of steps")
        ax.set_title(f"Accepted lengths, T={t}")
    axes[0][0].legend(fontsize=7)
    return fig


def _plot_block_efficiency(plt: Any, runs: dict, temps: list[str]) -> Any:
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    for t in temps:
        rows = [r for r in runs[t]["results"] if r["mean_tree_size"]]
        ax.scatter([r["mean_tree_size"] for r in rows], [r["block_efficiency"] for r in rows], label=f"T={t}")
        for r in rows:
            ax.annotate(r["plan"], (r["mean_tree_size"], r["block_efficiency"]), fontsize=6)
    ax.set_xlabel("mean draft tree size (nodes, root included)")
    ax.set_ylabel("block efficiency (tokens per target pass)")
    ax.set_title("Block efficiency against tree size")
    ax.legend()
    return fig


def _plot_depth_and_timeline(plt: Any, runs: dict, temps: list[str]) -> Any:
    """Accepted length per depth, and a timeline of the trees the first (headline) plan chose."""
    fig, axes = plt.subplots(2, len(temps), figsize=(5 * len(temps), 7), squeeze=False)
    for j, t in enumerate(temps):
        ax = axes[0][j]
        for r in runs[t]["results"]:
            by_depth = {int(k): v for k, v in r.get("accepted_by_depth", {}).items()}
            if by_depth:
                ax.plot(sorted(by_depth), [by_depth[d] for d in sorted(by_depth)], marker="o", label=r["plan"])
        ax.set(
            xlabel="depth d", ylabel="share of steps accepting >= d tokens", title=f"Accepted length per depth, T={t}"
        )
        head = runs[t]["results"][0]
        line = head.get("timeline") or []
        ax = axes[1][j]
        steps = range(len(line))
        ax.bar(steps, [n - 1 for n, _ in line], color="lightsteelblue", label="drafted tokens")
        ax.plot(steps, [a for _, a in line], "o", color="darkred", markersize=3, label="accepted")
        ax.set(xlabel="step (first prompt)", ylabel="tokens", title=f"Trees chosen by {head['plan']}, T={t}")
    axes[0][0].legend(fontsize=7)
    axes[1][0].legend(fontsize=7)
    return fig
