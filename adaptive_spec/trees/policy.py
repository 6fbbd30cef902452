"""Drafting policies: trees grown while drafting, from the draft's own confidence.

A static :class:`~adaptive_spec.trees.TreeShape` fixes the tree before drafting. A
:class:`DraftPolicy` grows it level by level instead. After each draft level it sees, for
every frontier node, draft-side information only (a :class:`NodeView`: depth, the draft
probability of the node's token, the entropy and top-1 probability of the draft rows, the
path's cumulative draft probability, the node budget left, the root features) and decides:

* ``feed(views)``, for the nodes just drawn: which of them may get children. A node that is
  not fed is a leaf, and the draft model never runs on it, so no forward is wasted on a node
  that will not be expanded. This decision sees the row the node's token was drawn from
  (``parent_entropy``, ``parent_top1``, ``token_prob``) but not the node's own row.
* ``widths(views)``, for the fed nodes, once their own rows are known (``entropy``,
  ``top1``): how many children each one gets next; 0 stops the branch.

Both decisions are made before the children concerned are drawn, and never see the target.
The drafting law (:class:`~adaptive_spec.trees.DraftLaw`) says how the children are drawn:

* ``DYNAMIC_CHAIN``: at most one child per node;
* ``DYNAMIC_IID``: ``k`` i.i.d. draws from the node's row, duplicates merged and kept with
  multiplicity in ``child_draws`` (the static ``iid`` and ``delayed`` shapes are the policy
  "K draws at the branch node, then as many draws as walkers stand on each node");
* ``DYNAMIC_WOR``: ``k`` distinct children drawn one after another without replacement.

Given the decision ``k`` for a node, its children are fresh draws from the draft's row at the
node, whatever the policy looked at; that is what keeps the top-down verifiers and traversal
lossless on these trees (tested exactly, by enumerating the policy's decisions together with
the draws: ``tests/verifiers/test_dynamic_exact.py``). Random policies draw through the same
:class:`~adaptive_spec.rng.Sampler` as the drafting, so the enumeration covers them.

The reference drafter is :func:`adaptive_spec.trees.sample_policy_tree`; the engine's batched
drafter (:func:`adaptive_spec.engine.drafting.draft_policy_tree`) follows the same law with one
draft forward per level.

Text form (``Plan.parse`` accepts ``"<policy>/<verifier>"``)::

    conf-chain:D:θ           extend a chain while the draft's top-1 probability is >= θ (transformers'
                             assistant_confidence_threshold rule), at most D tokens
    cum-chain:D:m            extend while the path's cumulative draft probability is >= m (SpecDec++'s
                             stop rule, with the draft's own probabilities as acceptance estimates)
    conf-delayed:D:θ:K       a trunk that continues while the draft's top-1 is >= θ, then K i.i.d.
                             paths from the first node where it drops; paths continue while confident
    eagle:D:B:k:w[:wor]      EAGLE-2-style: at each level expand the k nodes of highest cumulative
                             draft probability with w children each (i.i.d., or without replacement
                             with ``wor``), at most B drafted nodes
    learned-chain:D:ρ        a chain grown by a learned acceptance model (``LearnedChain``): extend while
                             the predicted gain in accepted tokens per added draft forward beats the
                             step's current rate; ρ = one draft level's time / one step's time
"""

from __future__ import annotations

import dataclasses
import math
import operator
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from adaptive_spec.formats.nodes import ACCEPTANCE_FEATURES, acceptance_row
from adaptive_spec.rng import Sampler
from adaptive_spec.trees.shapes import DraftLaw, TreeShape

__all__ = [
    "ACCEPTANCE_FEATURES",
    "ChainRule",
    "ConfidenceChain",
    "ConfidenceDelayed",
    "CumulativeChain",
    "DraftPolicy",
    "EagleTree",
    "FixedShapePolicy",
    "LearnedChain",
    "LookedChain",
    "LookedDelayed",
    "NodeView",
    "PolicyContext",
    "acceptance_features",
    "acceptance_rows",
    "parse_policy",
    "row_stats",
]


@dataclass(slots=True)
class NodeView:
    """Draft-side facts about one frontier node, as a policy sees them (the drafter fills
    ``entropy``/``top1`` in place when the node is fed; a policy writes only ``memo``).

    Attributes:
        node: the node's index in the tree (0 = the root).
        parent: its parent's index (-1 for the root).
        token: its last token (-1 for the root).
        depth: drafted tokens on its path.
        token_prob: the draft probability of its token, ``q(token | parent)`` (1 for the root).
        path_prob: the product of ``token_prob`` along its path (the EAGLE-2 "global confidence").
        parent_entropy: entropy (nats) of the draft row its token was drawn from (for the
            root: of the root's own row).
        parent_top1: top-1 probability of that row.
        multiplicity: how many draws at its parent gave its token (1 unless i.i.d. drafting).
        parent_draws: number of draws at its parent (0 for the root).
        branched: whether some ancestor (its parent included) had more than one draw.
        entropy: entropy of the node's own row; None until the node is fed to the draft.
        top1: top-1 probability of the node's own row; None until it is fed.
        memo: the policy's own running value for the node (e.g. estimates along the path), set
            by the policy when it decides on the node; None until then.
        parent_memo: the parent's ``memo`` when the node was drawn (the drafter copies it).
    """

    node: int
    parent: int
    token: int
    depth: int
    token_prob: float
    path_prob: float
    parent_entropy: float
    parent_top1: float
    multiplicity: int = 1
    parent_draws: int = 0
    branched: bool = False
    entropy: float | None = None
    top1: float | None = None
    memo: Any = None
    parent_memo: Any = None


@dataclass(frozen=True)
class PolicyContext:
    """Step-level facts a policy sees with every decision.

    Attributes:
        budget_left: draws still allowed in this tree (the node budget left).
        temperature: the sampling temperature of the step (0 = greedy).
        features: the step's root features by schema name, or None when none were computed.
    """

    budget_left: int
    temperature: float = 1.0
    features: Mapping[str, float] | None = None


def row_stats(row: Any) -> tuple[float, float]:
    """(entropy in nats, top-1 probability) of one probability row (a 1-D tensor)."""
    import torch

    r = row.double()
    ent = -torch.where(r > 0, r * r.clamp_min(1e-300).log(), torch.zeros_like(r)).sum()
    return float(ent), float(r.max())


@dataclass(frozen=True)
class DraftPolicy:
    """Base class of drafting policies (frozen dataclasses, so plans stay hashable).

    Attributes:
        depth: the most drafted tokens on a path.
        budget: the most draws in a tree (drafted nodes, root excluded, before merging).
    """

    depth: int
    budget: int = 0

    #: The drafting law of the trees this policy grows.
    law: DraftLaw = dataclasses.field(default=DraftLaw.DYNAMIC_CHAIN, init=False, repr=False)

    def __post_init__(self) -> None:
        for name in ("depth", "budget"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise ValueError(f"{type(self).__name__}: {name} must be an integer >= 0, got {v!r}")

    # ---------------------------------------------------------------- decisions
    def feed(self, views: Sequence[NodeView], ctx: PolicyContext, sampler: Sampler) -> list[bool]:  # noqa: ARG002
        """For nodes just drawn: which may get children (default: all)."""
        return [True] * len(views)

    def widths(self, views: Sequence[NodeView], ctx: PolicyContext, sampler: Sampler) -> list[int]:
        """For fed nodes with their own rows known: the number of children each gets."""
        raise NotImplementedError

    # ---------------------------------------------------------------- derived
    @property
    def max_width(self) -> int:
        """The most children :meth:`widths` can give one node (candidates the engine draws per node)."""
        return 1

    @property
    def shape(self) -> TreeShape:
        """The envelope of the trees this policy grows (law, depth, node budget)."""
        return TreeShape.dynamic(self.law, self.depth, self.budget)

    def __str__(self) -> str:
        return repr(self)

    def truncated(self, max_depth: int) -> DraftPolicy:
        """The same policy with paths cut to ``max_depth`` tokens."""
        if self.depth <= max_depth:
            return self
        return dataclasses.replace(self, depth=max(0, max_depth))


_EMPTY_CHAIN = TreeShape.chain(0)


@dataclass(frozen=True)
class FixedShapePolicy(DraftPolicy):
    """A static tree shape as a policy: the same law as drafting ``shape`` directly.

    Chains give one child per node up to the length; without-replacement trees ``widths[d]``
    children at depth d; i.i.d. and delayed trees one draw per trunk node, ``paths`` draws at
    the trunk's end, then as many draws as rollouts stand on a node (its multiplicity).
    """

    depth: int = dataclasses.field(default=0, init=False)
    budget: int = dataclasses.field(default=0, init=False)
    static: TreeShape = _EMPTY_CHAIN

    def __post_init__(self) -> None:
        s = self.static
        law = {
            DraftLaw.CHAIN: DraftLaw.DYNAMIC_CHAIN,
            DraftLaw.IID: DraftLaw.DYNAMIC_IID,
            DraftLaw.DELAYED: DraftLaw.DYNAMIC_IID,
            DraftLaw.WITHOUT_REPLACEMENT: DraftLaw.DYNAMIC_WOR,
        }.get(s.law)
        if law is None:
            raise ValueError(f"FixedShapePolicy: {s} is not a static shape")
        object.__setattr__(self, "law", law)
        object.__setattr__(self, "depth", s.depth)
        object.__setattr__(self, "budget", s.num_draws)

    @property
    def max_width(self) -> int:
        s = self.static
        if s.law is DraftLaw.WITHOUT_REPLACEMENT:
            return max(s.widths, default=1)
        return max(1, s.paths)

    def widths(self, views: Sequence[NodeView], ctx: PolicyContext, sampler: Sampler) -> list[int]:  # noqa: ARG002
        s = self.static
        out = []
        for v in views:
            if v.depth >= s.depth:
                out.append(0)
            elif s.law is DraftLaw.WITHOUT_REPLACEMENT:
                out.append(s.widths[v.depth])
            elif s.law is DraftLaw.CHAIN or v.depth < s.trunk:
                out.append(1)
            elif v.depth == s.trunk:
                out.append(s.paths)
            else:
                out.append(v.multiplicity)
        return out

    def truncated(self, max_depth: int) -> DraftPolicy:
        return self if self.depth <= max_depth else FixedShapePolicy(self.static.truncated(max_depth))

    def __str__(self) -> str:
        return f"fixed:{self.static}"


@dataclass(frozen=True)
class ChainRule(DraftPolicy):
    """A chain grown one child at a time while the subclass's ``feed`` rule holds; budget = depth.

    Its ``widths`` are always 1, so the engine's drafter does not call them.
    """

    def __post_init__(self) -> None:
        object.__setattr__(self, "budget", self.depth)
        super().__post_init__()

    def widths(self, views: Sequence[NodeView], ctx: PolicyContext, sampler: Sampler) -> list[int]:  # noqa: ARG002
        return [1] * len(views)


@dataclass(frozen=True)
class ConfidenceChain(ChainRule):
    """Extend a chain while the draft is confident: transformers' assistant rule.

    A drafted token is kept; drafting continues after it only if the top-1 probability of the
    row it was drawn from is at least ``threshold`` (transformers'
    ``assistant_confidence_threshold``), up to ``depth`` tokens.
    """

    threshold: float = 0.4

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_prob("threshold", self.threshold)

    def feed(self, views: Sequence[NodeView], ctx: PolicyContext, sampler: Sampler) -> list[bool]:  # noqa: ARG002
        return [v.parent_top1 >= self.threshold for v in views]

    def __str__(self) -> str:
        return f"conf-chain:{self.depth}:{self.threshold:g}"


@dataclass(frozen=True)
class CumulativeChain(ChainRule):
    """Extend a chain while the path's predicted acceptance stays high: SpecDec++'s stop rule.

    SpecDec++ stops when the predicted probability that some drafted token is rejected
    exceeds h, i.e. when the product of predicted acceptances falls below ``1 - h``. Here
    the acceptance estimate of a token is its own draft probability, so the rule is
    ``path_prob >= min_path_prob``.
    """

    min_path_prob: float = 0.3

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_prob("min_path_prob", self.min_path_prob)

    def feed(self, views: Sequence[NodeView], ctx: PolicyContext, sampler: Sampler) -> list[bool]:  # noqa: ARG002
        return [v.path_prob >= self.min_path_prob for v in views]

    def __str__(self) -> str:
        return f"cum-chain:{self.depth}:{self.min_path_prob:g}"


@dataclass(frozen=True)
class ConfidenceDelayed(DraftPolicy):
    """Dynamic delayed expansion: a confident trunk, then ``paths`` i.i.d. paths where confidence drops.

    Along the trunk a fed node gets one child while its own row's top-1 is at least
    ``threshold``; the first node where it drops gets ``paths`` i.i.d. draws (the branch
    point, chosen while drafting where DDTE chose it blind). After the branch each node gets
    as many draws as paths stand on it, while the row its token came from had a top-1 of at
    least ``branch_threshold``. At most ``depth`` tokens per path and ``budget`` draws.
    """

    threshold: float = 0.5
    paths: int = 3
    branch_threshold: float = 0.0

    law: DraftLaw = dataclasses.field(default=DraftLaw.DYNAMIC_IID, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.budget == 0:
            object.__setattr__(self, "budget", self.depth * max(1, self.paths))
        super().__post_init__()
        _check_prob("threshold", self.threshold)
        _check_prob("branch_threshold", self.branch_threshold)
        if not isinstance(self.paths, int) or self.paths < 1:
            raise ValueError(f"ConfidenceDelayed: paths must be an integer >= 1, got {self.paths!r}")

    @property
    def max_width(self) -> int:
        return self.paths

    def feed(self, views: Sequence[NodeView], ctx: PolicyContext, sampler: Sampler) -> list[bool]:  # noqa: ARG002
        return [not v.branched or v.parent_top1 >= self.branch_threshold for v in views]

    def widths(self, views: Sequence[NodeView], ctx: PolicyContext, sampler: Sampler) -> list[int]:  # noqa: ARG002
        out = []
        for v in views:
            if v.branched or v.parent_draws > 1:
                out.append(v.multiplicity)
            elif v.top1 is not None and v.top1 >= self.threshold:
                out.append(1)
            else:
                out.append(self.paths)
        return out

    def __str__(self) -> str:
        extra = f":{self.branch_threshold:g}" if self.branch_threshold else ""
        return f"conf-delayed:{self.depth}:{self.threshold:g}:{self.paths}{extra}"


@dataclass(frozen=True)
class EagleTree(DraftPolicy):
    """EAGLE-2-style growth by cumulative draft probability, under a node budget.

    At each level the ``top_k`` nodes of highest ``path_prob`` among those just drawn are fed
    and get ``width`` children each (i.i.d. draws, or distinct ones without replacement when
    ``without_replacement``), until ``budget`` draws or ``depth`` levels are spent. Unlike
    EAGLE-2 the children are *sampled* from the draft (not its deterministic top-k), which is
    what keeps the tree verifiers lossless at T > 0.
    """

    top_k: int = 4
    width: int = 2
    without_replacement: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.budget < 1:
            raise ValueError(f"EagleTree: budget must be an integer >= 1, got {self.budget!r}")
        for name in ("top_k", "width"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"EagleTree: {name} must be an integer >= 1, got {v!r}")
        law = DraftLaw.DYNAMIC_WOR if self.without_replacement else DraftLaw.DYNAMIC_IID
        object.__setattr__(self, "law", law)

    @property
    def max_width(self) -> int:
        return self.width

    def feed(self, views: Sequence[NodeView], ctx: PolicyContext, sampler: Sampler) -> list[bool]:  # noqa: ARG002
        order = sorted(range(len(views)), key=lambda i: (-views[i].path_prob, i))
        keep = set(order[: self.top_k])
        return [i in keep for i in range(len(views))]

    def widths(self, views: Sequence[NodeView], ctx: PolicyContext, sampler: Sampler) -> list[int]:  # noqa: ARG002
        return [self.width] * len(views)

    def __str__(self) -> str:
        wor = ":wor" if self.without_replacement else ""
        return f"eagle:{self.depth}:{self.budget}:{self.top_k}:{self.width}{wor}"


def acceptance_rows(views: Sequence[NodeView], temperature: float) -> list[tuple[float, ...]]:
    """The acceptance model's input rows for ``views`` (plain tuples, in :data:`ACCEPTANCE_FEATURES` order).

    Computed by :func:`adaptive_spec.formats.nodes.acceptance_row`, as the node log computes them.
    """
    return [
        acceptance_row(v.depth, v.token_prob, v.parent_top1, v.parent_entropy, v.path_prob, temperature) for v in views
    ]


def acceptance_features(views: Sequence[NodeView], temperature: float) -> Any:
    """:func:`acceptance_rows` as a float32 ndarray [n, len(ACCEPTANCE_FEATURES)]."""
    import numpy as np

    return np.array(acceptance_rows(views, temperature), dtype=np.float32).reshape(len(views), -1)


@dataclass(frozen=True)
class LearnedChain(ChainRule):
    """A chain grown by a learned acceptance model and a gain-per-time rule.

    For each drafted node ``v`` the ``predictor`` (draft-side features in, see
    :data:`ACCEPTANCE_FEATURES`) gives two probabilities: ``a_v``, that the verifier accepts
    ``v`` given that its parent was accepted (trained on the soft label ``min(1, p/q)``), and
    ``b_v``, that a child drawn from ``v``'s row would be accepted given ``v`` was
    (trained on ``Σ min(p_v, q_v)``, or at T=0 on whether the draft's argmax is the target's).

    Along the chain it keeps ``P_v = Π a_u`` (the predicted probability that the whole path
    up to ``v`` is accepted) and ``E_v = 1 + Σ P_u`` (expected tokens of the step so far). In
    units of one speculative step's time with no draft, the step so far costs
    ``1 + ρ·depth(v)``; feeding ``v`` costs ``ρ`` more and gains ``P_v·b_v`` expected tokens.
    ``v`` is fed when that gain per added time beats the step's current rate:
    ``P_v·b_v / ρ > E_v / (1 + ρ·depth(v))``.

    The decision uses draft-side facts only, before ``v``'s child is drawn, so the dynamic
    chain verifiers stay lossless (exact test: ``tests/verifiers/test_dynamic_exact.py``).

    Attributes:
        cost_ratio: ρ, one draft level's time over one step's time without drafting.
        predictor: callable, feature rows (:func:`acceptance_rows`) -> one ``(a, b)`` pair of
            probabilities per row (an :class:`~adaptive_spec.planner.acceptance.AcceptanceModel`);
            ``Plan.parse`` attaches the installed model when the text names none.
    """

    cost_ratio: float = 0.12
    predictor: Any = dataclasses.field(default=None, compare=False, hash=False, repr=False)

    def __post_init__(self) -> None:
        super().__post_init__()
        r = self.cost_ratio
        if not isinstance(r, (int, float)) or isinstance(r, bool) or not 0.0 < float(r) < 10.0:
            raise ValueError(f"LearnedChain: cost_ratio must be a number in (0, 10), got {r!r}")

    def feed(self, views: Sequence[NodeView], ctx: PolicyContext, sampler: Sampler) -> list[bool]:  # noqa: ARG002
        if self.predictor is None:
            raise ValueError("learned-chain has no acceptance model; train one: `adaptive-spec selector acceptance`")
        pred = self.predictor(acceptance_rows(views, ctx.temperature))
        rho = float(self.cost_ratio)
        out = []
        for v, (a, b) in zip(views, pred, strict=True):
            path_accept, expected = v.parent_memo if v.parent_memo is not None else (1.0, 1.0)
            path_accept *= a
            expected += path_accept
            v.memo = (path_accept, expected)
            out.append(path_accept * b * (1.0 + rho * v.depth) > rho * expected)
        return out

    def __str__(self) -> str:
        return f"learned-chain:{self.depth}:{self.cost_ratio:g}"


@dataclass(frozen=True)
class LookedChain(ChainRule):
    """``inner``'s chain where it stops within its first ``look`` nodes, else the chain to the depth.

    The law a policy chain decided on the device draws (:func:`adaptive_spec.engine.drafting.draft_chain_on_device`:
    its levels run without waiting for the host, which reads once, after node ``look``): nodes up to the look are
    fed as ``inner`` decides, and once ``inner`` has fed every one of them, every node after them is fed too (the
    chain runs to ``depth``). A draft-side rule like any other: the dynamic chain's verifiers stay lossless for it
    (exact test: ``tests/verifiers/test_dynamic_exact.py``).
    """

    inner: ChainRule | None = None
    look: int = 1

    def __post_init__(self) -> None:
        if not isinstance(self.inner, ChainRule):
            raise ValueError(f"LookedChain: inner must be a chain policy, got {self.inner!r}")
        if not isinstance(self.look, int) or isinstance(self.look, bool) or self.look < 1:
            raise ValueError(f"LookedChain: look must be an integer >= 1, got {self.look!r}")
        super().__post_init__()

    def feed(self, views: Sequence[NodeView], ctx: PolicyContext, sampler: Sampler) -> list[bool]:
        asked = [v.depth <= self.look for v in views]  # nodes past the look are fed without asking
        inner = iter(
            self.inner.feed([v for v, a in zip(views, asked, strict=True) if a], ctx, sampler) if any(asked) else ()
        )
        return [next(inner) if a else True for a in asked]

    def __str__(self) -> str:
        return f"looked({self.inner},{self.look})"


@dataclass(frozen=True)
class LookedDelayed(DraftPolicy):
    """``inner``'s tree where its trunk branches within its first ``look`` nodes, else branched at depth ``look``.

    The law a ``conf-delayed`` tree decided on the device draws (:func:`adaptive_spec.engine.drafting.
    draft_conf_delayed` with ``looked``: the trunk's levels run without waiting for the host, which reads once,
    after ``look`` decisions): along the trunk, ``inner`` decides up to depth ``look - 1``, and a trunk node at depth
    ``look`` gets ``inner.paths`` draws whatever its row. A draft-side rule like any other (exact test:
    ``tests/verifiers/test_dynamic_exact.py``).
    """

    inner: ConfidenceDelayed | None = None
    look: int = 1

    law: DraftLaw = dataclasses.field(default=DraftLaw.DYNAMIC_IID, init=False, repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.inner, ConfidenceDelayed):
            raise ValueError(f"LookedDelayed: inner must be a ConfidenceDelayed policy, got {self.inner!r}")
        if not isinstance(self.look, int) or isinstance(self.look, bool) or self.look < 0:
            raise ValueError(f"LookedDelayed: look must be an integer >= 0, got {self.look!r}")
        if self.budget == 0:
            object.__setattr__(self, "budget", self.inner.budget)
        super().__post_init__()

    @property
    def max_width(self) -> int:
        return self.inner.max_width

    def feed(self, views: Sequence[NodeView], ctx: PolicyContext, sampler: Sampler) -> list[bool]:
        return self.inner.feed(views, ctx, sampler)

    def widths(self, views: Sequence[NodeView], ctx: PolicyContext, sampler: Sampler) -> list[int]:
        out = self.inner.widths(views, ctx, sampler)
        trunk = [not v.branched and v.parent_draws <= 1 and v.depth >= self.look for v in views]
        return [self.inner.paths if at_look else w for w, at_look in zip(out, trunk, strict=True)]

    def __str__(self) -> str:
        return f"looked({self.inner},{self.look})"


def _check_prob(name: str, value: float) -> None:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0.0 <= float(value) <= 1.0:
        raise ValueError(f"drafting policy: {name} must be a probability in [0, 1], got {value!r}")
    if math.isnan(float(value)):
        raise ValueError(f"drafting policy: {name} must not be NaN")


_POLICY_RE = re.compile(r"\s*(conf-chain|cum-chain|conf-delayed|eagle|learned-chain):([^/]*)\s*")
POLICY_GRAMMAR = "conf-chain:D:θ | cum-chain:D:m | conf-delayed:D:θ:K[:θb] | eagle:D:B:k:w[:wor] | learned-chain:D:ρ"


def is_policy_text(text: str) -> bool:
    """Whether ``text`` starts like a drafting-policy spec (rather than a static tree shape)."""
    return bool(_POLICY_RE.fullmatch(text.partition("/")[0]))


def parse_policy(text: str) -> DraftPolicy:
    """Parse a policy spec such as ``conf-chain:12:0.4`` or ``eagle:8:24:4:2:wor`` (colons, so that
    plan lists stay comma-separated).

    Raises:
        ValueError: naming the grammar, when the text does not follow it.
    """
    m = _POLICY_RE.fullmatch(text)
    if not m:
        raise ValueError(f"cannot parse drafting policy {text!r}: expected {POLICY_GRAMMAR}")
    kind, args = m.group(1), [a.strip() for a in m.group(2).split(":") if a.strip()]

    def num(i: int, cast: type) -> Any:
        try:
            return cast(args[i])
        except (IndexError, ValueError):
            raise ValueError(f"drafting policy {text!r}: expected {POLICY_GRAMMAR}") from None

    if kind == "conf-chain" and len(args) == 2:
        return ConfidenceChain(depth=num(0, int), budget=0, threshold=num(1, float))
    if kind == "cum-chain" and len(args) == 2:
        return CumulativeChain(depth=num(0, int), budget=0, min_path_prob=num(1, float))
    if kind == "conf-delayed" and len(args) in (3, 4):
        return ConfidenceDelayed(
            depth=num(0, int),
            budget=0,
            threshold=num(1, float),
            paths=num(2, int),
            branch_threshold=num(3, float) if len(args) == 4 else 0.0,
        )
    if kind == "learned-chain" and len(args) == 2:
        return LearnedChain(depth=num(0, int), budget=0, cost_ratio=num(1, float))
    if kind == "eagle" and len(args) in (4, 5):
        if len(args) == 5 and args[4] not in ("wor", "iid"):
            raise ValueError(f"drafting policy {text!r}: the fifth field of eagle is 'wor' or 'iid'")
        return EagleTree(
            depth=num(0, int),
            budget=num(1, int),
            top_k=num(2, int),
            width=num(3, int),
            without_replacement=len(args) == 5 and args[4] == "wor",
        )
    raise ValueError(f"cannot parse drafting policy {text!r}: expected {POLICY_GRAMMAR}")


def clip_widths(policy: DraftPolicy, views: Sequence[NodeView], widths: Sequence[int], budget_left: int) -> list[int]:
    """The policy's widths made valid: integers in [0, max_width], none past the depth, within the budget.

    The budget is spent in frontier order, so the result is a function of draft-side facts only.
    """
    if len(widths) != len(views):
        raise ValueError(f"{type(policy).__name__}.widths returned {len(widths)} values for {len(views)} nodes")
    cap = 1 if policy.law is DraftLaw.DYNAMIC_CHAIN else policy.max_width
    out = []
    for v, k in zip(views, widths, strict=True):
        try:
            k = operator.index(k)
        except TypeError:
            raise ValueError(f"{type(policy).__name__}.widths must return integers, got {k!r}") from None
        k = max(0, min(k, cap, budget_left)) if v.depth < policy.depth else 0
        budget_left -= k
        out.append(k)
    if policy.law is DraftLaw.DYNAMIC_CHAIN and sum(out) > 1:
        raise ValueError(f"{type(policy).__name__}: a chain policy gave children to more than one node")
    return out
