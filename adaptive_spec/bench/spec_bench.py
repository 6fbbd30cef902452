"""``adaptive-spec bench spec-bench``: Spec-Bench's six categories, every method in one interleaved run.

Spec-Bench (Xia et al., 2024; Apache-2.0, shipped in ``bench/questions`` with its licence) is
the field's benchmark for speculative decoding: 480 questions in six categories, ``mt_bench``
(80 two-turn MT-bench questions), ``translation``, ``summarization``, ``qa``,
``math_reasoning`` and ``rag`` (80 each). The copy-heavy categories (summarization,
retrieval-augmented questions) favour drafts looked up in the context; the others favour a
draft model.

Each question goes through the target's chat template. MT-bench's second turn is asked after
the target's own greedy answer to the first, generated once and shared by every method, so
the comparison stays paired. ``--per-category N`` takes N questions per category, evenly
spaced through Spec-Bench's order (so MT-bench's eight sub-categories are all drawn).

Every method runs on every prompt in turn, interleaved per prompt and per temperature
(:func:`adaptive_spec.bench.e2e.measure`, one call per category): the autoregressive
baseline, transformers' assisted generation and prompt lookup decoding, and each plan.
Spec-Bench is a report, never a tuning set: tune on prompt sets of your own.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

QUESTIONS = Path(__file__).parent / "questions" / "spec_bench.jsonl.gz"
CATEGORIES = ("mt_bench", "translation", "summarization", "qa", "math_reasoning", "rag")
MT_BENCH = frozenset({"writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities"})
OVERALL = "overall"
AR, HF_ASSISTED, HF_LOOKUP = "autoregressive", "hf_assisted", "hf_prompt_lookup"


@dataclass(frozen=True)
class Question:
    """One Spec-Bench question: its id, its category (one of :data:`CATEGORIES`) and its user turns."""

    question_id: int
    category: str
    turns: tuple[str, ...]


def load_questions(per_category: int | None = None, path: str | Path = QUESTIONS) -> list[Question]:
    """Spec-Bench's questions, ``per_category`` per category (None: all), evenly spaced through each category.

    Raises:
        ValueError: ``per_category`` below 1, or a malformed question file (naming the line).
    """
    if per_category is not None and per_category < 1:
        raise ValueError(f"--per-category must be at least 1, got {per_category}")
    by_category: dict[str, list[Question]] = {c: [] for c in CATEGORIES}
    with gzip.open(path, "rt", encoding="utf-8") as f:
        for line_no, line in enumerate(f, 1):
            try:
                rec = json.loads(line)
                category = "mt_bench" if rec["category"] in MT_BENCH else rec["category"]
                question = Question(int(rec["question_id"]), category, tuple(rec["turns"]))
            except (ValueError, KeyError, TypeError) as err:
                raise ValueError(f"{path}, line {line_no}: not a Spec-Bench question ({err})") from None
            if category not in by_category or not question.turns:
                raise ValueError(f"{path}, line {line_no}: unknown category {rec['category']!r} or no turns")
            by_category[category].append(question)
    out: list[Question] = []
    for questions in by_category.values():
        n = len(questions) if per_category is None else min(per_category, len(questions))
        out += [questions[i * len(questions) // n] for i in range(n)]
    return out


def turn_prompts(engine: Any, questions: Sequence[Question], max_new_tokens: int, progress: bool = True) -> list:
    """``(category, ChatPrompt)`` for every turn of every question.

    A second turn follows the target's own greedy answer to the first (``max_new_tokens`` tokens
    at most), generated here once, so that every method is measured on the same conversation.
    Without a chat template the conversation is plain text, its turns a blank line apart.
    """
    from tqdm.auto import tqdm

    from adaptive_spec.files import ChatPrompt, render_prompt

    chat = bool(getattr(engine.tokenizer, "chat_template", None))
    out = []
    for q in tqdm(questions, desc="spec-bench turns", disable=not progress):
        messages: list[dict[str, str]] = []
        for i, turn in enumerate(q.turns):
            if i > 0:  # the model's own answer to the previous turn
                previous = render_prompt(engine.tokenizer, out[-1][1]) if chat else _plain(messages)
                answer = engine.generate(previous, max_new_tokens=max_new_tokens, temperature=0, plan=None)
                messages.append({"role": "assistant", "content": answer.text or ""})
            messages.append({"role": "user", "content": turn})
            out.append((q.category, ChatPrompt(turn, list(messages)) if chat else _plain(messages)))
    return out


def _plain(messages: Sequence[Mapping[str, str]]) -> str:
    """A conversation as plain text, for a tokenizer without a chat template: the turns, a blank line apart."""
    return "\n\n".join(m["content"] for m in messages)


def run(
    engine: Any,
    prompts: Sequence[tuple[str, Any]],
    plans: Mapping[str, Any],
    temperatures: Sequence[float],
    max_new_tokens: int,
    seed: int = 0,
    progress: bool = True,
    **baselines: Any,
) -> dict[str, Any]:
    """Measure every method on each category's prompts (:func:`~adaptive_spec.bench.e2e.measure`), then summarise.

    ``baselines``: ``hf``, ``hf_draft`` and ``lookup`` as :func:`~adaptive_spec.bench.e2e.measure` takes them.

    Returns:
        ``{"categories": {category: measure's report}, "summary": {temperature key: {method:
        {category or "overall": {tokens_per_s, speedup_vs_ar, mean_accepted_tokens, new_tokens,
        seconds}}}}}``; a category none of whose prompts fits the context window is left out.
    """
    from adaptive_spec.bench.e2e import measure

    categories: dict[str, Any] = {}
    for category in CATEGORIES:
        chosen = [p for c, p in prompts if c == category and _fits(engine, p, max_new_tokens)]
        if not chosen:
            continue
        report = measure(engine, chosen, plans, temperatures, max_new_tokens, seed, progress=progress, **baselines)
        report["num_prompts"] = len(chosen)
        categories[category] = report
    return {"categories": categories, "summary": summarise(categories)}


def _fits(engine: Any, prompt: Any, max_new_tokens: int) -> bool:
    """Whether the rendered prompt leaves room for ``max_new_tokens`` in the context window."""
    from adaptive_spec.files import render_prompt

    if engine.max_positions is None:
        return True
    ids = render_prompt(engine.tokenizer, prompt)
    n = len(ids) if isinstance(ids, list) else len(engine.tokenizer(ids)["input_ids"])
    return n + max_new_tokens <= engine.max_positions


def summarise(categories: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, dict[str, dict[str, Any]]]]:
    """Per temperature, method and category (and ``overall``, pooled over categories): speed and accepted tokens.

    ``overall`` pools tokens and seconds over every prompt of every category, as Spec-Bench does;
    ``mean_accepted_tokens`` is tokens per target decoding pass (None for transformers' baselines).
    """
    out: dict[str, dict[str, dict[str, dict[str, Any]]]] = {}
    for category, report in categories.items():
        for tkey, run_ in report["runs"].items():
            for row in [*run_["baselines"].values(), *run_["results"]]:
                cell = out.setdefault(tkey, {}).setdefault(row["plan"], {})
                be = row.get("block_efficiency")
                steps = row["new_tokens"] / be if be else None
                cell[category] = {"new_tokens": row["new_tokens"], "seconds": row["seconds"], "steps": steps}
    for methods in out.values():
        for cells in methods.values():
            pooled = {k: sum(c[k] for c in cells.values()) for k in ("new_tokens", "seconds")}
            steps = [c["steps"] for c in cells.values()]
            pooled["steps"] = sum(steps) if all(s is not None for s in steps) else None
            cells[OVERALL] = pooled
        for cells in methods.values():
            for category, c in cells.items():
                ar = methods[AR][category]
                tps = c["new_tokens"] / c["seconds"] if c["seconds"] else 0.0
                ar_tps = ar["new_tokens"] / ar["seconds"] if ar["seconds"] else None
                c["tokens_per_s"] = tps
                c["speedup_vs_ar"] = tps / ar_tps if ar_tps else None
                c["mean_accepted_tokens"] = c["new_tokens"] / c["steps"] if c.get("steps") else None
    return out


def print_summary(summary: Mapping[str, Any]) -> None:
    """One table per temperature: speedup over autoregressive decoding per category, then tokens/s overall."""
    for tkey, methods in summary.items():
        cats = [c for c in [*CATEGORIES, OVERALL] if any(c in cells for cells in methods.values())]
        width = max(len(m) for m in methods) + 2
        print(f"\ntemperature {tkey}: speedup over autoregressive decoding (mean accepted tokens)")
        print(f"{'method':<{width}}" + "".join(f"{c:>20}" for c in cats) + f"{'tok/s':>9}")
        for method, cells in methods.items():
            line = f"{method:<{width}}"
            for c in cats:
                cell = cells.get(c)
                if cell is None or cell["speedup_vs_ar"] is None:
                    line += f"{'-':>20}"
                    continue
                mat = cell["mean_accepted_tokens"]
                line += f"{cell['speedup_vs_ar']:>13.2f}x" + (f" ({mat:.2f})" if mat else " " * 7)
            print(line + f"{cells[OVERALL]['tokens_per_s']:>9.1f}")


def plot_summary(summary: Mapping[str, Any], path: str | Path) -> Path:
    """Grouped bars, one panel per temperature: each method's speedup over autoregressive decoding per category."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = list(summary)
    fig, axes = plt.subplots(len(keys), 1, figsize=(11, 3.6 * len(keys)), squeeze=False)
    for ax, tkey in zip(axes[:, 0], keys, strict=True):
        methods = [m for m in summary[tkey] if m != AR]
        cats = [c for c in [*CATEGORIES, OVERALL] if any(c in summary[tkey][m] for m in methods)]
        width = 0.8 / max(len(methods), 1)
        for j, method in enumerate(methods):
            ys = [(summary[tkey][method].get(c) or {}).get("speedup_vs_ar") or 0.0 for c in cats]
            ax.bar([i + j * width for i in range(len(cats))], ys, width, label=method)
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_xticks([i + width * (len(methods) - 1) / 2 for i in range(len(cats))], cats)
        ax.set_ylabel("speedup vs autoregressive")
        ax.set_title(f"Spec-Bench, temperature {tkey}")
        ax.legend(fontsize=8, ncol=min(len(methods), 4))
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
