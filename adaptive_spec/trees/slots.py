"""Slots: a static tree shape as a fixed layout, so that it can be drafted on the device without a host read.

A static shape (``iid``, ``delayed``, ``wor``) has a fixed number of draws per level; what the draws turn
out to be (two walkers drawing the same token, a draw without replacement that runs out of support) only
changes which prefixes are distinct. The engine therefore drafts into **slots**, one per draw, numbered
level by level (the root is slot 0), with a parent slot fixed by the shape:

* walker laws (``iid``, ``delayed``): one slot per walker and level; a walker's next slot hangs under its
  current one (before branching every walker is the trunk's one walker);
* without replacement: every slot at depth ``d`` has ``min(widths[d], V)`` child slots, in draw order.

Every slot is fed to the draft and to the target under the fixed ancestor matrix of :attr:`SlotLayout.parents`
(its mask, positions and depths are built once per shape and device), so a level's inputs never wait for
the host. A shape cut to a smaller depth (a plan's last tokens, :meth:`TreeShape.truncated`) has the first
levels of the deeper shape's slots: its device tensors are slices of the deeper layout's, not a new copy. A
walker standing on a duplicate reads that slot's own row, which equals the row of the first slot with the same
prefix: the same law.

Once the tokens are read (with the verifier's one host read), :meth:`SlotLayout.merge` gives the tree of
:class:`~adaptive_spec.trees.DraftTree`, numbered by slot: a slot whose prefix an earlier slot already holds
points to it (its draw is kept, with multiplicity, in its parent's ``child_draws``), and a draw of probability
zero (without replacement, when the support runs out) is dropped with everything under it. Those slots stay
in the tree as **unused** nodes: scored by the target, in no node's ``child_draws``, so no verifier reaches
them (:attr:`DraftTree.used`). The law of the used nodes is that of :func:`adaptive_spec.trees.sample_tree`.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import torch

from adaptive_spec.trees.shapes import DraftLaw, TreeShape
from adaptive_spec.trees.tree import ancestor_rows


@dataclass(frozen=True)
class SlotLayout:
    """The fixed slots of a static tree shape (see the module docstring).

    Attributes:
        shape: the static shape (``iid``, ``delayed`` or ``wor``).
        parents: the parent slot of each slot (-1 for the root).
        depths: each slot's depth.
        levels: per draft level d (drawing depth d + 1): ``(first, end)``, the slots it fills.
        draws: per level, the draws per frontier slot (``min(widths[d], V)`` without replacement; 1 for walkers).
        spread: per level, for walker laws: whether the level's walkers all start from one slot (the root or
            the trunk's end: its row is repeated), else each walker from its own slot.
    """

    shape: TreeShape
    parents: tuple[int, ...]
    depths: tuple[int, ...]
    levels: tuple[tuple[int, int], ...]
    draws: tuple[int, ...]
    spread: tuple[bool, ...]
    _device: dict = field(default_factory=dict, init=False, repr=False, compare=False, hash=False)
    _source: SlotLayout | None = field(default=None, init=False, repr=False, compare=False, hash=False)

    @property
    def num_slots(self) -> int:
        return len(self.parents)

    @property
    def walkers(self) -> bool:
        """Whether the shape is drawn by walkers (with replacement) rather than without replacement."""
        return self.shape.law is not DraftLaw.WITHOUT_REPLACEMENT

    def _on_device(self, name: str, device: torch.device, cut) -> object:
        """Device entry ``name`` (one of :data:`_ENTRIES`), made once per device: its host data (:meth:`_host`) in
        one copy; for a truncation of a deeper layout (``_source``), ``cut`` of that layout's entry (no copy).
        """
        key = name, str(device)
        if key not in self._device:
            src = self._source
            self._device[key] = (
                _copied([self._host(name)], device)[0] if src is None else cut(getattr(src, name)(device))
            )
        return self._device[key]

    def _host(self, name: str) -> list[tuple[list[int], tuple[int, ...], bool]]:
        """The host data of device entry ``name``: per tensor, its values (flat), its shape and whether it is bool."""
        n = self.num_slots
        if name == "tensors":
            ancestors = [int(b) for row in ancestor_rows(list(self.parents)) for b in row]
            return [(ancestors, (n, n), True), (list(self.depths), (n,), False)]
        if name == "parents_tensor":
            return [(list(self.parents), (n,), False)]
        cand, real = self._candidate_rows  # "candidates"
        shape = (len(cand), len(cand[0]))
        return [([c for row in cand for c in row], shape, False), ([int(b) for row in real for b in row], shape, True)]

    def tensors(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """``(ancestors BoolTensor[N, N], depths LongTensor[N])`` on ``device``: copied once per device."""
        n = self.num_slots
        return self._on_device("tensors", device, lambda t: (t[0][:n, :n].contiguous(), t[1][:n]))

    def parents_tensor(self, device: torch.device) -> torch.Tensor:
        """LongTensor[N] of the parent slots on ``device`` (-1 for the root): copied once per device."""
        return self._on_device("parents_tensor", device, lambda t: t[: self.num_slots])

    @property
    def fed(self) -> int:
        """The slots above the last level (fed to the draft, so with a draft row): ``0 .. fed - 1``."""
        return self.levels[-1][0]

    def candidates(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """``(cand LongTensor[fed, K], real BoolTensor[fed, K])``: the slots that may hold each fed slot's draws.

        Without replacement: a slot's own child slots, in draw order. Walker laws: every slot of the next level
        (K = the number of walkers), in walker order; the draws of a slot are those of the walkers standing on
        the same prefix (:meth:`drawn`), and before branching, of the one walker. Padding points at slot 0.
        Copied once per device.
        """
        cand, _ = self._candidate_rows
        f, k = len(cand), len(cand[0])
        return self._on_device("candidates", device, lambda t: (t[0][:f, :k].contiguous(), t[1][:f, :k].contiguous()))

    @functools.cached_property
    def _candidate_rows(self) -> tuple[list[list[int]], list[list[bool]]]:
        rows: list[list[int]] = [[] for _ in range(self.fed)]
        for d, (first, end) in enumerate(self.levels):
            for c in range(first, end):
                rows[self.parents[c]].append(c)
            if self.walkers and d > self.shape.branch_depth:  # every walker sees the next level's slots
                for s in range(*self.levels[d - 1]):
                    rows[s] = list(range(first, end))
        k = max(len(r) for r in rows)
        return [r + [0] * (k - len(r)) for r in rows], [[True] * len(r) + [False] * (k - len(r)) for r in rows]

    @functools.cached_property
    def candidate_widths(self) -> tuple[int, ...]:
        """Per level d, the most candidates a slot of depth d has (the real columns of :meth:`candidates` there)."""
        _, real = self._candidate_rows
        bounds = [(0, 1), *self.levels[:-1]]
        return tuple(max(sum(real[s]) for s in range(first, end)) for first, end in bounds)

    def candidates_host(self) -> list[list[int]]:
        """:meth:`candidates`' slots as host lists."""
        return self._candidate_rows[0]

    def drawn(self, tokens: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        """BoolTensor[fed, K]: whether candidate j of each fed slot (:meth:`candidates`) is a valid draw at that slot's
        prefix, from the slots' tokens and validity on the device.

        Without replacement, every real candidate (a slot's own children). Walker laws: above the branching point
        (the root, the trunk) every candidate is drawn there; below it, candidate j (walker j's next slot) is drawn at
        a walker's slot's prefix when the two walkers' tokens agree at every depth since branching: a few ops over
        all levels at once.
        """
        cand, real = self.candidates(tokens.device)
        out = real & valid[cand]
        if self.walkers:
            w = self.shape.paths
            first = self.levels[self.shape.branch_depth][0]  # the first walker slot below the branching point
            walk = tokens[first : self.fed].view(-1, w)  # [fed levels below it, W]
            apart = (walk[:, :, None] != walk[:, None, :]).cumsum(dim=0)  # [levels, W, W]: disagreements so far
            out[first:].bitwise_and_((apart == 0).view(-1, w))  # in place: no write back
        return out

    def merge(self, tokens: list[int], valid: list[int] | list[bool]) -> tuple[list[int], list[list[int]]]:
        """The drafted tree over the slots: ``(parents, child_draws)`` from the slots' tokens and validity.

        A slot's parent is the node its parent slot stands for; a valid slot whose prefix an earlier slot holds
        stands for that slot (its draw is recorded there, with multiplicity, and walkers under it continue
        from it); an invalid draw, and every slot under it, is in no ``child_draws``.
        """
        n = self.num_slots
        if len(tokens) != n or len(valid) != n:
            raise ValueError(f"SlotLayout.merge: {len(tokens)} tokens and {len(valid)} flags for {n} slots")
        node = list(range(n))  # the node each slot stands for
        used = [True] * n
        parents = [-1] * n
        child_draws: list[list[int]] = [[] for _ in range(n)]
        index: dict[tuple[int, int], int] = {}
        for s in range(1, n):
            par = node[self.parents[s]]
            parents[s] = par
            if not (valid[s] and used[par]):
                used[s] = False
                continue
            rep = index.setdefault((par, tokens[s]), s)
            node[s] = rep
            used[s] = rep == s
            child_draws[par].append(rep)
        return parents, child_draws


@functools.lru_cache(maxsize=64)
def slot_layout(shape: TreeShape, vocab_size: int) -> SlotLayout:
    """The slots of a static ``shape`` over a vocabulary of ``vocab_size`` tokens (cached per shape).

    A shape that is the truncation of one laid out before (a plan cut near a request's end) takes its device
    tensors from that layout's (:meth:`SlotLayout._on_device`): its slots are that layout's first levels.
    """
    layout = build_layout(shape, vocab_size)
    deeper = [
        other
        for (v, other) in reversed(_DEEPER)  # the latest first
        if v == vocab_size and other.shape.depth > shape.depth and other.shape.truncated(shape.depth) == shape
    ]
    if deeper:
        object.__setattr__(layout, "_source", max(deeper, key=lambda o: o.shape.depth))  # the latest deepest
    _DEEPER.append((vocab_size, layout))
    del _DEEPER[:-64]
    return layout


def layouts_to_device(layouts: list[SlotLayout], device: torch.device) -> None:
    """Put the device tensors of ``layouts`` (:meth:`SlotLayout.tensors`, :meth:`~SlotLayout.parents_tensor`,
    :meth:`~SlotLayout.candidates`) on ``device`` in one copy from the host, for those not there yet: a policy
    that drafts into several shapes' slots (``conf-delayed``) pays one transfer for all of them, once.
    """
    key = str(device)
    todo = [
        (lay, name)
        for lay in {id(lay): lay for lay in layouts}.values()
        if lay._source is None
        for name in _ENTRIES
        if (name, key) not in lay._device
    ]
    if todo:
        for (lay, name), made in zip(todo, _copied([lay._host(name) for lay, name in todo], device), strict=True):
            lay._device[name, key] = made


#: A layout's device entries (:meth:`SlotLayout._on_device`), each its method's name.
_ENTRIES = ("tensors", "parents_tensor", "candidates")


def _copied(entries: list[list[tuple[list[int], tuple[int, ...], bool]]], device: torch.device) -> list:
    """Each entry's tensors (:meth:`SlotLayout._host`) on ``device``, all in one copy from the host: a tuple per
    entry, or its one tensor.
    """
    parts = [part for entry in entries for part in entry]
    flat = torch.tensor([v for values, _, _ in parts for v in values], dtype=torch.long, device=device)
    pieces = iter(flat.split([len(values) for values, _, _ in parts]))
    out = []
    for entry in entries:
        made = []
        for _, shape, is_bool in entry:
            t = next(pieces).view(shape)
            made.append(t.bool() if is_bool else t)
        out.append(tuple(made) if len(made) > 1 else made[0])
    return out


_DEEPER: list[tuple[int, SlotLayout]] = []  # the layouts made by slot_layout, latest last: truncations' sources


def build_layout(shape: TreeShape, vocab_size: int) -> SlotLayout:
    """:func:`slot_layout`'s layout, built anew (its device tensors copied from the host when first asked for)."""
    law = shape.law
    if law not in (DraftLaw.IID, DraftLaw.DELAYED, DraftLaw.WITHOUT_REPLACEMENT):
        raise ValueError(f"slot_layout: {shape} is not a static tree of several paths (iid, delayed or wor)")
    parents, depths = [-1], [0]
    levels, draws, spread = [], [], []
    frontier = [0]  # the slots the level draws from (one per walker, or every slot at the level's depth)
    for d in range(shape.depth):
        if law is DraftLaw.WITHOUT_REPLACEMENT:
            k = min(shape.widths[d], vocab_size)
            starts = [f for f in frontier for _ in range(k)]
            spread.append(False)
        else:
            k = 1
            branching = d == shape.branch_depth
            starts = frontier * shape.paths if branching else frontier
            spread.append(branching)
        first = len(parents)
        parents += starts
        depths += [d + 1] * len(starts)
        levels.append((first, len(parents)))
        draws.append(k)
        frontier = list(range(first, len(parents)))
    return SlotLayout(shape, tuple(parents), tuple(depths), tuple(levels), tuple(draws), tuple(spread))
