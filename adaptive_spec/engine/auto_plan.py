"""The plan :meth:`SpecEngine.generate` plays when it is given none (``plan="auto"``).

In order:

1. ``configs/plans/in-draft.yaml`` (the in-draft planner, tuned with ``adaptive-spec tune
   policies``), if its ``models`` fingerprints are those of the loaded pair: its plan for the
   nearest tuned temperature of the same kind (greedy 0, or sampling > 0);
2. ``configs/plans/best-static.yaml`` (``adaptive-spec tune plans``), on the same condition;
3. the in-draft plan files shipped for a fetched model's pair (``adaptive_spec/zoo/smollm2/in-draft.yaml``),
   on the same condition;
4. otherwise :data:`DEFAULT_PLAN` (``chain:2/block``, the best static plan measured on a CPU for
   the built-in pair; at temperature 0 the engine verifies it greedily).

A plan file written for another pair, or without fingerprints, is never used by default: a
plan tuned for one pair can be slow for another (it stays lossless either way: every plan the
registry admits is). Files are looked up in the working directory, then in the copy shipped
inside the package (``adaptive_spec/configs/``). See :mod:`adaptive_spec.engine.fingerprint`.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from adaptive_spec.engine.fingerprint import plan_file_matches
from adaptive_spec.planner.plan import Plan
from adaptive_spec.verifiers import REGISTRY

__all__ = ["DEFAULT_PLAN", "choose_default_plan", "tuned_plan_files"]

DEFAULT_PLAN = "chain:2/block"


def tuned_plan_files() -> list[Path]:
    """Where the tuned plan files are looked for, in order: the in-draft planner, then the best static plan."""
    from adaptive_spec.engine.models import MODELS, in_draft_file
    from adaptive_spec.files import config_path
    from adaptive_spec.planner.presets import BEST_STATIC_RELPATH, in_draft_path

    shipped = [p for p in map(in_draft_file, MODELS) if p is not None and p.is_file()]  # a fetched model's pair
    return [in_draft_path(), config_path(BEST_STATIC_RELPATH.relative_to("configs")), *shipped]


def _read(path: Path) -> Any:
    import yaml

    try:
        return yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError):
        return None


def choose_default_plan(
    fingerprints: dict[str, str], temperature: float, files: Sequence[str | Path] | None = None
) -> tuple[Plan, str]:
    """The default plan for a pair with these fingerprints at ``temperature``, and why it was chosen.

    Args:
        fingerprints: ``{"target": ..., "draft": ...}`` from
            :func:`~adaptive_spec.engine.fingerprint.pair_fingerprints`.
        temperature: the sampling temperature (0 = greedy).
        files: tuned plan files to try, in order (default: :func:`tuned_plan_files`).

    Returns:
        ``(plan, reason)``; the plan is one the verifier registry admits at this temperature.
    """
    t = float(temperature)
    reasons = []
    for path in map(Path, files if files is not None else tuned_plan_files()):
        if not path.is_file():
            reasons.append(f"no {path.name}")
            continue
        data = _read(path)
        plans = data.get("plans") if isinstance(data, dict) else None
        if not isinstance(plans, dict):
            reasons.append(f"{path.name} is not a plan file")
            continue
        if not plan_file_matches(data, fingerprints):
            reasons.append(f"{path.name} was tuned for another model pair")
            continue
        same_kind = [k for k in plans if _is_number(k) and (float(k) == 0) == (t == 0)]
        if not same_kind:
            reasons.append(f"{path.name} has no plan for temperature {t:g}")
            continue
        key = min(same_kind, key=lambda k: abs(float(k) - t))
        entry = plans[key]
        try:
            plan = Plan.parse(entry["plan"] if isinstance(entry, dict) else entry)
        except (KeyError, TypeError, ValueError) as err:
            reasons.append(f"{path.name}: unusable plan at temperature {key} ({err})")
            continue
        if t > 0 and REGISTRY[plan.verifier].greedy_only:
            reasons.append(f"{path.name}: {plan} is greedy-only")
            continue
        return plan, f"{path.name} was tuned for this model pair (its plan for temperature {float(key):g})"
    return Plan.parse(DEFAULT_PLAN), f"the default static plan ({'; '.join(reasons) or 'no tuned plan files'})"


def _is_number(key: Any) -> bool:
    try:
        float(key)
    except (TypeError, ValueError):
        return False
    return True
