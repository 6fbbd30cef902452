"""How a lookup plan's accepted tokens grow with its datastore: ``adaptive-spec bench datastore``.

At temperature 0 a lookup plan's step is a function of the context alone. Its trie (the continuations found in the
context and in the datastore) is built by the engine's own code (:func:`adaptive_spec.engine.drafting.lookup_outcome`,
the plan cut to the budget as the engine cuts it), and greedy verification walks down it along the target's greedy
answer. So one greedy answer per prompt, decoded once by the engine's plain decoding, gives every lookup plan's steps
at T = 0 for every datastore, with no further target pass: the steps are the engine's own
(``tests/test_bench_datastore.py`` checks them against the engine's).

A fraction ``f`` of the datastore is a random ``f`` of its texts (:meth:`Datastore.sample`, seeded), so the curve
says what a smaller corpus of the same kind gives, and by its slope what a larger one would: whether generating more
text is worth it. It says nothing about speed (the rows a trie adds cost a pass more on a CPU than on a GPU) nor about
T > 0, where a target draw follows a continuation less often (``bench e2e`` measures both).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import torch

from adaptive_spec.engine.drafting import lookup_outcome
from adaptive_spec.planner.plan import Plan, as_plan
from adaptive_spec.trees.datastore import Datastore
from adaptive_spec.trees.lookup import NgramIndex

__all__ = ["DEFAULT_FRACTIONS", "datastore_curve", "greedy_answers", "lookup_plan", "plot_curve", "replay_lookup"]

DEFAULT_FRACTIONS = (0.125, 0.25, 0.5, 1.0)


def lookup_plan(plan: Plan | str) -> Plan:
    """``plan`` as a :class:`Plan`, checked to be a lookup plan (a one-line ``ValueError`` otherwise)."""
    plan = as_plan(plan)
    if plan.runs_draft:
        raise ValueError(
            f"bench datastore replays lookup plans without a draft model's path (lookup:L, lookup:WxL, lookup:WxL+K), "
            f"got {plan}"
        )
    return plan


def greedy_answers(engine: Any, prompts: Sequence[Any], max_new_tokens: int, progress: bool = True) -> list[dict]:
    """Each prompt's ids and the target's greedy answer to it (the engine's plain decoding at T = 0)."""
    from tqdm.auto import tqdm

    from adaptive_spec.engine.prompts import prompt_ids
    from adaptive_spec.files import render_prompt

    out = []
    for p in tqdm(prompts, desc="greedy answers", disable=not progress):
        ids = prompt_ids(render_prompt(engine.tokenizer, p), engine.tokenizer, engine.input_vocab_size)
        res = engine.generate(ids, max_new_tokens=max_new_tokens, temperature=0, plan="autoregressive")
        out.append({"prompt": ids, "answer": list(res.token_ids)})
    return out


def replay_lookup(plan: Plan | str, answers: Sequence[dict], datastore: Datastore | None, vocab_size: int) -> dict:
    """The steps a lookup plan takes at T = 0 along ``answers`` (:func:`greedy_answers`), with ``datastore``.

    Returns its block efficiency (tokens a step), nodes a step (the trie's drafted tokens), steps and tokens.
    """
    plan = lookup_plan(plan)
    if plan.corpus_paths and datastore is None:
        raise ValueError(f"plan {plan} drafts from a datastore and none was given")
    cpu = torch.device("cpu")
    steps = tokens = nodes = 0
    for item in answers:
        context, answer = list(item["prompt"]), list(item["answer"])
        ngrams, done = NgramIndex(context), 0  # context grows in place: the index follows it
        while done < len(answer):
            step = plan.truncated(len(answer) - done - 1)  # the engine's cut for the budget's last tokens
            corpus = (datastore, step.corpus_paths) if step.corpus_paths else None
            tree = lookup_outcome(ngrams, step.shape, vocab_size, cpu, None, corpus).tree
            node, accepted = 0, 0
            for tok in answer[done:]:  # greedy verification: follow the target's argmax while it is a child
                node = tree.child_with_token(node, tok)
                if node is None:
                    break
                accepted += 1
            n = min(accepted + 1, len(answer) - done)  # the accepted path and the target's next token
            context += answer[done : done + n]
            done += n
            steps, tokens, nodes = steps + 1, tokens + n, nodes + tree.num_nodes - 1
    return {
        "block_efficiency": tokens / max(steps, 1),
        "nodes_per_step": nodes / max(steps, 1),
        "steps": steps,
        "tokens": tokens,
    }


def datastore_curve(
    engine: Any,
    prompts: Sequence[Any],
    plans: Sequence[Plan | str],
    fractions: Sequence[float] = DEFAULT_FRACTIONS,
    *,
    max_new_tokens: int = 128,
    seed: int = 0,
    samples: int = 3,
    progress: bool = True,
) -> dict[str, Any]:
    """Every lookup plan's block efficiency at T = 0 on ``prompts`` with each ``fraction`` of the engine's datastore.

    A share below 1 is drawn ``samples`` times (seeds ``seed``, ``seed + 1``, ...): its row has the mean, each
    sample's figure (``block_efficiency_samples``) and the samples' mean tokens; the whole datastore is one sample.
    A plan without corpus paths (``lookup:L``, ``lookup:WxL``) does not read the datastore: it is replayed once, as
    the reference. Raises a one-line ``ValueError`` for a plan that is not a lookup plan, or when the engine has no
    datastore.
    """
    store = engine.datastore
    if store is None:
        raise ValueError("the engine has no datastore: give --datastore FILE (adaptive-spec zoo datastore builds one)")
    plans = [lookup_plan(p) for p in plans]
    bad = [f for f in fractions if not 0 < f <= 1]
    if bad or not fractions:
        raise ValueError(f"fractions of the datastore are in (0, 1], got {list(fractions)}")
    if samples < 1:
        raise ValueError(f"samples must be at least 1, got {samples}")
    t0 = time.perf_counter()
    answers = greedy_answers(engine, prompts, max_new_tokens, progress)
    seconds = time.perf_counter() - t0
    vocab = engine.vocab_size
    rows = [  # the context-only plans: the same at every size
        {"plan": str(p), "fraction": None, "datastore_tokens": 0, **replay_lookup(p, answers, None, vocab)}
        for p in plans
        if not p.corpus_paths
    ]
    corpus_plans = [p for p in plans if p.corpus_paths]
    for f in sorted(fractions) if corpus_plans else []:
        subs = [store.sample(f, seed + i) for i in range(samples if f < 1 else 1)]
        for p in corpus_plans:
            runs = [replay_lookup(p, answers, sub, vocab) for sub in subs]
            row = {key: sum(r[key] for r in runs) / len(runs) for key in runs[0]}
            be = [r["block_efficiency"] for r in runs]
            size = sum(len(sub) for sub in subs) / len(subs)
            rows.append(
                {"plan": str(p), "fraction": f, "datastore_tokens": size, **row, "block_efficiency_samples": be}
            )
    return {
        "temperature": 0,
        "prompts": len(answers),
        "answer_tokens": sum(len(a["answer"]) for a in answers),
        "greedy_seconds": seconds,
        "datastore": {"tokens": len(store), "texts": len(store.texts()), "info": store.info},
        "seed": seed,
        "samples": samples,
        "rows": rows,
    }


def plot_curve(result: dict[str, Any], path: Any) -> None:
    """A PNG of block efficiency against datastore tokens (log scale): a line per corpus plan (the samples' mean, bars
    to their least and most), the context-only plans flat.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    sized = [r for r in result["rows"] if r["fraction"] is not None]
    for plan in dict.fromkeys(r["plan"] for r in sized):
        mine = [r for r in sized if r["plan"] == plan]
        x = [r["datastore_tokens"] for r in mine]
        lo = [r["block_efficiency"] - min(r["block_efficiency_samples"]) for r in mine]
        hi = [max(r["block_efficiency_samples"]) - r["block_efficiency"] for r in mine]
        ax.errorbar(x, [r["block_efficiency"] for r in mine], yerr=[lo, hi], marker="o", capsize=3, label=plan)
    for r in (r for r in result["rows"] if r["fraction"] is None):
        ax.axhline(r["block_efficiency"], linestyle="--", color="grey", linewidth=1)
        ax.annotate(r["plan"], (0.01, r["block_efficiency"]), xycoords=("axes fraction", "data"), fontsize=8)
    ax.set_xscale("log")
    ax.set_xlabel("datastore tokens (a random share of its texts)")
    ax.set_ylabel("block efficiency at T = 0 (tokens a step)")
    ax.set_title(f"Lookup plans by datastore size: {result['prompts']} prompts, {result['answer_tokens']} tokens")
    ax.grid(alpha=0.3)
    if sized:
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
