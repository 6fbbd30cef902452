"""The learned source choice: a small model predicts, per step, what a lookup and what the model draft would earn.

Before each step, :class:`GateFeatures` reads what the planner may see: the committed context,
past steps and the draft's first forward, plus one target-side number, the target's top-1 over
the root token. That row was computed at the previous step's target pass, over tokens already
committed, so it is a function of the committed prefix like everything else the gate reads; it
says nothing about the target's rows over this step's draft. The choice (which tree to draft,
under which law) is therefore fixed before anything is drawn, and every verifier stays exact
(docs/algorithms.md §8). The features:

- the lookup: the n-gram that matched, its number of earlier occurrences, how far back the most
  recent one agrees with the context's end (SAM-Decoding's match length), how many tokens it found;
- the *shadow* acceptance of looked-up tokens: after every step, lookup's proposal is compared with
  the tokens the step committed. The committed tokens follow the target's law, so the chance that
  they agree with a deterministic proposal token by token is the chance that a lookup step
  would have accepted it: an unbiased running rate whichever source was played;
- the draft's confidence at the root (its top-1 probability and entropy), the target's top-1 over
  the root token (from the previous step, as above), the running acceptance of model steps, and
  the temperature.

:class:`SourceGate` maps those features to the expected accepted tokens of the lookup plan and of
the model plan (a two-layer perceptron, in NumPy: the engine never imports a training
framework), and plays the source with the higher expected tokens per second under the step times
measured on this machine when it was trained (``adaptive-spec selector gate``, which collects,
labels, trains and writes the gate file). :class:`GatedSource` is the planner.

A gate may read a subset of the features: one trained without :data:`ROOT_FEATURES` (``selector
gate --no-draft-features``) needs no draft forward before it chooses, so a step it plays with a
lookup or with no draft runs no draft at all (the draft catches up when a model step comes).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from adaptive_spec.planner.plan import Plan, Planner, StepResult, StepState, as_plan
from adaptive_spec.trees import DraftLaw, TreeShape

__all__ = ["GATE_FEATURES", "GATE_VERSION", "ROOT_FEATURES", "GateFeatures", "GatedSource", "SourceGate", "StepCosts"]

GATE_VERSION = 1
GATE_FEATURES = (
    "lookup_ngram",  # length of the n-gram that matched (0: no match)
    "lookup_match_length",  # log(1 + how far back the most recent match agrees)
    "lookup_matches",  # log(1 + earlier occurrences of that n-gram)
    "lookup_found",  # tokens found, as a fraction of the lookup plan's depth
    "shadow_rate",  # running rate at which the committed tokens agreed with lookup's proposals
    "shadow_last",  # the previous step's agreement, as a fraction of the plan's depth
    "model_rate",  # running acceptance rate of model steps (accepted / drafted depth)
    "draft_top1",  # the draft's root top-1 probability
    "draft_entropy",  # the draft's root entropy (nats)
    "target_top1",  # the target's top-1 over the root token
    "temperature",
    "first_step",
)
SHADOW_DECAY = 0.5  # weight of the past in the running rates
# The features read off the step's first draft forward (it costs a draft forward before the choice).
ROOT_FEATURES = ("draft_top1", "draft_entropy", "target_top1")
PLAIN = Plan(TreeShape.chain(0), "block")  # a step that drafts nothing: one target token
_ROOT = ("draft_root_top1", "draft_root_entropy", "target_top1")  # their names in the engine's root features


def _agreement(proposal: list[int], tokens: tuple[int, ...] | list[int]) -> tuple[int, int]:
    """(tokens of ``proposal`` the committed ``tokens`` agree with, how many could be compared)."""
    n = min(len(proposal), len(tokens))
    agree = 0
    while agree < n and proposal[agree] == tokens[agree]:
        agree += 1
    return agree, n


class GateFeatures:
    """The gate's inputs, step by step (:data:`GATE_FEATURES`); call :meth:`vector` then :meth:`observe`.

    Args:
        depth: the lookup plan's depth (the most tokens a lookup step proposes per path).
    """

    def __init__(self, depth: int) -> None:
        self.depth = max(int(depth), 1)
        self.reset()

    def reset(self) -> None:
        """A new generation."""
        self.shadow_rate, self.shadow_last, self.model_rate = 1.0, 0.0, 0.5
        self.proposal: list[int] = []

    def vector(self, state: StepState) -> np.ndarray:
        """The features before ``state``'s step (float32 [len(GATE_FEATURES)]); remembers lookup's proposal."""
        if state.step == 0:
            self.reset()
        self.proposal = list(state.lookup or ())[: self.depth]
        root = state.features or {}
        values = (
            state.lookup_ngram,
            math.log1p(state.lookup_match_length),
            math.log1p(state.lookup_matches),
            len(self.proposal) / self.depth,
            self.shadow_rate,
            self.shadow_last,
            self.model_rate,
            *(float(root.get(name, 0.0)) for name in _ROOT),
            state.temperature,
            1.0 if state.step == 0 else 0.0,
        )
        return np.asarray(values, dtype=np.float32)

    def observe(self, result: StepResult) -> None:
        """Update the running rates with the step's committed tokens."""
        agree, compared = _agreement(self.proposal, result.tokens)
        if compared:
            self.shadow_rate = SHADOW_DECAY * self.shadow_rate + (1 - SHADOW_DECAY) * agree / compared
            self.shadow_last = agree / self.depth
        if result.plan.source == "model" and result.plan.shape.depth > 0:
            rate = min(result.num_accepted, result.plan.shape.depth) / result.plan.shape.depth
            self.model_rate = SHADOW_DECAY * self.model_rate + (1 - SHADOW_DECAY) * rate


@dataclass(frozen=True)
class StepCosts:
    """Step times measured where the gate was trained (seconds).

    ``model_s`` per model step; ``lookup_s + per_token_s * found`` per lookup step that found
    ``found`` tokens on its first path (a trie's other paths are in the fit); ``plain_s`` per step
    that drafts nothing (one target token, as in autoregressive decoding).
    """

    model_s: float
    lookup_s: float
    per_token_s: float
    plain_s: float

    def lookup(self, found: int) -> float:
        return self.lookup_s + self.per_token_s * found


class SourceGate:
    """A trained gate (the file ``adaptive-spec selector gate`` writes): features -> expected accepted tokens.

    Args:
        data: the gate file's contents (see :meth:`to_dict`).
    """

    def __init__(self, data: dict[str, Any]) -> None:
        features = tuple(data.get("features", ()))
        known = all(f in GATE_FEATURES for f in features)
        known = known and list(features) == sorted(features, key=GATE_FEATURES.index)
        if data.get("version") != GATE_VERSION or not features or not known or len(set(features)) < len(features):
            raise ValueError(
                f"this source gate was written for gate version {data.get('version')} with other features; "
                f"retrain it with `adaptive-spec selector gate` (version {GATE_VERSION})"
            )
        self.data = data
        self.features = features
        self.columns = np.asarray([GATE_FEATURES.index(f) for f in features])  # its columns of the full vector
        #: Whether it reads the step's first draft forward (:data:`ROOT_FEATURES`).
        self.uses_root = any(f in ROOT_FEATURES for f in features)
        self.path: Path | None = None
        self.model_plan = as_plan(data["model_plan"])
        self.lookup_plan = as_plan(data["lookup_plan"])
        self.mean = np.asarray(data["mean"], dtype=np.float32)
        self.scale = np.asarray(data["scale"], dtype=np.float32)
        self.layers = [(np.asarray(w, dtype=np.float32), np.asarray(b, dtype=np.float32)) for w, b in data["layers"]]
        self.costs = StepCosts(**data["costs"])
        self.depths = np.asarray([self.lookup_plan.shape.depth, self.model_plan.shape.depth], dtype=np.float32)

    @classmethod
    def load(cls, path: str | Path) -> SourceGate:
        """Read a gate file (JSON), with a clear error for a missing or malformed one."""
        path = Path(path)
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ValueError(f"no source gate file {path}; write one with `adaptive-spec selector gate`") from None
        except (OSError, json.JSONDecodeError) as err:
            raise ValueError(f"{path} is not a source gate file ({err})") from None
        if not isinstance(data, dict):
            raise ValueError(f"{path} is not a source gate file")
        try:
            gate = cls(data)
        except (KeyError, TypeError) as err:
            raise ValueError(f"{path} is not a complete source gate file (missing {err})") from None
        gate.path = path
        return gate

    def predict(self, x: np.ndarray) -> np.ndarray:
        """Expected accepted tokens ``[lookup, model]`` for full feature rows ``x`` ([..., F]) -> [..., 2]."""
        h = (np.asarray(x, dtype=np.float32)[..., self.columns] - self.mean) / self.scale
        for i, (w, b) in enumerate(self.layers):
            h = h @ w.T + b
            if i < len(self.layers) - 1:
                h = np.maximum(h, 0.0)
        return self.depths / (1.0 + np.exp(-h))

    def to_dict(self) -> dict[str, Any]:
        return dict(self.data)


class GatedSource(Planner):
    """Per step, the source with the most predicted tokens per second: the lookup plan, the model plan, or none.

    A step with no draft (one target token, as autoregressive decoding) is chosen where neither
    source is predicted to pay for its longer target pass: on hardware where scoring a few tokens
    costs much more than one, a weak draft loses to plain decoding.

    Args:
        gate: a :class:`SourceGate` (or the path of its file).
        margin: lookup is played when its predicted tokens per second exceed the model's times this.

    The string form is ``source:<model plan>+<lookup plan>?gate=<file>[&margin=M]``
    (:func:`adaptive_spec.planner.sources.parse_source_rule`); the plans must be the gate's.
    """

    needs_lookup = True
    needs_features = True

    def __init__(self, gate: SourceGate | str | Path, margin: float = 1.0) -> None:
        self.gate = gate if isinstance(gate, SourceGate) else SourceGate.load(gate)
        if not (isinstance(margin, (int, float)) and margin > 0 and math.isfinite(margin)):
            raise ValueError(f"the gate's margin must be a positive number, got {margin!r}")
        self.margin = float(margin)
        self.needs_features = self.gate.uses_root  # no draft forward before the choice when it reads none
        self.model, self.lookup = self.gate.model_plan, self.gate.lookup_plan
        self.tracker = GateFeatures(self.lookup.shape.depth)

    def choose(self, state: StepState) -> Plan:
        x = self.tracker.vector(state)
        found = len(self.tracker.proposal)
        lookup_e, model_e = self.gate.predict(x)
        if self.lookup.shape.law is not DraftLaw.DETERMINISTIC:  # a chain is cut to the tokens found
            lookup_e = min(lookup_e, found)
        costs = self.gate.costs
        model_rate = (1.0 + model_e) / costs.model_s
        best, plan = max((model_rate, self.model), (1.0 / costs.plain_s, PLAIN), key=lambda c: c[0])
        if found and (1.0 + lookup_e) / costs.lookup(found) > self.margin * best:
            return self.lookup.for_found(found)
        return plan

    def observe(self, result: StepResult) -> None:
        self.tracker.observe(result)

    def __str__(self) -> str:
        path = self.gate.path or "<in memory>"
        margin = "" if self.margin == 1.0 else f"&margin={self.margin:g}"
        return f"source:{self.model}+{self.lookup}?gate={path}{margin}"
