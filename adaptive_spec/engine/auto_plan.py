"""The plan :meth:`SpecEngine.generate` plays when it is given none (``plan="auto"``).

In order:

0. ``configs/plans/adaptive.yaml`` (the per-step source rule, tuned with ``adaptive-spec tune
   sources``), on the condition below;
1. ``configs/plans/in-draft.yaml`` (the in-draft planner, tuned with ``adaptive-spec tune
   policies``), if its ``models`` fingerprints are those of the loaded pair: its plan for the
   nearest tuned temperature of the same kind (greedy 0, or sampling > 0);
2. ``configs/plans/best-static.yaml`` (``adaptive-spec tune plans``), on the same condition;
3. the plan files shipped for a fetched model's pair: its per-step source rule
   (``adaptive_spec/zoo/smollm2/adaptive.yaml``), then its in-draft plans (``in-draft.yaml``), on the
   same condition;
4. otherwise :data:`DEFAULT_PLAN` (``chain:2/block``, the best static plan measured on a CPU for
   the built-in pair; at temperature 0 the engine verifies it greedily).

On a GPU (any device but a CPU) a file's plans tuned on that kind of device (its ``devices`` section,
``adaptive-spec tune sources --device cuda``) come before its other plans, which were tuned on a CPU.

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
from adaptive_spec.planner.gate import GatedSource
from adaptive_spec.planner.plan import Plan
from adaptive_spec.planner.presets import nearest_section_entry, plan_sections
from adaptive_spec.planner.sources import SOURCE_PREFIX, SourceRule, parse_source_rule
from adaptive_spec.verifiers import REGISTRY

__all__ = ["DEFAULT_PLAN", "choose_default_plan", "parse_plan_or_rule", "tuned_plan_files"]

DEFAULT_PLAN = "chain:2/block"


def tuned_plan_files() -> list[Path]:
    """Where the tuned plan files are looked for, in order: the in-draft planner, then the best static plan."""
    from adaptive_spec.engine.models import MODELS, adaptive_file, in_draft_file
    from adaptive_spec.files import config_path
    from adaptive_spec.planner.presets import ADAPTIVE_RELPATH, BEST_STATIC_RELPATH, in_draft_path

    adaptive = [p for p in map(adaptive_file, MODELS) if p is not None and p.is_file()]  # a fetched model's pair
    shipped = [p for p in map(in_draft_file, MODELS) if p is not None and p.is_file()]
    own = [config_path(ADAPTIVE_RELPATH.relative_to("configs")), in_draft_path()]
    return [*own, config_path(BEST_STATIC_RELPATH.relative_to("configs")), *adaptive, *shipped]


def _read(path: Path) -> Any:
    import yaml

    try:
        return yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError):
        return None


def choose_default_plan(
    fingerprints: dict[str, str],
    temperature: float,
    files: Sequence[str | Path] | None = None,
    device: str | None = None,
) -> tuple[Plan | SourceRule | GatedSource, str]:
    """The default plan (or per-step source rule) for a pair with these fingerprints at ``temperature``, and why.

    Args:
        fingerprints: ``{"target": ..., "draft": ...}`` from
            :func:`~adaptive_spec.engine.fingerprint.pair_fingerprints`.
        temperature: the sampling temperature (0 = greedy).
        files: tuned plan files to try, in order (default: :func:`tuned_plan_files`).
        device: the engine's device type (``"cuda"``, ...): a file's plans tuned on that kind of device come
            before its other plans (:func:`~adaptive_spec.planner.presets.plan_sections`).

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
        sections = plan_sections(data, device)
        found = nearest_section_entry(({k: v for k, v in sec.items() if _is_number(k)} for sec in sections), t)
        if found is None:
            reasons.append(f"{path.name} has no plan for temperature {t:g}")
            continue
        (i, key), tuned_here = found, len(sections) > 1 and found[0] == 0
        entry = sections[i][key]
        try:
            plan = parse_plan_or_rule(entry["plan"] if isinstance(entry, dict) else entry, base_dir=path.parent)
        except (KeyError, TypeError, ValueError) as err:
            reasons.append(f"{path.name}: unusable plan at temperature {key} ({err})")
            continue
        if t > 0 and any(REGISTRY[p.verifier].greedy_only for p in _plans_of(plan)):
            reasons.append(f"{path.name}: {plan} is greedy-only")
            continue
        where = f" on {device}" if tuned_here else ""
        return plan, f"{path.name} was tuned for this model pair{where} (its plan for temperature {float(key):g})"
    return Plan.parse(DEFAULT_PLAN), f"the default static plan ({'; '.join(reasons) or 'no tuned plan files'})"


def parse_plan_or_rule(text: str, base_dir: str | Path | None = None) -> Plan | SourceRule | GatedSource:
    """A plan string, or a per-step source choice (``source:...``, a planner: a rule or a learned gate).

    ``base_dir``: where a gate file named by a relative path is looked for first (the plan file's folder).
    """
    if isinstance(text, str) and text.strip().startswith(SOURCE_PREFIX):
        return parse_source_rule(text.strip(), base_dir=base_dir)
    return Plan.parse(text)


def _plans_of(plan: Plan | SourceRule | GatedSource) -> list[Plan]:
    return [plan.model, plan.lookup] if isinstance(plan, (SourceRule, GatedSource)) else [plan]


def _is_number(key: Any) -> bool:
    try:
        float(key)
    except (TypeError, ValueError):
        return False
    return True
