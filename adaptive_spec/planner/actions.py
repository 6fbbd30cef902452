"""The action space: every (tree shape, verifier) pair a planner may choose, read from YAML.

An *action* is a :class:`~adaptive_spec.planner.plan.Plan`: a tree shape with its sizes plus a
verifier that is lossless for that shape's drafting law. An :class:`ActionSpace` is an ordered,
de-duplicated tuple of plans; the position of a plan is its action index (the selector's class
label), so the order is part of a trained selector's contract and is kept stable: families in
file order, then sizes in nested-loop order (first key outermost), then verifiers in the order
listed, then the explicit ``actions``.

YAML format (see ``adaptive_spec/planner/default_actions.yaml``, which documents itself)::

    name: default                  # free text, recorded with data sets and selectors
    max_nodes: 40                  # optional: drop grid points whose tree has more nodes (root included)
    families:
      - law: chain                 # chain: length
        length: [1, 2, 3, 4]
        verifiers: [token, block, traversal]
      - law: iid                   # iid: paths x length
        paths: [2, 3]
        length: [1, 2, 3]
        verifiers: [traversal, specinfer]
      - law: delayed               # delayed: trunk x paths x branch
        trunk: [1, 2]
        paths: [2, 3]
        branch: [0, 2, 4]          # branch 0 is a chain (shapes are canonical)
        verifiers: [traversal, gbv]
      - law: wor                   # without replacement: explicit width lists
        widths: [[2, 2], [3, 2, 1], "2x2x2"]
        verifiers: [traversal, rrsw]
    actions: ["chain:12/block"]    # optional extra plans, exempt from max_nodes

A size may be an integer, a list of integers or an inclusive range string ``"1-8"``.

Latency structure: :func:`draft_level_sizes` gives the number of nodes at each depth, from
which the draft forwards (one over the pending tokens, then one per depth level 1..D-1 over
that level's nodes; leaves are never fed) and the target's one forward (pending tokens plus
N - 1 drafted nodes) follow. i.i.d. walkers that draw the same token merge, so a real tree can
be smaller; the action's structure uses the *largest* possible widths, which is what a planner
can know before drafting.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from adaptive_spec.planner.plan import Plan, as_plan
from adaptive_spec.trees import DraftLaw, TreeShape
from adaptive_spec.verifiers import REGISTRY, get_verifier

__all__ = [
    "DEFAULT_ACTIONS_PATH",
    "ActionSpace",
    "PlanStructure",
    "draft_level_sizes",
    "parse_plans",
    "plan_structure",
]

DEFAULT_ACTIONS_PATH = Path(__file__).resolve().parent / "default_actions.yaml"
"""The default grid, shipped inside the package."""

# law name in YAML -> (size keys in loop order, constructor)
_FAMILIES: dict[str, tuple[tuple[str, ...], Any]] = {
    "chain": (("length",), lambda s: TreeShape.chain(s["length"])),
    "iid": (("paths", "length"), lambda s: TreeShape.iid(s["paths"], s["length"])),
    "delayed": (("trunk", "paths", "branch"), lambda s: TreeShape.delayed(s["trunk"], s["paths"], s["branch"])),
    "wor": (("widths",), lambda s: TreeShape.without_replacement(s["widths"])),
}
_TOP_KEYS = {"name", "description", "max_nodes", "families", "actions"}


# ---------------------------------------------------------------------- per-action structure
def draft_level_sizes(shape: TreeShape) -> tuple[int, ...]:
    """Largest number of drafted nodes at each depth 1..D (i.i.d. walkers assumed not to merge).

    ``chain:L`` -> ``(1,) * L``; ``iid:KxL`` -> ``(K,) * L``; ``delayed:TxKxB`` ->
    ``(1,) * T + (K,) * B``; ``wor:W1xW2..`` -> running products ``(W1, W1*W2, ...)``.
    ``1 + sum(draft_level_sizes(shape)) == shape.max_nodes``.
    """
    if shape.law is DraftLaw.WITHOUT_REPLACEMENT:
        return tuple(itertools.accumulate(shape.widths, lambda a, b: a * b))
    if shape.law is DraftLaw.CHAIN:
        return (1,) * shape.trunk
    return (1,) * shape.trunk + (shape.paths,) * shape.branch_len


@dataclass(frozen=True)
class PlanStructure:
    """What one step of a plan costs in model work (largest case, before any merging).

    Attributes:
        num_nodes: tree nodes, root included (``shape.max_nodes``).
        depth: longest drafted path.
        level_sizes: drafted nodes at depths 1..depth.
        draft_forward_tokens: tokens fed by each draft forward *after* the one over the pending
            context tokens: the nodes of levels 1..depth-1 (leaves are never fed). A depth-0
            plan runs no draft forward at all; every other plan runs ``1 + len(...)`` of them.
        target_tokens: tree tokens scored by the one target forward besides the pending
            context tokens, i.e. ``num_nodes - 1`` drafted nodes (the root is the last pending token).
    """

    num_nodes: int
    depth: int
    level_sizes: tuple[int, ...]
    draft_forward_tokens: tuple[int, ...]
    target_tokens: int

    @property
    def draft_forwards(self) -> int:
        """Draft forward passes per step (0 for a depth-0 plan)."""
        return 0 if self.depth == 0 else 1 + len(self.draft_forward_tokens)


def plan_structure(plan: Plan | str | TreeShape) -> PlanStructure:
    """The :class:`PlanStructure` of a plan (or bare shape)."""
    shape = plan if isinstance(plan, TreeShape) else as_plan(plan).shape
    levels = draft_level_sizes(shape)
    return PlanStructure(
        num_nodes=shape.max_nodes,
        depth=shape.depth,
        level_sizes=levels,
        draft_forward_tokens=levels[:-1],
        target_tokens=shape.max_nodes - 1,
    )


# ---------------------------------------------------------------------- the space
class ActionSpace:
    """An ordered, de-duplicated tuple of plans; a plan's position is its action index.

    Args:
        plans: plans or plan strings (``"delayed:2x3x3/traversal"``); duplicates (after shape
            canonicalisation, e.g. ``delayed:2x3x0`` is ``chain:2``) keep their first position.
        name: a label recorded with data sets and selectors.

    Raises:
        ValueError: an empty space, an unparsable plan, a verifier that is not lossless for the
            shape's law, or one that is lossy or lossless only at temperature 0.
    """

    def __init__(self, plans: Iterable[Plan | str], name: str = "custom") -> None:
        out: dict[Plan, None] = {}
        for i, p in enumerate(plans):
            try:
                plan = as_plan(p)
                _check_action_verifier(plan.verifier)
            except ValueError as err:
                raise ValueError(f"action #{i} ({p}): {err}") from None
            out.setdefault(plan, None)
        if not out:
            raise ValueError("an action space needs at least one plan")
        self.plans: tuple[Plan, ...] = tuple(out)
        self.names: tuple[str, ...] = tuple(str(p) for p in self.plans)
        self.name = str(name)
        self._index = {p: i for i, p in enumerate(self.plans)}

    # ------------------------------------------------------------------ container protocol
    def __len__(self) -> int:
        return len(self.plans)

    def __iter__(self) -> Iterator[Plan]:
        return iter(self.plans)

    def __getitem__(self, i: int) -> Plan:
        return self.plans[i]

    def __contains__(self, plan: object) -> bool:
        try:
            return as_plan(plan) in self._index  # type: ignore[arg-type]
        except ValueError:
            return False

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ActionSpace) and self.plans == other.plans

    def __hash__(self) -> int:
        return hash(self.plans)

    def __repr__(self) -> str:
        return f"ActionSpace(name={self.name!r}, {len(self)} actions)"

    def index(self, plan: Plan | str) -> int:
        """The action index of ``plan`` (a Plan or plan string, canonicalised first).

        Raises:
            ValueError: the plan is not in the space (or does not parse).
        """
        p = as_plan(plan)
        try:
            return self._index[p]
        except KeyError:
            raise ValueError(f"plan {p} is not in action space {self.name!r} ({len(self)} actions)") from None

    # ------------------------------------------------------------------ summaries
    @property
    def verifiers(self) -> tuple[str, ...]:
        """Verifier names used by at least one action, in first-use order."""
        return tuple(dict.fromkeys(p.verifier for p in self.plans))

    @property
    def laws(self) -> tuple[DraftLaw, ...]:
        """Drafting laws used by at least one action, in first-use order."""
        return tuple(dict.fromkeys(p.shape.law for p in self.plans))

    @property
    def max_nodes(self) -> int:
        """The largest tree in the space, root included."""
        return max(p.shape.max_nodes for p in self.plans)

    @property
    def max_depth(self) -> int:
        return max(p.shape.depth for p in self.plans)

    def structures(self) -> list[PlanStructure]:
        """:func:`plan_structure` of every action, in index order."""
        return [plan_structure(p) for p in self.plans]

    def to_dict(self) -> dict:
        """JSON-serialisable: name, size and the action names in index order."""
        return {"name": self.name, "num_actions": len(self), "actions": list(self.names)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, where: str = "action space") -> ActionSpace:
        """Build a space from :meth:`to_dict` output (``actions`` only) or from the YAML grid format."""
        if not isinstance(data, Mapping):
            raise ValueError(f"{where}: expected a mapping with 'families' and/or 'actions', got {type(data).__name__}")
        unknown = set(data) - _TOP_KEYS - {"num_actions"}
        if unknown:
            raise ValueError(f"{where}: unknown keys {sorted(unknown)}; allowed: {sorted(_TOP_KEYS)}")
        max_nodes = data.get("max_nodes")
        if max_nodes is not None and (isinstance(max_nodes, bool) or not isinstance(max_nodes, int) or max_nodes < 2):
            raise ValueError(f"{where}: max_nodes must be an integer >= 2, got {max_nodes!r}")
        families = data.get("families") or []
        if not isinstance(families, list):
            raise ValueError(f"{where}: 'families' must be a list of families")
        plans: list[Plan] = []
        for i, fam in enumerate(families):
            plans.extend(_expand_family(fam, max_nodes, f"{where}: families[{i}]"))
        extra = data.get("actions") or []
        if not isinstance(extra, list):
            raise ValueError(f"{where}: 'actions' must be a list of plan strings like 'chain:4/block'")
        for j, text in enumerate(extra):
            if not isinstance(text, str):
                raise ValueError(f"{where}: actions[{j}] must be a plan string like 'chain:4/block', got {text!r}")
            verifier = text.partition("/")[2].strip()
            plans.append(_make_plan(lambda t=text: Plan.parse(t), f"{where}: actions[{j}] ({text})", verifier))
        if not plans:
            raise ValueError(f"{where}: no actions (give 'families' and/or 'actions')")
        name = data.get("name", "custom")
        return cls(plans, name=str(name))

    @classmethod
    def from_yaml(cls, path: str | Path) -> ActionSpace:
        """Read a grid from a YAML file (format in the module docstring).

        Raises:
            FileNotFoundError: no such file.
            ValueError: malformed YAML or an invalid grid (the message names the family and entry).
        """
        import yaml

        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"action space file {path} does not exist")
        try:
            data = yaml.safe_load(path.read_text())
        except yaml.YAMLError as err:
            raise ValueError(f"{path}: not valid YAML: {err}") from None
        return cls.from_dict(data if data is not None else {}, where=str(path))

    @classmethod
    def default(cls) -> ActionSpace:
        """The default grid (a few hundred actions over every family and lossless verifier)."""
        return cls.from_yaml(DEFAULT_ACTIONS_PATH)


# ---------------------------------------------------------------------- YAML expansion
def _check_action_verifier(name: str) -> None:
    spec = get_verifier(name)
    if not spec.lossless or spec.greedy_only:
        ok = [n for n, s in REGISTRY.items() if s.lossless and not s.greedy_only]
        why = "is not lossless" if not spec.lossless else "is lossless only at temperature 0 (the engine uses it there)"
        raise ValueError(f"verifier {name!r} {why}; an action's verifier must be one of {', '.join(ok)}")


def _make_plan(build: Any, where: str, verifier: str | None = None) -> Plan:
    try:
        if verifier:  # refuse greedy-only and lossy verifiers before Plan's own check
            _check_action_verifier(verifier)
        plan = build()
        _check_action_verifier(plan.verifier)
    except ValueError as err:
        raise ValueError(f"{where}: {err}") from None
    return plan


def _sizes(value: Any, key: str, where: str) -> list[Any]:
    """A size list: an int, a list of ints, or an inclusive range string ``"a-b"``; widths are lists."""
    if key == "widths":
        if not isinstance(value, list) or not value:
            raise ValueError(f"{where}: 'widths' must be a non-empty list of width lists, e.g. [[2, 2], '3x2x1']")
        out = []
        for w in value:
            if isinstance(w, str) and re.fullmatch(r"\s*\d+(x\d+)*\s*", w):
                w = [int(x) for x in w.strip().split("x")]
            if not isinstance(w, list) or not w or not all(isinstance(x, int) and not isinstance(x, bool) for x in w):
                raise ValueError(f"{where}: each 'widths' entry must be a list of integers or 'W1xW2x..', got {w!r}")
            out.append(tuple(w))
        return out
    if isinstance(value, str):
        m = re.fullmatch(r"\s*(\d+)\s*-\s*(\d+)\s*", value)
        if not m or int(m.group(1)) > int(m.group(2)):
            raise ValueError(f"{where}: '{key}' range must look like '1-8' (low <= high), got {value!r}")
        return list(range(int(m.group(1)), int(m.group(2)) + 1))
    values = value if isinstance(value, list) else [value]
    if not values or not all(isinstance(x, int) and not isinstance(x, bool) for x in values):
        raise ValueError(f"{where}: '{key}' must be an integer, a list of integers or a range 'a-b', got {value!r}")
    return values


def _expand_family(fam: Any, max_nodes: int | None, where: str) -> list[Plan]:
    if not isinstance(fam, Mapping):
        raise ValueError(f"{where}: a family must be a mapping with 'law', its sizes and 'verifiers'")
    law = fam.get("law")
    if law not in _FAMILIES:
        raise ValueError(f"{where}: unknown law {fam.get('law')!r}; use one of {', '.join(_FAMILIES)}")
    keys, build = _FAMILIES[law]
    allowed = {"law", "verifiers", *keys}
    unknown = set(fam) - allowed
    missing = [k for k in (*keys, "verifiers") if k not in fam]
    if unknown or missing:
        raise ValueError(
            f"{where} ({law}): unknown keys {sorted(unknown)}, missing keys {missing}; a {law} family takes "
            f"{', '.join(keys)} and verifiers"
        )
    verifiers = fam["verifiers"]
    if isinstance(verifiers, str):
        verifiers = [verifiers]
    if not isinstance(verifiers, list) or not verifiers or not all(isinstance(v, str) for v in verifiers):
        raise ValueError(f"{where} ({law}): 'verifiers' must be a non-empty list of verifier names")
    grids = [_sizes(fam[k], k, f"{where} ({law})") for k in keys]
    plans: list[Plan] = []
    for combo in itertools.product(*grids):
        sizes = dict(zip(keys, combo, strict=True))
        label = "x".join("x".join(map(str, v)) if isinstance(v, tuple) else str(v) for v in combo)
        try:
            shape = build(sizes)
        except ValueError as err:
            raise ValueError(f"{where} ({law}:{label}): {err}") from None
        if max_nodes is not None and shape.max_nodes > max_nodes:
            continue
        for v in verifiers:
            plans.append(_make_plan(lambda s=shape, v=v: Plan(s, v), f"{where} ({law}:{label}/{v})", v))
    if not plans:
        raise ValueError(f"{where} ({law}): every tree in this family has more than max_nodes={max_nodes} nodes")
    return plans


def parse_plans(text: str | Sequence[str]) -> list[Plan]:
    """Plans from a comma-separated string (or a list of strings); blanks are skipped."""
    items = text.split(",") if isinstance(text, str) else list(text)
    return [Plan.parse(t.strip()) for t in items if t.strip()]
