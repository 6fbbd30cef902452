"""``adaptive-spec collect``: run the engine over prompts and log every speculative step's features.

Each prompt is generated ``--repeats`` times at each of ``--temperatures``, with a static plan
(``--plan``) or an exploring planner (``--explore uniform`` draws a uniformly random action of
the action space at every step, ``--explore epsilon:0.2`` the static plan with probability 0.8);
the engine logs one record per step to ``--out`` as Parquet shards (see
:mod:`adaptive_spec.formats.feature_log`). Generation ``i`` (counting over repeats, prompts and
temperatures, in that nesting) is seeded with ``--seed + i``, and the exploring planner with
``--seed``, so a run is reproducible. A second run into the same directory appends to it.

Prompts: JSON Lines (``.gz`` accepted; each record has a ``prompt`` string or a ``turns`` list)
or a ``.txt`` file with one prompt per line; default: the built-in pair's prompts.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

DEFAULT_TEMPERATURES = "0,0.7,1.0"


def make_planner(plan: str, explore: str | None, actions: str | None, seed: int) -> Any:
    """The static plan, or an :class:`~adaptive_spec.planner.ExplorePlanner` for ``explore``."""
    from adaptive_spec.planner import Plan

    base = Plan.parse(plan)
    if explore is None:
        return base
    from adaptive_spec.planner import ActionSpace, ExplorePlanner

    space = ActionSpace.from_yaml(actions) if actions else ActionSpace.default()
    mode, _, eps = explore.partition(":")
    if mode == "uniform" and not eps:
        return ExplorePlanner(space, "uniform", seed=seed)
    if mode == "epsilon":
        try:
            epsilon = float(eps) if eps else 0.2
        except ValueError:
            raise ValueError(f"--explore epsilon:E needs a number E in [0, 1], got {explore!r}") from None
        return ExplorePlanner(space, "epsilon", epsilon=epsilon, base=base, seed=seed)
    raise ValueError(f"--explore must be 'uniform' or 'epsilon:E' (e.g. epsilon:0.2), got {explore!r}")


def collect(
    engine: Any,
    prompts: list[str],
    planner: Any,
    temperatures: list[float],
    *,
    max_new_tokens: int,
    repeats: int = 1,
    seed: int = 0,
    top_k: int = 0,
    top_p: float = 1.0,
    progress: bool = True,
) -> dict[str, Any]:
    """Generate every (repeat, prompt, temperature) with ``planner``; the engine's feature log records the steps.

    Returns:
        ``{"generations", "steps", "tokens", "families": {family: {"steps", "mean_accepted",
        "mean_emitted"}}}`` where a family is the tree law of the step's plan (``chain``,
        ``iid``, ``delayed``, ``wor``).
    """
    from tqdm.auto import tqdm

    log = engine.feature_log
    acc: dict[str, list[int]] = defaultdict(list)
    emitted: dict[str, list[int]] = defaultdict(list)
    tokens = 0
    jobs = [(r, i, t) for r in range(repeats) for i in range(len(prompts)) for t in temperatures]
    bar = tqdm(jobs, desc="collect", unit="gen", disable=not progress)
    for n, (_, i, temperature) in enumerate(bar):
        if log is not None:
            log.prompt_index = i
        if engine.draft_data is not None:
            engine.draft_data.prompt_index = i
        out = engine.generate(
            prompts[i],
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
            plan=planner,
            seed=seed + n,
        )
        tokens += len(out.token_ids)
        if getattr(engine, "node_log", None) is not None:
            engine.node_log.end_generation()
        for step in out.steps:
            family = str(step.plan.shape).partition(":")[0]
            acc[family].append(step.num_accepted)
            emitted[family].append(len(step.tokens))
        if log is not None:
            bar.set_postfix(records=log.records_written + log.buffered, refresh=False)
    families = {
        f: {"steps": len(v), "mean_accepted": sum(v) / len(v), "mean_emitted": sum(emitted[f]) / len(v)}
        for f, v in sorted(acc.items())
    }
    steps = sum(len(v) for v in acc.values())
    return {"generations": len(jobs), "steps": steps, "tokens": tokens, "families": families}
