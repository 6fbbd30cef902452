"""The latency model: the predicted wall time of one speculative step for any action.

A *latency profile* (JSON, written by ``adaptive-spec profile``, see
:mod:`adaptive_spec.bench.profile`) holds, for one draft/target pair on one device:

* ``draft_ms[c][t]`` and ``target_ms[c][t]``: median milliseconds of one block forward of
  ``tokens[t]`` tokens over a KV cache holding ``contexts[c]`` rows (the engine's own
  ``ModelRunner.block_forward`` under a tree mask);
* ``verify_ms[verifier][law]``: median milliseconds of one ``verify`` call against tree size
  (``nodes``), measured on synthetic trees at the models' vocabulary size;
* ``overhead``: per-step engine bookkeeping outside the forwards and the verifier (tensor
  set-up, turning logits into probabilities, sampling, cache commits, Python), fitted by
  non-negative least squares to measured engine steps as ``const_ms + per_level_ms * depth +
  per_node_ms * nodes``, plus ``first_step_ms`` on the first step of a generation (the first
  target block after the prefill is slower).

:meth:`LatencyModel.predict` adds these up for a plan's *largest* tree
(:func:`~adaptive_spec.planner.actions.plan_structure`: i.i.d. walkers that merge make real trees
smaller; a planner cannot know that before drafting):

* draft: one forward over the ``draft_pending`` pending tokens at cache length
  ``context - draft_pending``, then one forward per depth level ``d = 1..D-1`` over that level's
  nodes at cache length ``context + (nodes of levels < d)``; none for a depth-0 plan;
* target: one forward over ``pending + N - 1`` tokens at cache length ``context - pending``
  (after a step, one token is pending: the previous step's bonus or recovered token);
* overhead: the verifier's time at ``N`` nodes plus the fitted bookkeeping term.

Interpolation is piecewise linear in tokens and in context length (bilinear on the grid).
Outside the grid it is *clamped*: below the smallest grid point the edge value is used, above
the largest the edge segment is extended linearly with its slope clamped at >= 0 (so a
prediction never falls as a tree or a context grows past the measured range).
"""

from __future__ import annotations

import bisect
import itertools
import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from adaptive_spec.planner.actions import plan_structure
from adaptive_spec.planner.plan import Plan, as_plan
from adaptive_spec.trees import DraftLaw

__all__ = [
    "FEATURE_REF_TOKENS",
    "PROFILE_FORMAT",
    "PROFILE_VERSION",
    "LatencyModel",
    "StepTimePrediction",
    "default_profile_path",
    "interp1",
    "validate_profile",
]

PROFILE_FORMAT = "adaptive-spec/latency-profile"
PROFILE_VERSION = 1
FEATURE_REF_TOKENS = 32
"""``target_ms_per_token`` is the target's mean slope from 1 to this many scored tokens (or the grid's largest)."""

# When a profile lacks a (verifier, law) pair, use the same verifier on the closest law.
_LAW_FALLBACK = {
    DraftLaw.CHAIN.value: (DraftLaw.IID.value, DraftLaw.DELAYED.value, DraftLaw.WITHOUT_REPLACEMENT.value),
    DraftLaw.IID.value: (DraftLaw.DELAYED.value, DraftLaw.WITHOUT_REPLACEMENT.value, DraftLaw.CHAIN.value),
    DraftLaw.DELAYED.value: (DraftLaw.IID.value, DraftLaw.WITHOUT_REPLACEMENT.value, DraftLaw.CHAIN.value),
    DraftLaw.WITHOUT_REPLACEMENT.value: (DraftLaw.IID.value, DraftLaw.DELAYED.value, DraftLaw.CHAIN.value),
    # Policy-grown trees are verified like the static trees of the same drawing rule.
    DraftLaw.DYNAMIC_CHAIN.value: (DraftLaw.CHAIN.value, DraftLaw.IID.value),
    DraftLaw.DYNAMIC_IID.value: (DraftLaw.IID.value, DraftLaw.DELAYED.value, DraftLaw.CHAIN.value),
    DraftLaw.DYNAMIC_WOR.value: (DraftLaw.WITHOUT_REPLACEMENT.value, DraftLaw.IID.value, DraftLaw.CHAIN.value),
}


def default_profile_path() -> Path:
    """Where ``adaptive-spec profile`` writes and :meth:`LatencyModel.load` looks: ``data/profile/profile.json``.

    Relative to the working directory, like every other run output under ``data/``.
    """
    return Path("data") / "profile" / "profile.json"


@dataclass(frozen=True)
class StepTimePrediction:
    """Predicted seconds of one speculative step.

    Attributes:
        draft_s: the draft's forwards (pending tokens, then one per depth level).
        target_s: the target's one forward over the tree.
        overhead_s: everything else: the verifier plus the fitted bookkeeping term.
        total_s: ``draft_s + target_s + overhead_s``.
        verify_s: the verifier's share of ``overhead_s`` (for information).
    """

    draft_s: float
    target_s: float
    overhead_s: float
    total_s: float
    verify_s: float = 0.0

    def as_dict(self) -> dict[str, float]:
        return {
            "draft_s": self.draft_s,
            "target_s": self.target_s,
            "overhead_s": self.overhead_s,
            "verify_s": self.verify_s,
            "total_s": self.total_s,
        }


# ---------------------------------------------------------------------- interpolation
def interp1(xs: list[float], ys: list[float], x: float) -> float:
    """Piecewise-linear interpolation of ``ys`` over increasing ``xs`` at ``x``, clamped outside.

    Below ``xs[0]`` the value is ``ys[0]``; above ``xs[-1]`` the last segment is extended with
    its slope clamped at >= 0. A single grid point gives a constant.
    """
    if len(xs) == 1 or x <= xs[0]:
        return float(ys[0])
    if x >= xs[-1]:
        slope = max(0.0, (ys[-1] - ys[-2]) / (xs[-1] - xs[-2]))
        return float(ys[-1] + slope * (x - xs[-1]))
    j = bisect.bisect_right(xs, x)  # xs[j-1] <= x < xs[j]
    x0, x1 = xs[j - 1], xs[j]
    w = (x - x0) / (x1 - x0)
    return float(ys[j - 1] * (1 - w) + ys[j] * w)


def _interp2(contexts: list[float], tokens: list[float], grid: list[list[float]], c: float, t: float) -> float:
    """Bilinear on the (context, tokens) grid with :func:`interp1`'s clamping on both axes."""
    per_context = [interp1(tokens, row, t) for row in grid]
    return interp1(contexts, per_context, c)


# ---------------------------------------------------------------------- validation
def _axis(profile: Mapping[str, Any], key: str, minimum: int) -> list[int]:
    axis = profile.get(key)
    if not isinstance(axis, list) or not axis or not all(isinstance(v, int) and not isinstance(v, bool) for v in axis):
        raise ValueError(f"latency profile: '{key}' must be a non-empty list of integers, got {axis!r}")
    if any(v < minimum for v in axis) or any(b <= a for a, b in itertools.pairwise(axis)):
        raise ValueError(f"latency profile: '{key}' must be strictly increasing integers >= {minimum}, got {axis}")
    return axis


def _grid(profile: Mapping[str, Any], key: str, rows: int, cols: int) -> list[list[float]]:
    grid = profile.get(key)
    ok = isinstance(grid, list) and len(grid) == rows and all(isinstance(r, list) and len(r) == cols for r in grid)
    if not ok:
        raise ValueError(f"latency profile: '{key}' must be a {rows} x {cols} list (contexts x tokens) of milliseconds")
    out = [[float(v) for v in r] for r in grid]
    if not all(math.isfinite(v) and v >= 0 for r in out for v in r):
        raise ValueError(f"latency profile: '{key}' holds negative, NaN or infinite times")
    return out


def validate_profile(profile: Mapping[str, Any]) -> None:
    """Raise a ValueError naming the first problem, unless ``profile`` is a usable latency profile."""
    if not isinstance(profile, Mapping):
        raise ValueError(f"a latency profile is a JSON object, got {type(profile).__name__}")
    if profile.get("format") != PROFILE_FORMAT:
        raise ValueError(
            f"not a latency profile (format {profile.get('format')!r}, expected {PROFILE_FORMAT!r}); "
            "write one with `adaptive-spec profile`"
        )
    if profile.get("version") != PROFILE_VERSION:
        raise ValueError(
            f"latency profile version {profile.get('version')!r} is not {PROFILE_VERSION}; "
            "re-run `adaptive-spec profile` with this adaptive-spec"
        )
    contexts = _axis(profile, "contexts", 0)
    tokens = _axis(profile, "tokens", 1)
    for key in ("draft_ms", "target_ms"):
        _grid(profile, key, len(contexts), len(tokens))
    verify = profile.get("verify_ms", {})
    if not isinstance(verify, Mapping):
        raise ValueError("latency profile: 'verify_ms' must map verifier -> law -> {nodes, ms}")
    for name, laws in verify.items():
        if not isinstance(laws, Mapping) or not laws:
            raise ValueError(f"latency profile: verify_ms[{name!r}] must map law -> {{nodes, ms}}")
        for law, curve in laws.items():
            if law not in _LAW_FALLBACK:
                raise ValueError(f"latency profile: verify_ms[{name!r}] has unknown law {law!r}")
            nodes, ms = (curve.get("nodes"), curve.get("ms")) if isinstance(curve, Mapping) else (None, None)
            if (
                not isinstance(nodes, list)
                or not isinstance(ms, list)
                or not nodes
                or len(nodes) != len(ms)
                or any(b <= a for a, b in itertools.pairwise(nodes))
                or not all(math.isfinite(float(v)) and float(v) >= 0 for v in ms)
            ):
                raise ValueError(
                    f"latency profile: verify_ms[{name!r}][{law!r}] needs increasing 'nodes' and as many "
                    "non-negative 'ms'"
                )
    overhead = profile.get("overhead", {})
    if not isinstance(overhead, Mapping):
        raise ValueError("latency profile: 'overhead' must be a mapping")
    for key in ("const_ms", "per_level_ms", "per_node_ms", "first_step_ms"):
        v = overhead.get(key, 0.0)
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) or v < 0:
            raise ValueError(f"latency profile: overhead.{key} must be a non-negative number, got {v!r}")


# ---------------------------------------------------------------------- the model
class LatencyModel:
    """Predicts the time of a step from a latency profile (see the module docstring).

    Args:
        profile: a profile dict (as written by ``adaptive-spec profile``).

    Raises:
        ValueError: the profile is malformed (the message names the field).
    """

    def __init__(self, profile: Mapping[str, Any]) -> None:
        validate_profile(profile)
        self.profile = dict(profile)
        self.source: str | None = None  # the file it was read from (from_profile), for reports
        self.contexts: list[int] = list(profile["contexts"])
        self.tokens: list[int] = list(profile["tokens"])
        self.draft_ms = _grid(profile, "draft_ms", len(self.contexts), len(self.tokens))
        self.target_ms = _grid(profile, "target_ms", len(self.contexts), len(self.tokens))
        self.verify_ms: dict[str, dict[str, tuple[list[int], list[float]]]] = {
            name: {law: (list(c["nodes"]), [float(v) for v in c["ms"]]) for law, c in laws.items()}
            for name, laws in profile.get("verify_ms", {}).items()
        }
        ovh = profile.get("overhead", {})
        self.const_ms = float(ovh.get("const_ms", 0.0))
        self.per_level_ms = float(ovh.get("per_level_ms", 0.0))
        self.per_node_ms = float(ovh.get("per_node_ms", 0.0))
        self.first_step_ms = float(ovh.get("first_step_ms", 0.0))

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_profile(cls, profile: str | Path | Mapping[str, Any]) -> LatencyModel:
        """From a profile dict or the path of a profile JSON file."""
        if not isinstance(profile, (str, Path)):
            return cls(profile)
        path = Path(profile)
        if not path.is_file():
            raise FileNotFoundError(f"latency profile {path} does not exist; write one with `adaptive-spec profile`")
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError as err:
            raise ValueError(f"latency profile {path} is not valid JSON: {err}") from None
        try:
            model = cls(data)
        except ValueError as err:
            raise ValueError(f"{path}: {err}") from None
        model.source = str(path)
        return model

    @classmethod
    def load(cls, path: str | Path | None = None) -> LatencyModel:
        """Read ``path``, else :func:`default_profile_path` if it exists.

        Raises:
            FileNotFoundError: no path given and no profile at the default location (the
                message says how to make one).
        """
        if path is not None:
            return cls.from_profile(path)
        default = default_profile_path()
        if not default.is_file():
            raise FileNotFoundError(
                f"no latency profile at {default} (relative to {Path.cwd()}); measure one on this device with "
                "`adaptive-spec profile` (or pass the path of an existing profile)"
            )
        return cls.from_profile(default)

    # ------------------------------------------------------------------ primitives
    @property
    def device_name(self) -> str:
        """The device the profile was measured on (as recorded in it)."""
        dev = self.profile.get("device", {})
        return str(dev.get("name", dev.get("type", "unknown"))) if isinstance(dev, Mapping) else str(dev)

    def draft_forward_ms(self, context_length: float, tokens: float) -> float:
        """Milliseconds of one draft forward of ``tokens`` tokens over ``context_length`` cached rows."""
        return _interp2(self.contexts, self.tokens, self.draft_ms, context_length, tokens)

    def target_forward_ms(self, context_length: float, tokens: float) -> float:
        """Milliseconds of one target forward of ``tokens`` tokens over ``context_length`` cached rows."""
        return _interp2(self.contexts, self.tokens, self.target_ms, context_length, tokens)

    def verify_forward_ms(self, verifier: str, law: DraftLaw | str, nodes: int) -> float:
        """Milliseconds of one ``verify`` call; 0.0 when the profile has no curve for ``verifier``."""
        curves = self.verify_ms.get(verifier)
        if not curves:
            return 0.0
        law = law.value if isinstance(law, DraftLaw) else str(law)
        for candidate in (law, *_LAW_FALLBACK.get(law, ())):
            if candidate in curves:
                xs, ys = curves[candidate]
                return interp1(xs, ys, nodes)
        return 0.0

    # ------------------------------------------------------------------ predictions
    def predict(
        self,
        plan: Plan | str,
        context_length: int,
        *,
        pending: int = 1,
        draft_pending: int | None = None,
        temperature: float | None = None,
        first_step: bool = False,
    ) -> StepTimePrediction:
        """Predicted time of one step of ``plan`` when ``context_length`` tokens are committed.

        Args:
            plan: the plan (or plan string).
            context_length: committed tokens before the step (prompt + generated).
            pending: committed tokens not yet in the target's cache (1 after any step or prefill).
            draft_pending: the same for the draft (default ``pending``; 2 after a step that
                accepted a whole leaf path).
            temperature: 0 predicts the ``greedy`` verifier (the engine's choice at
                temperature 0); None or > 0 the plan's verifier.
            first_step: the step is a generation's first (adds the profile's ``first_step_ms``).
        """
        plan = as_plan(plan)
        s = plan_structure(plan)
        ctx = int(context_length)
        p_t = max(1, int(pending))
        p_d = p_t if draft_pending is None else max(1, int(draft_pending))
        draft_ms = 0.0
        if s.depth > 0:
            draft_ms = self.draft_forward_ms(max(0, ctx - p_d), p_d)
            fed = 0
            for width in s.draft_forward_tokens:
                draft_ms += self.draft_forward_ms(ctx + fed, width)
                fed += width
        target_ms = self.target_forward_ms(max(0, ctx - p_t), p_t + s.target_tokens)
        verifier = "greedy" if temperature is not None and temperature == 0 else plan.verifier
        verify_ms = self.verify_forward_ms(verifier, plan.shape.law, s.num_nodes)
        other_ms = self.const_ms + self.per_level_ms * s.depth + self.per_node_ms * s.num_nodes
        if first_step:
            other_ms += self.first_step_ms
        overhead_ms = verify_ms + other_ms
        return StepTimePrediction(
            draft_s=draft_ms / 1e3,
            target_s=target_ms / 1e3,
            overhead_s=overhead_ms / 1e3,
            total_s=(draft_ms + target_ms + overhead_ms) / 1e3,
            verify_s=verify_ms / 1e3,
        )

    def predict_many(
        self, plans: Iterable[Plan | str], context_length: int, *, temperature: float | None = None
    ) -> list[float]:
        """Predicted total seconds per step for each plan (e.g. every action of a space), in order."""
        return [self.predict(p, context_length, temperature=temperature).total_s for p in plans]

    def features(self, context_length: int) -> dict[str, float]:
        """The latency features of :data:`adaptive_spec.formats.features.SCHEMA` at ``context_length``.

        ``draft_ms``/``target_ms``: one-token forwards over ``context_length`` cached rows;
        ``target_ms_per_token``: the target's mean extra milliseconds per additional scored
        token between 1 and :data:`FEATURE_REF_TOKENS` tokens (clamped at >= 0).
        """
        ctx = max(0, int(context_length))
        t1 = self.target_forward_ms(ctx, 1)
        ref = min(FEATURE_REF_TOKENS, self.tokens[-1]) if self.tokens[-1] > 1 else FEATURE_REF_TOKENS
        slope = (self.target_forward_ms(ctx, ref) - t1) / (ref - 1)
        return {"draft_ms": self.draft_forward_ms(ctx, 1), "target_ms": t1, "target_ms_per_token": max(0.0, slope)}

    def __repr__(self) -> str:
        models = self.profile.get("models", {})
        names = {k: (v.get("name") if isinstance(v, Mapping) else v) for k, v in models.items()}
        return (
            f"LatencyModel(device={self.device_name!r}, models={names}, contexts={self.contexts}, tokens={self.tokens})"
        )
