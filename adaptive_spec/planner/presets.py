"""Plans chosen ahead of time: the default plans of the commands, and the tuned plan files.

Default plans: :data:`DEFAULT_PLAN` (``generate``), :data:`COLLECT_PLAN` (the plan ``collect``
exploits) and :data:`DEFAULT_PLANS` (the static plans ``bench e2e`` and ``tune plans`` compare).

Two tuned files per temperature live under ``configs/plans/``:

- ``best-static.yaml``, the best static plan per temperature (:func:`load_best_static`,
  :func:`write_best_static`);
- ``in-draft.yaml``, the in-draft planner's drafting policy per temperature
  (:func:`load_in_draft`, :func:`write_in_draft`; written by ``adaptive-spec tune policies``).

``best-static.yaml``: ``adaptive-spec tune plans`` writes the best plan it found for each
temperature here; the file is the static baseline and the selector's reference (``best-static``),
read back with :func:`load_best_static`. Layout::

    version: 1
    plans:
      "0":                                # temperature, formatted with :g
        plan: chain:5/greedy
        tokens_per_s: 211.4               # the study's best value (objective below)
        objective: measured               # or predicted
        study: plans/T=0
        ...                               # storage, trial number, baselines, model pair, time

Where the file lives: ``configs/plans/best-static.yaml`` under the *working directory* (run the
commands from the repository root), or under ``--config-out DIR`` / the ``path`` argument. Reads
then fall back to the copy shipped inside the package (``adaptive_spec/configs/``, see
:data:`adaptive_spec.files.CONFIGS`), and otherwise say which paths they tried and how to create
the file. Writes never go into the package.

Writes merge (other temperatures are kept) and are atomic (temporary file, then rename, under a
lock on the folder), so two tuners finishing at once do not lose each other's entry.

``in-draft.yaml`` layout::

    version: 1
    plans:
      "0": {plan: "conf-chain:12:0.3/block", speedup_vs_ar: 2.1, ...}
      "1": {...}

A plan file may also hold plans tuned on one kind of device (``adaptive-spec tune sources --device cuda``)
under ``devices``; they come first on that kind of device, the ``plans`` mapping (tuned on a CPU) everywhere
else and for temperatures the device's own section lacks (:func:`plan_sections`)::

    plans: {"0": {...}, "1": {...}}
    devices:
      cuda:
        plans: {"0": {plan: "source:chain:2/block+lookup:3x16/greedy?...", device: cuda, ...}}

This module imports neither Optuna nor torch: the engine side (``bench e2e --plans best-static``,
``--plans in-draft``) uses it.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import os
import warnings
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from adaptive_spec.files import CONFIGS, atomic_write
from adaptive_spec.planner.plan import Plan
from adaptive_spec.temperatures import temperature_key

__all__ = [
    "BEST_STATIC_RELPATH",
    "COLLECT_PLAN",
    "DEFAULT_PLAN",
    "DEFAULT_PLANS",
    "IN_DRAFT_RELPATH",
    "best_static_path",
    "in_draft_path",
    "load_best_static",
    "load_in_draft",
    "nearest_section_entry",
    "plan_sections",
    "read_best_static",
    "read_plan_entries",
    "read_plan_file",
    "write_best_static",
    "write_in_draft",
]

DEFAULT_PLAN = "delayed:2x3x3/traversal"
"""The plan of ``generate`` when none is given."""
COLLECT_PLAN = "delayed:2x2x2/traversal"
"""The static plan ``collect`` runs (and an exploring planner exploits) when none is given."""
DEFAULT_PLANS = ("chain:4/block", "delayed:2x3x3/traversal", "wor:3x2x1/traversal")
"""The static plans ``bench e2e`` measures and ``tune plans`` compares its finalists with."""

IN_DRAFT_RELPATH = Path("configs") / "plans" / "in-draft.yaml"
BEST_STATIC_RELPATH = Path("configs") / "plans" / "best-static.yaml"
ADAPTIVE_RELPATH = Path("configs") / "plans" / "adaptive.yaml"  # the per-step source rule (tune sources)
FORMAT_VERSION = 1
_HEADER = """\
# Best static plan per temperature, written by `adaptive-spec tune plans` (merged per temperature).
# The static baseline and the selector's reference: load with
# adaptive_spec.planner.presets.load_best_static(temperature) or `bench e2e --plans best-static`.
"""


def best_static_path(config_dir: str | Path | None = None) -> Path:
    """``<config_dir>/plans/best-static.yaml``; ``config_dir`` defaults to ``./configs``."""
    if config_dir is None:
        return Path.cwd() / BEST_STATIC_RELPATH
    return Path(config_dir) / BEST_STATIC_RELPATH.relative_to("configs")


def _candidates(path: str | Path | None) -> list[Path]:
    if path is not None:
        return [Path(path)]
    out = [Path.cwd() / BEST_STATIC_RELPATH]
    shipped = CONFIGS / BEST_STATIC_RELPATH.relative_to("configs")  # the copy inside the package
    if shipped not in out:
        out.append(shipped)
    return out


def read_plan_file(path: str | Path, what: str = "plan file") -> dict[str, Any]:
    """A plan file as loaded (empty when the file does not exist), checked to hold a ``plans`` mapping.

    Raises:
        ValueError: the file exists but is not valid YAML or has no ``plans`` mapping (the message names it).
    """
    import yaml

    path = Path(path)
    if not path.exists():
        return {}
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as err:
        raise ValueError(f"{path} is not valid YAML ({err}); fix or delete it") from err
    if not isinstance(data, dict) or not isinstance(data.get("plans"), dict):
        raise ValueError(f"{path} is not a {what}: expected a mapping with a 'plans' mapping")
    return data


def read_plan_entries(path: str | Path, what: str = "plan file") -> dict[Any, Any]:
    """The ``plans`` mapping of a plan file, unchecked entries by their keys (empty when the file does not exist).

    Raises:
        ValueError: as :func:`read_plan_file`.
    """
    return read_plan_file(path, what).get("plans", {})


def plan_sections(data: Any, device: str | None = None) -> list[dict[Any, Any]]:
    """The ``plans`` mappings of a loaded plan file to look in on a ``device`` (a torch device type such as
    ``"cuda"``), in order: the plans tuned on that kind of device (``devices: {cuda: {plans: ...}}``), then the
    file's ``plans``. A CPU (or None) reads ``plans`` only; a missing or malformed section is skipped.
    """
    if not isinstance(data, dict):
        return []
    out = []
    devices = data.get("devices")
    if device not in (None, "cpu") and isinstance(devices, dict):
        own = devices.get(device)
        if isinstance(own, dict) and isinstance(own.get("plans"), dict):
            out.append(own["plans"])
    if isinstance(data.get("plans"), dict):
        out.append(data["plans"])
    return out


def nearest_section_entry(sections: Iterable[dict[Any, Any]], temperature: float) -> tuple[int, Any] | None:
    """``(i, key)``: the first of ``sections`` (:func:`plan_sections`' order) with a plan tuned at a temperature of
    ``temperature``'s kind, and the nearest such key there (:func:`nearest_tuned_key`); None if none has one.
    """
    for i, section in enumerate(sections):
        key = nearest_tuned_key(section, temperature)
        if key is not None:
            return i, key
    return None


def _writable(data: dict[str, Any], device: str | None) -> dict[str, Any]:
    """The mapping of a loaded plan file whose ``plans`` take what was tuned on ``device``: the file itself on a CPU
    (or None), else that device's own section (``devices: {cuda: {...}}``, made if missing).
    """
    return data if device in (None, "cpu") else data.setdefault("devices", {}).setdefault(device, {})


def read_best_static(path: str | Path) -> dict[str, dict[str, Any]]:
    """The entries of a best-static file by temperature key (empty when the file does not exist).

    Raises:
        ValueError: the file exists but is not a best-static file (the message names it).
    """
    return _best_static_entries(read_plan_entries(path, "best-static file"), path)


def _best_static_entries(plans: dict[Any, Any], path: str | Path) -> dict[str, dict[str, Any]]:
    """A best-static file's ``plans`` mapping (or a device's), checked, by temperature key."""
    out: dict[str, dict[str, Any]] = {}
    for key, entry in plans.items():
        if not isinstance(entry, dict) or not isinstance(entry.get("plan"), str):
            raise ValueError(f"{path}: entry for temperature {key!r} must be a mapping with a 'plan' string")
        try:
            Plan.parse(entry["plan"])
        except ValueError as err:
            raise ValueError(f"{path}: temperature {key!r}: {err}") from err
        out[temperature_key(float(key))] = entry
    return out


@contextlib.contextmanager
def _folder_lock(folder: Path) -> Iterator[None]:
    try:
        import fcntl
    except ImportError:  # not POSIX: atomic rename still protects the file itself
        yield
        return
    fd = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def write_best_static(
    temperature: float, entry: dict[str, Any], path: str | Path | None = None, device: str | None = None
) -> Path:
    """Set the entry of ``temperature`` (keeping the others, and the other sections) and write the file atomically;
    the file's ``models`` stamp is dropped (it named the pair of the plans it saw).

    Args:
        temperature: the temperature the plan was tuned at.
        entry: at least ``{"plan": "<plan string>"}``; ``tokens_per_s``, study information and
            baselines are kept as given (plain YAML types); ``updated`` is added.
        path: the file (default ``./configs/plans/best-static.yaml``).
        device: the kind of device the plan was tuned on: other than a CPU, the entry goes to that device's own
            section (:func:`plan_sections`).

    Returns:
        The path written.

    Raises:
        ValueError: an invalid plan, or an existing file that cannot be read (it is left as it is).
    """
    import yaml

    Plan.parse(entry["plan"])
    path = Path(path) if path is not None else best_static_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    entry = {**entry, "updated": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")}
    with _folder_lock(path.parent):
        data = read_plan_file(path, "best-static file") or {"plans": {}}
        data["plans"] = _best_static_entries(data["plans"], path)  # an existing file checked first
        data.pop("models", None)  # a stamp names the pair of the plans it saw: stamp again (`tune stamp`) after this
        own = _writable(data, device)
        plans = own.get("plans") if own is data else dict(own.get("plans") or {})
        plans[temperature_key(temperature)] = entry
        own["plans"] = dict(sorted(plans.items(), key=lambda kv: float(kv[0])))
        data = {"version": FORMAT_VERSION, **{k: v for k, v in data.items() if k != "version"}}
        atomic_write(path, _HEADER + yaml.safe_dump(data, sort_keys=False))
    return path


def nearest_tuned_key(keys: Iterable[Any], temperature: float) -> Any | None:
    """The tuned temperature key nearest ``temperature`` of the same kind (greedy 0, or sampling > 0); None if none.

    A greedy plan's verifier may not be valid when sampling, so the kinds never mix.
    """
    t = float(temperature)
    same_kind = [k for k in keys if (float(k) == 0) == (t == 0)]
    return min(same_kind, key=lambda k: abs(float(k) - t), default=None)


def load_best_static(temperature: float, path: str | Path | None = None, device: str | None = None) -> Plan:
    """The best static plan tuned for ``temperature`` (on a ``device`` other than a CPU, the plans tuned on that
    kind of device first, :func:`plan_sections`).

    Looks in ``path``, else ``./configs/plans/best-static.yaml``, else the package's shipped
    ``configs/``. Without an entry for exactly this temperature, falls back (with a warning) to
    the nearest tuned temperature of the same kind: greedy (0) or sampling (> 0), since a
    greedy plan's verifier is not valid when sampling.

    Raises:
        FileNotFoundError: no best-static file was found (the message lists where it looked).
        LookupError: the file has no plan usable at this temperature.
        ValueError: a malformed file.
    """
    key = temperature_key(temperature)
    tried = _candidates(path)
    found = next((p for p in tried if p.exists()), None)
    if found is None:
        raise FileNotFoundError(
            f"no best-static plan file (looked at {', '.join(map(str, tried))}); create it with "
            f"`adaptive-spec tune plans --temperatures {key}` from the repository root, or pass its path"
        )
    data = read_plan_file(found, "best-static file")
    sections = plan_sections(data, device)
    if len(sections) > 1:  # the plans tuned on this kind of device first
        mine = _best_static_entries(sections[0], found)
        near = nearest_tuned_key(mine, float(key))
        if near is not None:
            return Plan.parse(mine[near]["plan"])
    plans = _best_static_entries(data["plans"], found)
    if key in plans:
        return Plan.parse(plans[key]["plan"])
    nearest = nearest_tuned_key(plans, float(key))
    if nearest is None:
        have = ", ".join(plans) or "none"
        raise LookupError(
            f"{found} has no plan for temperature {key} (tuned temperatures: {have}); run "
            f"`adaptive-spec tune plans --temperatures {key}`"
        )
    warnings.warn(
        f"{found} has no plan for temperature {key}; using the one tuned at {nearest}", UserWarning, stacklevel=2
    )
    return Plan.parse(plans[nearest]["plan"])


def in_draft_path(root: str | Path | None = None) -> Path:
    """``configs/plans/in-draft.yaml`` under ``root`` (default: the working directory, else the package's copy)."""
    if root is not None:
        return Path(root) / IN_DRAFT_RELPATH
    here = Path.cwd() / IN_DRAFT_RELPATH
    if here.is_file():
        return here
    shipped = CONFIGS / IN_DRAFT_RELPATH.relative_to("configs")
    return shipped if shipped.is_file() else here


def load_in_draft(temperature: float, path: str | Path | None = None, device: str | None = None) -> Plan:
    """The tuned in-draft plan for ``temperature`` (the nearest tuned temperature of the same kind; on a ``device``
    other than a CPU, among the plans tuned on that kind of device first, :func:`plan_sections`).

    Raises:
        FileNotFoundError: no file (the message says how to make one).
        LookupError: no entry usable at this temperature.
    """
    import yaml

    file = Path(path) if path is not None else in_draft_path()
    if not file.is_file():
        raise FileNotFoundError(
            f"no tuned in-draft plans at {file}; run `adaptive-spec tune policies --prompts TUNING.jsonl`"
        )
    data = yaml.safe_load(file.read_text(encoding="utf-8")) or {}
    sections = plan_sections(data, device)
    found = nearest_section_entry(sections, temperature)
    if found is not None:
        return Plan.parse(sections[found[0]][found[1]]["plan"])
    have = ", ".join((data.get("plans") or {}) if isinstance(data, dict) else {}) or "none"
    raise LookupError(f"{file} has no in-draft plan for temperature {float(temperature):g} (tuned: {have})")


def write_in_draft(choices: dict[str, dict[str, Any]], path: Path, device: str | None = None) -> None:
    """Merge ``{temperature key: entry}`` into the file (atomically; other temperatures kept; a GPU's plans in
    its own section, :func:`write_plan_file`).
    """
    header = "# In-draft planner: the best drafting policy per temperature, from `adaptive-spec tune policies`.\n"
    write_plan_file(choices, path, header, device)


def write_plan_file(choices: dict[str, dict[str, Any]], path: Path, header: str, device: str | None = None) -> None:
    """Merge ``{temperature key: entry}`` into the plan file at ``path`` (atomically; other temperatures kept).

    ``device``: a torch device type the plans were tuned on; other than a CPU, they go to that device's own
    section (``devices: {cuda: {plans: ...}}``, :func:`plan_sections`), leaving the file's ``plans`` as they are.
    """
    import yaml

    data: dict[str, Any] = {"version": 1, "plans": {}}
    if path.is_file():
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or data
        data.setdefault("plans", {})
    _writable(data, device).setdefault("plans", {}).update(choices)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, header + yaml.safe_dump(data, sort_keys=False))
