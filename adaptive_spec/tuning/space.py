"""The search spaces, in one place: static plans (``tune plans``) and selector hyper-parameters.

Every ``trial.suggest_*`` call of the project lives in this module. The plan space is
define-by-run: a ``family`` first, then that family's sizes and verifier. Optuna fixes the
choices of a categorical per parameter *name*, so each family has its own parameter names
(``chain_verifier``, ``tree_verifier``, ``wor_verifier``, ...).

Static plan space (ranges of the plan action space)::

    family   parameters                                   verifier choices
    chain    chain_len 1-8                                token, block, traversal
    iid      iid_paths 2-4, iid_len 1-8                   traversal, specinfer, spectr, gbv, nss, naive
    delayed  delayed_trunk 1-8, delayed_paths 2-4,        (same as iid: one ``tree_verifier``)
             delayed_branch 0-8
    wor      wor_head 1-3, wor_w0 2-4, wor_w1 2-3,        traversal, rrsw
             wor_w2 2-3, wor_tail 0-5

A without-replacement tree is ``wor_head`` branching levels (widths ``wor_w0``..``wor_w2``)
followed by ``wor_tail`` levels of width 1, e.g. ``wor:3x2x1`` = head 2 (3, 2), tail 1. Trees
that branch below a width-1 level (``wor:1x3``) are outside the space. Every plan of the
action space (``adaptive_spec/planner/default_actions.yaml``) whose sizes fall in these ranges is a point of
this space.

Node budget: a plan has at most :data:`MAX_NODES` nodes (root included). The chain, iid and
delayed ranges stay below it (``delayed:8x4x8`` has 41 nodes); wide without-replacement trees
exceed it, and :func:`suggest_plan` raises :class:`OverBudgetError` for them, which the objective
turns into a pruned trial (cheap: nothing is run).

At temperature 0 the engine verifies greedily whatever the plan says, so the verifier is not
searched there: the plan's verifier is ``greedy`` (``chain:5/greedy``) and equal shapes are
equal trials.

A parameter set maps to one :class:`~adaptive_spec.planner.plan.Plan` (:func:`params_to_plan`;
several may map to the same canonical plan, e.g. ``delayed`` with ``delayed_branch=0`` is a
chain), and every plan in the space maps back to parameters that rebuild it
(:func:`plan_to_params`), which is how known-good plans are enqueued.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from adaptive_spec.planner.plan import Plan
from adaptive_spec.trees import DraftLaw, TreeShape

if TYPE_CHECKING:
    import optuna

__all__ = [
    "CHAIN_LEN",
    "CHAIN_VERIFIERS",
    "FAMILIES",
    "GREEDY",
    "KNOWN_GOOD_PLANS",
    "MAX_NODES",
    "PLAN_PARAM_GROUPS",
    "SELECTOR_KNOWN_GOOD",
    "SELECTOR_SPACE",
    "TREE_VERIFIERS",
    "WOR_VERIFIERS",
    "OverBudgetError",
    "iter_plans",
    "known_good_params",
    "params_to_plan",
    "plan_in_space",
    "plan_to_params",
    "selector_kwargs",
    "suggest_plan",
    "suggest_selector_hparams",
]

FAMILIES = ("chain", "iid", "delayed", "wor")
GREEDY = "greedy"  # the verifier the engine uses at temperature 0, whatever the plan says

# Ranges (inclusive) of the plan action space.
CHAIN_LEN = (1, 8)
CHAIN_VERIFIERS = ("token", "block", "traversal")
IID_PATHS = (2, 4)
IID_LEN = (1, 8)
DELAYED_TRUNK = (1, 8)
DELAYED_PATHS = (2, 4)
DELAYED_BRANCH = (0, 8)
TREE_VERIFIERS = ("traversal", "specinfer", "spectr", "gbv", "nss", "naive")  # iid and delayed trees
WOR_HEAD = (1, 3)
WOR_WIDTHS = ((2, 4), (2, 3), (2, 3))  # width range of each branching level
WOR_TAIL = (0, 5)
MAX_NODES = 64  # node budget of a plan, root included
WOR_VERIFIERS = ("traversal", "rrsw")

# Parameters of each family (the report draws slice / parallel-coordinate plots per family).
PLAN_PARAM_GROUPS = {
    "chain": ["chain_len", "chain_verifier"],
    "iid": ["iid_paths", "iid_len", "tree_verifier"],
    "delayed": ["delayed_trunk", "delayed_paths", "delayed_branch", "tree_verifier"],
    "wor": ["wor_head", "wor_w0", "wor_w1", "wor_w2", "wor_tail", "wor_verifier"],
}

# Hand-picked plans enqueued before the sampler takes over (optuna-examples: faq/enqueue_trial.py).
# The first three are ``bench e2e``'s default plans.
KNOWN_GOOD_PLANS = (
    "chain:4/block",
    "delayed:2x3x3/traversal",
    "wor:3x2x1/traversal",
    "chain:6/traversal",
    "delayed:2x2x2/traversal",
    "iid:2x3/specinfer",
    "wor:2x2/rrsw",
)


class OverBudgetError(ValueError):
    """A sampled plan has more than :data:`MAX_NODES` nodes."""


def _greedy(temperature: float) -> bool:
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    return temperature == 0


def suggest_plan(trial: optuna.Trial, temperature: float) -> Plan:
    """Sample a static plan for ``trial`` (define-by-run); the plan is lossless by construction.

    Args:
        trial: the Optuna trial.
        temperature: the sampling temperature the plan is tuned for; at 0 no verifier is
            searched and the plan's verifier is ``greedy``.

    Returns:
        The plan, validated by :class:`Plan` (its drafting law is checked against the verifier).

    Raises:
        OverBudgetError: the sampled tree has more than :data:`MAX_NODES` nodes (the parameters are
            recorded in the trial all the same).
    """
    greedy = _greedy(temperature)
    family = trial.suggest_categorical("family", FAMILIES)
    params: dict[str, Any] = {"family": family}
    if family == "chain":
        params["chain_len"] = trial.suggest_int("chain_len", *CHAIN_LEN)
        if not greedy:
            params["chain_verifier"] = trial.suggest_categorical("chain_verifier", CHAIN_VERIFIERS)
    elif family == "iid":
        params["iid_paths"] = trial.suggest_int("iid_paths", *IID_PATHS)
        params["iid_len"] = trial.suggest_int("iid_len", *IID_LEN)
        if not greedy:
            params["tree_verifier"] = trial.suggest_categorical("tree_verifier", TREE_VERIFIERS)
    elif family == "delayed":
        params["delayed_trunk"] = trial.suggest_int("delayed_trunk", *DELAYED_TRUNK)
        params["delayed_paths"] = trial.suggest_int("delayed_paths", *DELAYED_PATHS)
        params["delayed_branch"] = trial.suggest_int("delayed_branch", *DELAYED_BRANCH)
        if not greedy:
            params["tree_verifier"] = trial.suggest_categorical("tree_verifier", TREE_VERIFIERS)
    else:
        params["wor_head"] = head = trial.suggest_int("wor_head", *WOR_HEAD)
        for d in range(head):
            params[f"wor_w{d}"] = trial.suggest_int(f"wor_w{d}", *WOR_WIDTHS[d])
        params["wor_tail"] = trial.suggest_int("wor_tail", *WOR_TAIL)
        if not greedy:
            params["wor_verifier"] = trial.suggest_categorical("wor_verifier", WOR_VERIFIERS)
    plan = params_to_plan(params, temperature)
    if plan.shape.max_nodes > MAX_NODES:
        raise OverBudgetError(f"plan {plan} has {plan.shape.max_nodes} nodes, more than the budget of {MAX_NODES}")
    return plan


def params_to_plan(params: dict[str, Any], temperature: float) -> Plan:
    """The plan that a trial's parameters describe (canonical shape: ``delayed:2x3x0`` is ``chain:2``).

    Raises:
        ValueError: unknown family, a missing or out-of-range parameter, or a verifier that is
            not lossless for the shape's drafting law.
    """
    greedy = _greedy(temperature)

    def get(name: str, bounds: tuple[int, int] | tuple[str, ...]) -> Any:
        if name not in params:
            raise ValueError(f"plan parameters {params}: missing {name!r}")
        value = params[name]
        ok = (bounds[0] <= value <= bounds[1]) if isinstance(bounds[0], int) else value in bounds
        if not ok:
            raise ValueError(f"plan parameter {name}={value!r} is outside the search space {bounds}")
        return value

    family = params.get("family")
    if family == "chain":
        shape, verifier_key, choices = TreeShape.chain(get("chain_len", CHAIN_LEN)), "chain_verifier", CHAIN_VERIFIERS
    elif family == "iid":
        shape = TreeShape.iid(get("iid_paths", IID_PATHS), get("iid_len", IID_LEN))
        verifier_key, choices = "tree_verifier", TREE_VERIFIERS
    elif family == "delayed":
        shape = TreeShape.delayed(
            get("delayed_trunk", DELAYED_TRUNK),
            get("delayed_paths", DELAYED_PATHS),
            get("delayed_branch", DELAYED_BRANCH),
        )
        verifier_key, choices = "tree_verifier", TREE_VERIFIERS
    elif family == "wor":
        head = get("wor_head", WOR_HEAD)
        widths = [get(f"wor_w{d}", WOR_WIDTHS[d]) for d in range(head)] + [1] * get("wor_tail", WOR_TAIL)
        shape, verifier_key, choices = TreeShape.without_replacement(widths), "wor_verifier", WOR_VERIFIERS
    else:
        raise ValueError(f"plan parameters {params}: 'family' must be one of {FAMILIES}")
    verifier = GREEDY if greedy else get(verifier_key, choices)
    return Plan(shape, verifier)


def plan_to_params(plan: Plan | str, temperature: float) -> dict[str, Any]:
    """Parameters that :func:`params_to_plan` turns back into ``plan`` (for ``study.enqueue_trial``).

    At temperature 0 the verifier is dropped (the engine verifies greedily); a plan verified
    by ``greedy`` is accepted only there.

    Raises:
        ValueError: the plan lies outside the search space (sizes, verifier, or a tree shape
            the space cannot express); the message says which part.
    """
    plan = Plan.parse(plan) if isinstance(plan, str) else plan
    greedy = _greedy(temperature)
    shape = plan.shape
    if shape.law is DraftLaw.CHAIN and not greedy and plan.verifier not in CHAIN_VERIFIERS:
        # A chain verified by a tree verifier is the space's delayed family with no branch.
        params: dict[str, Any] = {"family": "delayed", "delayed_trunk": shape.trunk, "delayed_paths": DELAYED_PATHS[0]}
        params["delayed_branch"] = 0
        verifier_key = "tree_verifier"
    elif shape.law is DraftLaw.CHAIN:
        params = {"family": "chain", "chain_len": shape.trunk}
        verifier_key = "chain_verifier"
    elif shape.law is DraftLaw.IID:
        params = {"family": "iid", "iid_paths": shape.paths, "iid_len": shape.branch_len}
        verifier_key = "tree_verifier"
    elif shape.law is DraftLaw.DELAYED:
        params = {
            "family": "delayed",
            "delayed_trunk": shape.trunk,
            "delayed_paths": shape.paths,
            "delayed_branch": shape.branch_len,
        }
        verifier_key = "tree_verifier"
    else:
        widths = list(shape.widths)
        head = next((i for i, w in enumerate(widths) if w == 1), len(widths))
        if any(w != 1 for w in widths[head:]):
            raise ValueError(
                f"plan {plan}: the search space holds without-replacement trees whose branching levels "
                "come first and are followed by width-1 levels only (e.g. wor:3x2x1)"
            )
        params = {"family": "wor", "wor_head": head, **{f"wor_w{d}": w for d, w in enumerate(widths[:head])}}
        params["wor_tail"] = len(widths) - head
        verifier_key = "wor_verifier"
    if plan.verifier == GREEDY and not greedy:
        raise ValueError(f"plan {plan}: the greedy verifier is for temperature 0 only")
    if not greedy:
        params[verifier_key] = plan.verifier
    rebuilt = params_to_plan(params, temperature)  # range checks, with the offending parameter named
    if rebuilt.shape != shape:
        raise ValueError(f"plan {plan} is outside the search space (it would become {rebuilt})")
    if shape.max_nodes > MAX_NODES:
        raise OverBudgetError(f"plan {plan} has {shape.max_nodes} nodes, more than the budget of {MAX_NODES}")
    return params


def plan_in_space(plan: Plan | str, temperature: float) -> bool:
    """Whether ``plan`` (at ``temperature``) is a point of the search space."""
    try:
        plan_to_params(plan, temperature)
    except ValueError:
        return False
    return True


def known_good_params(temperature: float, plans: tuple[str, ...] = KNOWN_GOOD_PLANS) -> list[dict[str, Any]]:
    """Parameters of the known-good plans at ``temperature``, without duplicates (in order).

    At temperature 0 the verifiers are dropped, so plans that differ only by verifier collapse.
    """
    out: list[dict[str, Any]] = []
    for text in plans:
        params = plan_to_params(text, temperature)
        if params not in out:
            out.append(params)
    return out


def iter_plans(temperature: float) -> Iterator[Plan]:
    """Every distinct (canonical) plan of the search space at ``temperature``.

    The space is finite; this enumerates it (plans within :data:`MAX_NODES`), for tests and for
    label tables that should cover the whole space.
    """
    greedy = _greedy(temperature)
    grids: list[dict[str, Any]] = []

    def grid(family: str, ranges: dict[str, Any], verifier_key: str | None, verifiers: tuple[str, ...]) -> None:
        names = list(ranges)
        values = [range(r[0], r[1] + 1) if isinstance(r, tuple) else r for r in ranges.values()]
        for combo in itertools.product(*values):
            base = {"family": family, **dict(zip(names, combo, strict=True))}
            for v in [None] if greedy else verifiers:
                grids.append(base if v is None else {**base, verifier_key: v})

    grid("chain", {"chain_len": CHAIN_LEN}, "chain_verifier", CHAIN_VERIFIERS)
    grid("iid", {"iid_paths": IID_PATHS, "iid_len": IID_LEN}, "tree_verifier", TREE_VERIFIERS)
    grid(
        "delayed",
        {"delayed_trunk": DELAYED_TRUNK, "delayed_paths": DELAYED_PATHS, "delayed_branch": DELAYED_BRANCH},
        "tree_verifier",
        TREE_VERIFIERS,
    )
    for head in range(WOR_HEAD[0], WOR_HEAD[1] + 1):
        widths = {f"wor_w{d}": WOR_WIDTHS[d] for d in range(head)}
        grid("wor", {"wor_head": [head], **widths, "wor_tail": WOR_TAIL}, "wor_verifier", WOR_VERIFIERS)
    seen: set[str] = set()
    for params in grids:
        plan = params_to_plan(params, temperature)
        if plan.shape.max_nodes <= MAX_NODES and str(plan) not in seen:
            seen.add(str(plan))
            yield plan


# ---------------------------------------------------------------------------- selector
# Hyper-parameters of the learned plan selector (``tune selector``), as
# :class:`adaptive_spec.selector.lit.SelectorModule` takes them: name -> (kind, choices or bounds, log).
SELECTOR_SPACE: dict[str, tuple[str, tuple[Any, ...], bool]] = {
    "width": ("categorical", (32, 64, 128, 256, 512), False),  # units per MLP layer
    "depth": ("int", (1, 3), False),  # MLP layers: hidden_sizes = (width,) * depth
    "dropout": ("float", (0.0, 0.3), False),
    "lr": ("float", (1e-4, 3e-2), True),
    "weight_decay": ("float", (1e-6, 1e-2), True),
    "ce_weight": ("float", (0.05, 2.0), True),  # loss weight: cross-entropy towards the per-context best action
    "tail_weight": ("float", (0.0, 1.0), False),  # loss weight: worst-contexts penalty (0 = off)
}


# Close to configs/selector/default.yaml (its [512, 32] funnel is not a (width,) * depth MLP); enqueued first.
SELECTOR_KNOWN_GOOD = {
    "width": 128,
    "depth": 2,
    "dropout": 0.1,
    "lr": 1e-3,
    "weight_decay": 1e-4,
    "ce_weight": 0.5,
    "tail_weight": 0.0,
}


def suggest_selector_hparams(trial: optuna.Trial) -> dict[str, Any]:
    """Sample the selector's hyper-parameters (:data:`SELECTOR_SPACE`).

    Returns:
        Keyword arguments of :class:`~adaptive_spec.selector.lit.SelectorModule`: ``hidden_sizes``
        (``(width,) * depth``), ``dropout``, ``lr``, ``weight_decay``, ``ce_weight``, ``tail_weight``.
    """
    raw: dict[str, Any] = {}
    for name, (kind, bounds, log) in SELECTOR_SPACE.items():
        if kind == "categorical":
            raw[name] = trial.suggest_categorical(name, bounds)
        elif kind == "int":
            raw[name] = trial.suggest_int(name, *bounds, log=log)
        else:
            raw[name] = trial.suggest_float(name, *bounds, log=log)
    return selector_kwargs(raw)


def selector_kwargs(params: dict[str, Any]) -> dict[str, Any]:
    """SelectorModule keyword arguments from a trial's parameters (``width``/``depth`` -> ``hidden_sizes``)."""
    out = {k: v for k, v in params.items() if k not in ("width", "depth")}
    out["hidden_sizes"] = [int(params["width"])] * int(params["depth"])
    return out
