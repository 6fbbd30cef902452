"""Plans (tree shape + verifier) and the planner protocol.

A :class:`Plan` says how one speculative step drafts and verifies. Text form::

    <tree shape>/<verifier>        e.g.  "delayed:2x3x3/traversal", "chain:4/block", "wor:3x2x1/rrsw"
    lookup:L/<verifier>            e.g.  "lookup:8/block": a chain of up to L tokens found in the context
    lookup:WxL/<verifier>          e.g.  "lookup:3x8/nss": a trie of up to W distinct continuations found there
    lookup:WxL+K/<verifier>        e.g.  "lookup:3x8+2/nss": and K more found in the engine's datastore (a corpus)
    lookup:WxL[+K]+mD/<verifier>   e.g.  "lookup:3x8+2+m3/nss": and the draft model's greedy chain of D <= L tokens
    lookup:WxL[+K]+mAxD/<verifier> e.g.  "lookup:3x8+2+m3x3/nss": and the draft's top A tokens at the root, the first
                                         continued to its greedy chain of D
    hybrid:A:B/<verifier>          e.g.  "hybrid:6:2/block": up to A looked-up tokens, then B drafted by the model

where ``<tree shape>`` is anything :meth:`TreeShape.parse` accepts (``chain:L``, ``iid:KxL``,
``delayed:TxKxB``, ``wor:W1xW2x...``) and ``<verifier>`` a name in
:data:`adaptive_spec.verifiers.VERIFIER_NAMES`. Omitting ``/<verifier>`` means ``traversal``,
which is lossless for every drafting law.

A *planner* (:class:`Planner`) declares every hook the engine calls: ``choose(state)`` before
each step, ``observe(result)`` after it, the feature needs (``needs_features``, ``needs_hidden``,
``needs_features_for(T, top_p)``) and the propensity of its latest choice
(``last_propensity``, for off-policy estimates). A planner that needs root features gets them
(:mod:`adaptive_spec.formats.features`) in ``StepState.features``, and one that needs hidden
states also gets the models' last hidden states. :func:`as_planner` turns what
``generate(plan=...)`` accepts into a planner: a :class:`Planner`, an object with ``choose``
(wrapped, its optional hooks read once), a plan or plan string (:class:`StaticPlanner`), or
``"autoregressive"``/None (no planner: plain decoding with the target).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from adaptive_spec.trees import DraftLaw, DraftPolicy, TreeShape
from adaptive_spec.trees.policy import POLICY_GRAMMAR, LearnedChain, is_policy_text, parse_policy
from adaptive_spec.verifiers import check_compatible, get_verifier

__all__ = [
    "AUTOREGRESSIVE",
    "DEFAULT_VERIFIER",
    "Plan",
    "Planner",
    "StaticPlanner",
    "StepResult",
    "StepState",
    "as_plan",
    "as_planner",
    "truncate_shape",
]

DEFAULT_VERIFIER = "traversal"
SOURCES = ("model", "lookup", "hybrid")  # where a plan's draft comes from
# The most nodes a plan's tree may have (root included): the target scores every node in one
# pass with an N x N attention mask, so a larger tree is refused before anything is allocated.
MAX_TREE_NODES = 4096


@dataclass(frozen=True)
class Plan:
    """One speculative step's recipe: a tree shape (or a drafting policy) and the verifier that checks it.

    Attributes:
        shape: the draft tree shape (and so the drafting law); for a policy, its envelope
            (``policy.shape``: a dynamic law, the depth and the node budget).
        verifier: a registered verifier name that is lossless for ``shape.law``. It is fixed
            before drafting, also when a policy grows the tree.
        allow_lossy: permit a verifier registered as lossy (``hsd``); off by default.
        policy: the drafting policy that grows the tree level by level, or None for a static shape.
        source: where the draft comes from: ``"model"`` (the draft model or head), ``"lookup"``
            (an n-gram match in the context, :mod:`adaptive_spec.trees.lookup`: a chain of up to
            ``shape.depth`` tokens with one-hot rows, or a trie of ``shape.paths`` continuations, no
            draft forward) or ``"hybrid"`` (up to
            ``lookup_depth`` looked-up tokens, then the model drafts the rest of the chain).
        lookup_depth: a hybrid plan's most looked-up tokens (0 for the other sources).
        corpus_paths: a lookup plan's continuations found in the engine's datastore
            (:mod:`adaptive_spec.trees.datastore`), among the shape's ``paths``; the other
            ``shape.paths - corpus_paths`` are found in the context (0: the context alone).
        model_depth: a lookup trie's branch drafted by the draft model: its greedy chain (each token the argmax
            of the draft's row, at any temperature) of this many tokens joins the trie as one more of the shape's
            ``paths`` (0: none). Still a function of the context, so NSS and greedy verification stay exact.
        model_width: with ``model_depth``, the draft's top ``model_width`` tokens at the root: the first starts the
            greedy chain, the others are one-token paths beside it (``lookup:WxL+mAxD``; 1: the chain alone).

    Raises:
        ValueError: unknown verifier, or a verifier that cannot verify the shape's law
            (an ``IncompatibleTreeError``, which lists the verifiers that can).
    """

    shape: TreeShape
    verifier: str = DEFAULT_VERIFIER
    allow_lossy: bool = False
    policy: DraftPolicy | None = None
    source: str = "model"
    lookup_depth: int = 0
    corpus_paths: int = 0
    model_depth: int = 0
    model_width: int = 1

    def __post_init__(self) -> None:
        if self.source not in SOURCES:
            raise ValueError(f"Plan.source must be one of {SOURCES}, got {self.source!r}")
        trie = isinstance(self.shape, TreeShape) and self.shape.law is DraftLaw.DETERMINISTIC
        if trie and self.source != "lookup":
            raise ValueError("a deterministic trie is found in the context: write lookup:WxL/nss")
        if self.source != "model" and (self.policy is not None or (self.shape.law is not DraftLaw.CHAIN and not trie)):
            raise ValueError(
                "a lookup or hybrid plan drafts a chain (lookup:L/<verifier>, hybrid:A:B/<verifier>) or a lookup "
                "trie (lookup:WxL/nss)"
            )
        hybrid = self.source == "hybrid"
        if hybrid != (self.lookup_depth > 0) or (hybrid and not 0 < self.lookup_depth < self.shape.depth):
            raise ValueError(
                "a hybrid plan looks up 1 <= A tokens and then drafts B >= 1 with the model (hybrid:A:B); "
                "lookup_depth is for hybrid plans only"
            )
        if self.corpus_paths and (
            self.source != "lookup"
            or self.shape.law is not DraftLaw.DETERMINISTIC
            or self.corpus_paths > self.shape.paths
        ):
            raise ValueError(
                "corpus_paths is for lookup tries: lookup:WxL+K/nss finds W continuations in the context and K in the "
                "datastore (W >= 0, K >= 1)"
            )
        if (  # first: the check of model_depth below adds it
            not isinstance(self.model_width, int)
            or self.model_width < 1
            or (self.model_width > 1 and not self.model_depth)
        ):
            raise ValueError(
                "model_width is the draft's top A >= 1 tokens at the root of a lookup trie with its greedy chain "
                "(lookup:WxL+mAxD/nss)"
            )
        if self.model_depth and (
            self.source != "lookup"
            or self.shape.law is not DraftLaw.DETERMINISTIC
            or not 1 <= self.model_depth <= self.shape.depth
            or self.corpus_paths + self.model_width > self.shape.paths
        ):
            raise ValueError(
                "model_depth is for lookup tries: lookup:WxL+mD/nss adds the draft model's greedy chain of 1 <= D <= L "
                "tokens to the W continuations found in the context (and K in the datastore: lookup:WxL+K+mD)"
            )
        if isinstance(self.shape, DraftPolicy) and self.policy is None:  # Plan(policy, verifier)
            object.__setattr__(self, "policy", self.shape)
            object.__setattr__(self, "shape", self.shape.shape)
        if self.policy is not None:
            if not isinstance(self.policy, DraftPolicy):
                raise ValueError(f"Plan.policy must be a DraftPolicy, got {type(self.policy).__name__}")
            object.__setattr__(self, "shape", self.policy.shape)
        if not isinstance(self.shape, TreeShape):
            raise ValueError(f"Plan.shape must be a TreeShape, got {type(self.shape).__name__}")
        if self.shape.max_nodes > MAX_TREE_NODES:
            raise ValueError(
                f"tree {self.shape} has up to {self.shape.max_nodes} nodes, more than the limit of {MAX_TREE_NODES} "
                "(the target scores every node in one pass); choose a smaller tree"
            )
        spec = get_verifier(self.verifier)
        if not spec.greedy_only:
            check_compatible(self.verifier, self.shape.law, allow_lossy=self.allow_lossy)

    @classmethod
    def parse(cls, text: str) -> Plan:
        """Parse ``"<tree shape>/<verifier>"`` (the verifier part is optional)."""
        if not isinstance(text, str):
            raise ValueError(f"a plan string is expected, got {type(text).__name__}")
        shape_text, sep, verifier = text.partition("/")
        verifier = verifier.strip() if sep else DEFAULT_VERIFIER
        if sep and not verifier:
            raise ValueError(f"plan {text!r}: missing verifier name after '/'")
        kind, colon, size = shape_text.strip().partition(":")
        if kind == "lookup":
            size, *extra = size.split("+")
            model = extra.pop() if extra and extra[-1].startswith("m") else ""
            k = extra[0] if len(extra) == 1 else ""
            width, by, model_depth = model[1:].rpartition("x")
            width = width if by else "1"
            w, x, length = size.rpartition("x")
            ok = (
                colon
                and len(extra) <= 1
                and length.isdigit()
                and int(length) >= 1
                and (not x or (w.isdigit() and int(w) >= 1 - bool(extra or model)))
                and (not extra or (k.isdigit() and int(k) >= 1))
                and (not model or (model_depth.isdigit() and 1 <= int(model_depth) <= int(length)))
                and width.isdigit()
                and int(width) >= 1
            )
            if not ok:
                raise ValueError(
                    f"plan {text!r}: a lookup plan is lookup:L (a chain of L >= 1 tokens, e.g. 'lookup:8/block'), "
                    "lookup:WxL (a trie of up to W continuations, e.g. 'lookup:3x8/nss'), lookup:WxL+K (and K "
                    "more found in the datastore, e.g. 'lookup:3x8+2/nss'), with +mD for the draft model's greedy "
                    "chain of 1 <= D <= L tokens (e.g. 'lookup:3x8+2+m3/nss') or +mAxD for its top A tokens at the "
                    "root, the first continued to D (e.g. 'lookup:3x8+2+m3x3/nss')"
                )
            corpus = int(k) if extra else 0
            depth = int(model_depth) if model else 0
            paths = (int(w) if x else 1) + corpus + (int(width) if depth else 0)
            trie = corpus or depth
            shape = _corpus_trie(paths, int(length)) if trie else TreeShape.lookup(paths, int(length))
            if shape.law is DraftLaw.DETERMINISTIC and not sep:
                verifier = "nss"  # the default traversal reads draft rows a trie does not have
            return cls(shape, verifier, source="lookup", corpus_paths=corpus, model_depth=depth, model_width=int(width))
        if kind == "hybrid":
            a, _, b = size.partition(":")
            if not (a.isdigit() and b.isdigit() and int(a) >= 1 and int(b) >= 1):
                raise ValueError(
                    f"plan {text!r}: a hybrid plan is hybrid:A:B, A >= 1 looked-up tokens then B >= 1 drafted by "
                    "the model, e.g. 'hybrid:6:2/block'"
                )
            return cls(TreeShape.chain(int(a) + int(b)), verifier, source="hybrid", lookup_depth=int(a))
        if is_policy_text(shape_text):
            policy = parse_policy(shape_text)
            if isinstance(policy, LearnedChain) and policy.predictor is None:  # the installed acceptance model
                from adaptive_spec.planner.acceptance import LazyAcceptanceModel

                policy = dataclasses.replace(policy, predictor=LazyAcceptanceModel())
            return cls(policy.shape, verifier, policy=policy)
        try:
            shape = TreeShape.parse(shape_text)
        except ValueError as e:
            raise ValueError(f"{e}; or a drafting policy: {POLICY_GRAMMAR}") from None
        return cls(shape, verifier)

    @property
    def runs_draft(self) -> bool:
        """Whether a step of this plan runs the draft model: every source but a lookup without the draft's path
        (``lookup:WxL+mD`` runs it), which leaves the draft's pending tokens to the next step that does.
        """
        return self.source != "lookup" or self.model_depth > 0

    @property
    def dynamic(self) -> bool:
        """Whether a drafting policy grows the tree while drafting."""
        return self.policy is not None

    def __str__(self) -> str:
        if self.source == "lookup":
            model_paths = self.model_width if self.model_depth else 0
            context_paths = self.shape.paths - self.corpus_paths - model_paths
            paths = f"{context_paths}x" if self.shape.law is DraftLaw.DETERMINISTIC else ""
            corpus = f"+{self.corpus_paths}" if self.corpus_paths else ""
            width = f"{self.model_width}x" if self.model_width > 1 else ""
            model = f"+m{width}{self.model_depth}" if self.model_depth else ""
            return f"lookup:{paths}{self.shape.depth}{corpus}{model}/{self.verifier}"
        if self.source == "hybrid":
            return f"hybrid:{self.lookup_depth}:{self.shape.depth - self.lookup_depth}/{self.verifier}"
        return f"{self.policy if self.policy is not None else self.shape}/{self.verifier}"

    def for_found(self, found: int) -> Plan:
        """A lookup or hybrid plan as played when the context lookup ``found`` tokens (``found`` >= 1).

        A chain is cut to the tokens found; a trie is kept (its other candidates may be longer); a
        hybrid looks up at most ``found`` tokens, then drafts its model tokens.
        """
        if self.source == "hybrid":
            a = min(found, self.lookup_depth)
            depth = a + self.shape.depth - self.lookup_depth
            return Plan(TreeShape.chain(depth), self.verifier, self.allow_lossy, source="hybrid", lookup_depth=a)
        if self.shape.law is DraftLaw.DETERMINISTIC:
            return self
        return self.truncated(found)

    def truncated(self, max_depth: int) -> Plan:
        """The same plan with the tree cut to depth ``max_depth`` (for the last tokens of a budget)."""
        if self.shape.depth <= max_depth:
            return self
        if self.policy is not None:
            return Plan(self.shape, self.verifier, self.allow_lossy, policy=self.policy.truncated(max_depth))
        if self.source == "hybrid":  # keep at least one model token; below two tokens, a model chain
            if max_depth < 2:
                return Plan(truncate_shape(self.shape, max_depth), self.verifier, self.allow_lossy)
            a = min(self.lookup_depth, max_depth - 1)
            return Plan(TreeShape.chain(max_depth), self.verifier, self.allow_lossy, source="hybrid", lookup_depth=a)
        corpus = self.corpus_paths if max_depth > 0 else 0
        model = min(self.model_depth, max_depth)
        width = self.model_width if model else 1
        paths = self.shape.paths - (self.model_width - width)  # a cut to depth 0 drops the draft's other top tokens
        trie = corpus or model
        shape = _corpus_trie(paths, max_depth) if trie else truncate_shape(self.shape, max_depth)
        kw = {"corpus_paths": corpus, "model_depth": model, "model_width": width}
        return Plan(shape, self.verifier, self.allow_lossy, source=self.source, **kw)


def _corpus_trie(paths: int, length: int) -> TreeShape:
    """The shape of a corpus lookup plan (``lookup:WxL+K``): a trie of up to ``paths`` continuations, even of one
    (``lookup:0xL+1``; ``TreeShape.lookup`` makes one path a chain).
    """
    return TreeShape(DraftLaw.DETERMINISTIC, trunk=0, paths=paths, branch_len=length)


def truncate_shape(shape: TreeShape, max_depth: int) -> TreeShape:
    """``shape`` with every path cut to at most ``max_depth`` tokens (canonical constructors)."""
    return shape.truncated(max_depth)


def as_plan(plan: Plan | str | TreeShape | DraftPolicy) -> Plan:
    """Coerce a :class:`Plan`, plan string, bare :class:`TreeShape` or drafting policy (verified by traversal)."""
    if isinstance(plan, Plan):
        return plan
    if isinstance(plan, DraftPolicy):
        return Plan(plan.shape, policy=plan)
    if isinstance(plan, str):
        return Plan.parse(plan)
    if isinstance(plan, TreeShape):
        return Plan(plan)
    raise ValueError(
        f"plan must be None, a Plan, a plan string like 'delayed:2x3x3/traversal', or a planner with "
        f"choose(state); got {type(plan).__name__}"
    )


@dataclass(frozen=True)
class StepState:
    """What a planner sees before a step.

    Attributes:
        step: index of the step about to run (0 for the first).
        context_length: committed tokens so far (prompt + generated).
        generated: tokens generated so far.
        remaining: tokens still allowed (budget and context window).
        temperature: the sampling temperature (0 = greedy).
        last: the previous step's result, or None before the first step.
        features: the root features by schema name (:data:`adaptive_spec.formats.features.SCHEMA`),
            or None when neither the planner (``needs_features``) nor a feature log asked for them.
        draft_hidden: the draft's last hidden state at the root (1-D float tensor), or None.
        target_hidden: the target's last hidden state over the root token (1-D float tensor), or None.
        top_p: the nucleus mass of the sampling settings (1.0 = off).
        lookup: what an n-gram lookup in the context proposes now (:mod:`adaptive_spec.trees.lookup`),
            when the planner sets ``needs_lookup``; else None.
        lookup_ngram: the length of the n-gram that matched (0: none).
        lookup_matches: how many earlier occurrences that n-gram has.
        lookup_match_length: how far back its most recent occurrence agrees with the context's end.
    """

    step: int
    context_length: int
    generated: int
    remaining: int
    temperature: float
    last: StepResult | None = None
    features: Mapping[str, float] | None = None
    draft_hidden: Any = None
    target_hidden: Any = None
    top_p: float = 1.0
    lookup: Sequence[int] | None = None
    lookup_ngram: int = 0
    lookup_matches: int = 0
    lookup_match_length: int = 0


@dataclass(frozen=True)
class StepResult:
    """What one speculative step did (passed to ``planner.observe``).

    Attributes:
        plan: the plan that was run (after any truncation to the budget).
        num_nodes: draft tree size, root included.
        num_accepted: accepted draft tokens (τ).
        tokens: emitted tokens (accepted + recovered/bonus), before any EOS/budget cut.
        bonus: whether the last token was a bonus token.
        times: seconds per phase for this step (``draft``, ``target``, ``verify``, ``other``).
    """

    plan: Plan
    num_nodes: int
    num_accepted: int
    tokens: tuple[int, ...]
    bonus: bool
    times: dict[str, float] = field(default_factory=dict)


class Planner:
    """Base class of planners: every hook the engine calls, with its default.

    Attributes:
        needs_features: the engine computes the step's root features for :meth:`choose`.
        needs_hidden: it also passes the models' last hidden states.
        needs_lookup: it also passes what an n-gram lookup in the context proposes.
        last_propensity: the probability with which the latest plan was chosen (None: not random).
    """

    needs_features: bool = False
    needs_hidden: bool = False
    needs_lookup: bool = False
    last_propensity: float | None = None

    def choose(self, state: StepState) -> Plan | str:
        """Return the plan for the coming step."""
        raise NotImplementedError

    def observe(self, result: StepResult) -> None:  # noqa: ARG002
        """See the step's outcome (default: nothing)."""
        return None

    def needs_features_for(self, temperature: float, top_p: float = 1.0) -> bool:  # noqa: ARG002
        """Whether the features are needed at these sampling settings (default: :attr:`needs_features`)."""
        return self.needs_features


class StaticPlanner(Planner):
    """The same plan at every step (the fixed-plan baseline)."""

    def __init__(self, plan: Plan | str) -> None:
        self.plan = as_plan(plan)

    def choose(self, state: StepState) -> Plan:  # noqa: ARG002
        return self.plan


class _DuckPlanner(Planner):
    """An object with ``choose`` (and maybe other hooks), seen through the declared :class:`Planner` hooks."""

    def __init__(self, obj: Any) -> None:
        self.obj = obj
        self.choose = obj.choose
        self.observe = getattr(obj, "observe", None) or super().observe
        self.needs_features = bool(getattr(obj, "needs_features", False))
        self.needs_hidden = bool(getattr(obj, "needs_hidden", False))
        self.needs_lookup = bool(getattr(obj, "needs_lookup", False))
        per_setting = getattr(obj, "needs_features_for", None)
        if per_setting is not None:
            self.needs_features_for = per_setting

    @property
    def last_propensity(self) -> float | None:  # type: ignore[override]
        return getattr(self.obj, "last_propensity", None)


AUTOREGRESSIVE = "autoregressive"  # the explicit plan of plain decoding with the target (None means the same)


def as_planner(plan: Any) -> Planner | None:
    """The planner for ``generate(plan=...)``: None for ``"autoregressive"``/None (plain decoding).

    Raises:
        ValueError: a static plan that drafts no token (``chain:0``, ``iid:3x0``): ask for
            ``"autoregressive"`` instead.
    """
    if plan is None or (isinstance(plan, str) and plan.strip() == AUTOREGRESSIVE):
        return None
    if isinstance(plan, str) and plan.strip().startswith("source:"):  # the per-step source rule
        from adaptive_spec.planner.sources import parse_source_rule

        return parse_source_rule(plan.strip())
    if isinstance(plan, Planner):
        return plan
    if hasattr(plan, "choose"):
        return _DuckPlanner(plan)
    static = as_plan(plan)
    if static.shape.depth == 0:  # chain:0, iid:3x0, ...: a planner may choose it for one step, a user means AR
        raise ValueError(
            f"plan {str(plan)!r} drafts no token; use plan='autoregressive' (or None) for decoding without speculation"
        )
    return StaticPlanner(static)
