"""Choosing the draft source per step: a looked-up run from the context, or the draft model.

A lookup step (:mod:`adaptive_spec.trees.lookup`) costs no draft forward, and pays off where the
text copies its context (summaries, answers from retrieved passages, code edits); elsewhere it
proposes nothing the target accepts. :class:`SourceRule` is the rule-based baseline of the
per-step choice: look up when the context's last n-gram recurs (with at least ``min_ngram``
tokens) and looked-up tokens have recently been accepted; else play the model plan.

The choice reads only the context and past steps (and, for the learned gate, the draft's first
forward and the target's row over the root token, computed at the previous step: all functions
of the committed prefix), and each plan is verified by its own exact verifier, so every mix of
sources is lossless (docs/algorithms.md §8).

Plan strings: ``source:<model plan>[+<lookup plan>][?min_ngram=N&min_rate=R&decay=D]``, e.g.
``source:chain:2/block``, ``source:chain:2/block+lookup:3x8/nss`` or
``source:conf-chain:6:0.3/block+hybrid:8:2/block?min_rate=0.2``; :func:`parse_source_rule` reads
them, and ``adaptive-spec tune sources`` searches them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from adaptive_spec.planner.gate import GatedSource
from adaptive_spec.planner.plan import Plan, Planner, StepResult, StepState, as_plan
from adaptive_spec.trees.lookup import MAX_NGRAM

SOURCE_PREFIX = "source:"
DEFAULT_LOOKUP = "lookup:8/block"


class SourceRule(Planner):
    """Lookup when the context's last n-gram recurs and lookups have been accepted lately, else the model plan.

    Args:
        model: the plan (or planner) of model steps.
        lookup: the plan of lookup steps: a chain (``lookup:L/<verifier>``, cut to the tokens found),
            a trie of several continuations (``lookup:WxL/nss``) or a hybrid (``hybrid:A:B/<verifier>``:
            the run found, up to A tokens, extended by B model tokens).
        min_ngram: the shortest recurring n-gram that triggers a lookup (1 looks up after any repeated token;
            at most :data:`~adaptive_spec.trees.lookup.MAX_NGRAM`, the longest n-gram a lookup matches).
        min_rate: a lookup step is tried while the running acceptance rate of looked-up tokens is at least this.
        decay: weight of the past in that running rate (it starts at 1 with every generation).

    Attributes:
        needs_lookup: the engine fills :attr:`StepState.lookup` and :attr:`StepState.lookup_ngram`.
    """

    needs_lookup = True

    def __init__(
        self,
        model: Plan | str | Planner,
        lookup: Plan | str = DEFAULT_LOOKUP,
        min_ngram: int = 2,
        min_rate: float = 0.3,
        decay: float = 0.5,
    ) -> None:
        if not (isinstance(min_ngram, int) and 1 <= min_ngram <= MAX_NGRAM and 0 <= min_rate <= 1 and 0 <= decay < 1):
            raise ValueError(
                f"source rule: min_ngram must be an integer from 1 to {MAX_NGRAM} (lookups match n-grams of at "
                f"most {MAX_NGRAM} tokens), min_rate in [0, 1] and decay in [0, 1); got "
                f"{min_ngram!r}, {min_rate!r}, {decay!r}"
            )
        self.model = model if isinstance(model, Planner) else as_plan(model)
        self.lookup = as_plan(lookup)
        if self.lookup.source == "model":
            raise ValueError(f"the rule's lookup plan must be lookup:... or hybrid:..., got {self.lookup}")
        self.min_ngram, self.min_rate, self.decay = min_ngram, min_rate, decay
        self.rate = 1.0
        self.needs_features = getattr(self.model, "needs_features", False)
        self.needs_hidden = getattr(self.model, "needs_hidden", False)

    def choose(self, state: StepState) -> Plan:
        """The lookup plan when the rule says so, else the model's."""
        if state.step == 0:
            self.rate = 1.0  # a new generation
        found = len(state.lookup or ())
        if found and state.lookup_ngram >= self.min_ngram and self.rate >= self.min_rate:
            return self.lookup.for_found(found)
        return as_plan(self.model.choose(state)) if isinstance(self.model, Planner) else self.model

    def observe(self, result: StepResult) -> None:
        """Update the running acceptance rate of looked-up tokens; pass model steps on to a model planner."""
        if result.plan.source != "model":
            looked = result.plan.lookup_depth or max(result.plan.shape.depth, 1)  # hybrid: its looked-up part
            rate = min(result.num_accepted, looked) / looked
            self.rate = self.decay * self.rate + (1 - self.decay) * rate
        elif isinstance(self.model, Planner):
            self.model.observe(result)

    def needs_features_for(self, temperature: float, top_p: float = 1.0) -> bool:
        """The model planner's need for features at these settings."""
        if isinstance(self.model, Planner):
            return self.model.needs_features_for(temperature, top_p)
        return False

    def __str__(self) -> str:
        lookup = "" if str(self.lookup) == DEFAULT_LOOKUP else f"+{self.lookup}"
        options = "&".join(f"{k}={getattr(self, k):g}" for k, v in _DEFAULTS.items() if getattr(self, k) != v)
        return f"{SOURCE_PREFIX}{self.model}{lookup}{'?' + options if options else ''}"


RULE_OPTIONS = {"min_ngram": int, "min_rate": float, "decay": float}
_DEFAULTS = {"min_ngram": 2, "min_rate": 0.3, "decay": 0.5}


def parse_source_rule(text: str, base_dir: str | Path | None = None, **kwargs: Any) -> SourceRule | GatedSource:
    """``source:<model plan>[+<lookup plan>][?min_ngram=N&min_rate=R&decay=D]`` as a :class:`SourceRule`.

    The lookup plan defaults to ``lookup:8/block``; e.g. ``source:chain:2/block+lookup:3x8/nss``
    or ``source:chain:2/block+hybrid:8:2/block?min_ngram=1&min_rate=0.2``. ``kwargs`` go to the rule.

    With ``gate=FILE`` (and optionally ``margin=M``) it is the learned choice instead, a
    :class:`~adaptive_spec.planner.gate.GatedSource` whose model and lookup plans must be the
    gate's: ``source:chain:1/block+lookup:3x8/nss?gate=source_gate.json``. A relative ``FILE`` is
    looked for in ``base_dir`` (the folder of the plan file that names it), then in the working directory.

    Raises:
        ValueError: not a ``source:`` string, a malformed model or lookup plan, or an unknown option.
    """
    if not text.startswith(SOURCE_PREFIX):
        raise ValueError(
            f"{text!r} is not a source rule; write source:<model plan>[+<lookup plan>], e.g. source:chain:2/block"
        )
    body, _, query = text[len(SOURCE_PREFIX) :].partition("?")
    if "gate=" in query:
        return _parse_gated(text, body, query, base_dir)
    for item in filter(None, query.split("&")):
        key, eq, value = item.partition("=")
        if key not in RULE_OPTIONS or not eq:
            raise ValueError(f"{text!r}: unknown rule option {item!r}; options: {', '.join(RULE_OPTIONS)} (k=v&k=v)")
        try:
            kwargs[key] = RULE_OPTIONS[key](value)
        except ValueError:
            raise ValueError(f"{text!r}: {key} must be a number, got {value!r}") from None
    model_text, plus, lookup_text = body.partition("+")
    model = as_plan(model_text)
    if model.source != "model":
        raise ValueError(f"{text!r}: the rule's model plan must draft from the model, not {model.source}")
    if plus:
        kwargs["lookup"] = lookup_text
    return SourceRule(model, **kwargs)


def _parse_gated(text: str, body: str, query: str, base_dir: str | Path | None) -> GatedSource:
    options = dict(item.partition("=")[::2] for item in filter(None, query.split("&")))
    unknown = sorted(set(options) - {"gate", "margin"})
    if unknown:
        raise ValueError(f"{text!r}: a gated source takes gate=FILE and margin=M only, not {', '.join(unknown)}")
    path = Path(options["gate"])
    if not path.is_absolute() and base_dir is not None and (Path(base_dir) / path).is_file():
        path = Path(base_dir) / path
    try:
        margin = float(options.get("margin", 1.0))
    except ValueError:
        raise ValueError(f"{text!r}: margin must be a number, got {options['margin']!r}") from None
    planner = GatedSource(path, margin)
    model_text, plus, lookup_text = body.partition("+")
    if as_plan(model_text) != planner.model or (plus and as_plan(lookup_text) != planner.lookup):
        raise ValueError(
            f"{text!r}: the gate {path} was trained for source:{planner.model}+{planner.lookup}; "
            "name those plans, or train a gate for these with `adaptive-spec selector gate`"
        )
    return planner
