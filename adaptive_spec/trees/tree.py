"""The draft tree: distinct prefixes of the root context with their draft distributions."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np
import torch

from adaptive_spec.trees.shapes import DraftLaw, TreeShape


@dataclass
class DraftTree:
    """A draft tree over the root context.

    Node 0 is the root (the empty prefix ``()``). Every other node is a distinct prefix: its
    parent's prefix plus one drafted token. Nodes are numbered in creation order, so a parent
    always has a smaller index than its children.

    Attributes:
        tokens: ``tokens[i]`` is node i's last token (-1 for the root). A drafter that drew the tokens on the
            device may pass them as a LongTensor[N]: the host list is then read on first use (one host sync),
            or handed over by a caller that read them together with something else (:meth:`set_host_tokens`).
        parents: ``parents[i]`` is node i's parent index (-1 for the root). None for a tree drafted into the slots
            of a static shape (:meth:`from_slots`): its parents and ``child_draws`` come with its tokens' read.
        depths: ``depths[i]`` is the number of drafted tokens in node i's prefix.
        draft_probs: Tensor[num_nodes, V]; row i is the draft's next-token distribution after
            prefix i, the law its children were drawn from. Rows of nodes that were never
            expanded (leaves) are unused and may be zero.
        child_draws: ``child_draws[i]`` lists node indices of node i's children in the order
            the drafting law drew them, with multiplicity for i.i.d. drafting (a token drawn
            by three paths appears three times). A node in no ``child_draws`` (a slot tree's duplicate or
            dropped draw) is unused: no verifier reaches it (:attr:`used`).
        shape: the :class:`TreeShape` it was drawn with; ``shape.law`` is the law tag that
            verifiers check.
    """

    tokens: list[int]
    parents: list[int] | None
    depths: list[int]
    draft_probs: torch.Tensor  # [N, V]
    child_draws: list[list[int]] | None
    shape: TreeShape
    # Device copies of tokens/parents/depths, made once (or handed over by a drafter that drew on the device).
    _tensors: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        n = len(self.depths)
        if self.draft_probs.dim() != 2 or self.draft_probs.shape[0] != n:
            raise ValueError(f"DraftTree: draft_probs must be [num_nodes={n}, V], got {tuple(self.draft_probs.shape)}")
        if len(self._tokens_any) != n:
            raise ValueError("DraftTree: tokens, parents, depths and child_draws must have one entry per node")
        if self.__dict__.get("_host_parents") is not None:
            self._check_structure()
        elif self.__dict__.get("_slots") is None:
            raise ValueError("DraftTree: parents and child_draws are only left out of a slot tree (from_slots)")
        if not self.tokens_on_host:  # tokens drawn on the device: they are the tree's device copy
            t = self.__dict__["_device_tokens"]
            self._tensors["tokens", _resolved(t.device)] = t

    def _check_structure(self) -> None:
        n, parents = len(self.depths), self.parents
        if not (len(parents) == len(self.child_draws) == n):
            raise ValueError("DraftTree: tokens, parents, depths and child_draws must have one entry per node")
        if n == 0 or parents[0] != -1:
            raise ValueError("DraftTree: node 0 must be the root, with parent -1")
        for i, par in enumerate(parents):
            if i and not 0 <= par < i:
                raise ValueError(f"DraftTree: node {i} has parent {par}, which is not an earlier node")

    @classmethod
    def from_slots(cls, layout, tokens: torch.Tensor, valid: torch.Tensor, draft_probs: torch.Tensor) -> DraftTree:
        """A tree drafted on the device into the slots of a static shape (:mod:`adaptive_spec.trees.slots`).

        ``tokens`` (LongTensor[N]) and ``valid`` (BoolTensor[N], whether each slot's draw happened) stay on the
        device until the first host read, which brings back both (:meth:`device_parts`) and merges them into the
        tree's parents and child draws (``layout.merge``). The slots' depths and ancestor matrix are static.
        """
        tree = cls.__new__(cls)
        tree.__dict__["_slots"] = (layout, valid)
        tree.__init__(tokens, None, list(layout.depths), draft_probs, None, layout.shape)
        ancestors, depths = layout.tensors(tokens.device)
        tree.keep_tensors(depths=depths, ancestors=ancestors)
        return tree

    # ----------------------------------------------------------------- structure
    @property
    def law(self) -> DraftLaw:
        """The drafting law this tree was drawn from."""
        return self.shape.law

    @property
    def num_nodes(self) -> int:
        return len(self.depths)

    @property
    def tokens_on_host(self) -> bool:
        """Whether the host lists are there (False: a tree drafted on the device whose tokens, and for a slot
        tree whose structure, wait for the first host read).
        """
        return self.__dict__.get("_host_tokens") is not None and self.__dict__.get("_host_parents") is not None

    @property
    def slots(self):
        """``(layout, valid)`` of a tree drafted into slots (:meth:`from_slots`), else None."""
        return self.__dict__.get("_slots")

    def device_parts(self) -> list[torch.Tensor]:
        """What a host read must bring back for this tree (:meth:`take_host`): nothing once read; the tokens of a
        tree drafted on the device; a slot tree's tokens and validity flags.
        """
        if self.tokens_on_host:
            return []
        slots = self.__dict__.get("_slots")
        tokens = self.__dict__["_device_tokens"]
        return [tokens] if slots is None else [tokens, slots[1]]

    def take_host(self, values: list[list[int]]) -> None:
        """Hand over the host values of :meth:`device_parts`, read by the caller in its own host read."""
        if len(values) != len(self.device_parts()):
            raise ValueError(f"DraftTree.take_host: {len(values)} parts for {len(self.device_parts())}")
        if not values:
            return
        self.set_host_tokens(values[0])
        slots = self.__dict__.get("_slots")
        if slots is not None:
            parents, child_draws = slots[0].merge(self.tokens, values[1])
            self.__dict__["_host_parents"], self.__dict__["_host_child_draws"] = parents, child_draws
            self._check_structure()

    def set_host_tokens(self, values: list[int]) -> None:
        """Hand over the host list of a tree drafted on the device, read by the caller in its own host read."""
        if len(values) != self.num_nodes:
            raise ValueError(f"DraftTree.set_host_tokens: {len(values)} tokens for {self.num_nodes} nodes")
        self.__dict__["_host_tokens"] = [int(t) for t in values]

    def _read_host(self) -> None:
        """Read :meth:`device_parts` in one host read."""
        parts = self.device_parts()
        if parts:
            flat = torch.cat([t.reshape(-1).long() for t in parts]).tolist()  # one host read
            sizes = [t.numel() for t in parts]
            self.take_host([flat[sum(sizes[:i]) : sum(sizes[: i + 1])] for i in range(len(parts))])

    @property
    def _tokens_any(self) -> list[int] | torch.Tensor:
        host = self.__dict__.get("_host_tokens")
        return host if host is not None else self.__dict__["_device_tokens"]

    @property
    def vocab_size(self) -> int:
        return self.draft_probs.shape[1]

    @property
    def device(self) -> torch.device:
        return self.draft_probs.device

    @cached_property
    def children(self) -> list[list[int]]:
        """Distinct children of each node in order of first appearance among the draws."""
        out: list[list[int]] = []
        for draws in self.child_draws:
            seen: list[int] = []
            for c in draws:
                if c not in seen:
                    seen.append(c)
            out.append(seen)
        return out

    @cached_property
    def used(self) -> list[bool]:
        """Per node, whether a verifier can reach it: the root and every node among a used node's draws.

        Every node of a drawn or looked-up tree is; a slot tree's duplicates and dropped draws are not.
        """
        out = [False] * self.num_nodes
        out[0] = True
        for i, draws in enumerate(self.child_draws):  # parents precede children
            if out[i]:
                for c in draws:
                    out[c] = True
        return out

    @cached_property
    def prefixes(self) -> list[tuple[int, ...]]:
        """Node i's token tuple; index 0 is the root ``()``."""
        out: list[tuple[int, ...]] = [()]
        for i in range(1, self.num_nodes):
            out.append(out[self.parents[i]] + (self.tokens[i],))
        return out

    def prefix(self, node: int) -> tuple[int, ...]:
        """``prefixes[node]`` without building every node's (a walk up to the root)."""
        if "prefixes" in self.__dict__:
            return self.__dict__["prefixes"][node]
        tokens = self.tokens
        return tuple(tokens[i] for i in self.path(node)[1:])

    def path(self, node: int) -> list[int]:
        """Node indices from the root to ``node``, both included."""
        out = [node]
        while self.parents[out[-1]] >= 0:
            out.append(self.parents[out[-1]])
        return out[::-1]

    def child_with_token(self, node: int, token: int) -> int | None:
        """The child of ``node`` whose last token is ``token``, or None."""
        for c in self.children[node]:
            if self.tokens[c] == token:
                return c
        return None

    @cached_property
    def max_depth(self) -> int:
        return max(self.depths)

    def parents_tensor(self, device: torch.device | None = None) -> torch.Tensor:
        """LongTensor[N] of parent indices (-1 for the root)."""
        return self._tensor("parents", device)

    def tokens_tensor(self, device: torch.device | None = None) -> torch.Tensor:
        """LongTensor[N] of node tokens (-1 for the root)."""
        return self._tensor("tokens", device)

    def depths_tensor(self, device: torch.device | None = None) -> torch.Tensor:
        """LongTensor[N] of node depths."""
        return self._tensor("depths", device)

    def ancestors_tensor(self, device: torch.device | None = None) -> torch.Tensor:
        """BoolTensor[N, N], ``trees.ancestor_matrix(parents)``: entry (i, j) says whether node j is node i or one of
        its ancestors (built on the host and copied once, unless a drafter handed it over).
        """
        key = ("ancestors", _resolved(device if device is not None else self.device))
        if key not in self._tensors:
            self._tensors[key] = torch.tensor(ancestor_rows(self.parents), dtype=torch.bool, device=key[1])
        return self._tensors[key]

    def children_rows(self) -> list[list[int]]:
        """:attr:`children` as a table: one row per node, padded with ``num_nodes`` to the widest node's count."""
        return _padded_rows(self.children, self.num_nodes)

    def draws_rows(self) -> list[list[int]]:
        """:attr:`child_draws` as a table (with multiplicity, in draw order), padded with ``num_nodes`` to the most
        draws of a node.
        """
        return _padded_rows(self.child_draws, self.num_nodes)

    def children_tensor(self, device: torch.device | None = None) -> torch.Tensor:
        """LongTensor[N, K] of :meth:`children_rows` (built on the host and copied once, unless a drafter handed it
        over).
        """
        return self._tensor("children", device, self.children_rows)

    def draws_tensor(self, device: torch.device | None = None) -> torch.Tensor:
        """LongTensor[N, D] of :meth:`draws_rows` (built on the host and copied once, unless a drafter handed it
        over).
        """
        return self._tensor("draws", device, self.draws_rows)

    def keep_tensors(self, **tensors: torch.Tensor) -> None:
        """Hand over device copies of ``tokens``, ``parents``, ``depths`` (equal to the lists), ``ancestors``
        (:meth:`ancestors_tensor`), ``children`` (:meth:`children_tensor`) or ``draws`` (:attr:`child_draws` as a
        table, padded with ``num_nodes``: only from a drafter), e.g. from a drafter that drew the tokens on the
        device: the ``*_tensor`` methods then copy nothing.
        """
        n = self.num_nodes
        for name, t in tensors.items():
            want = (n, n) if name == "ancestors" else (n,)
            if name == "children":  # the structure is on the host then (a slot tree's never is handed over)
                want = (n, max(1, max(map(len, self.children))))
            elif name == "draws":
                want = (n, max(1, max(map(len, self.child_draws))))
            if name not in ("tokens", "parents", "depths", "ancestors", "children", "draws") or tuple(t.shape) != want:
                raise ValueError(
                    f"DraftTree.keep_tensors: {name} must be one of tokens/parents/depths ([num_nodes]), "
                    "ancestors ([num_nodes, num_nodes]), children ([num_nodes, widest]) or draws ([num_nodes, most "
                    "draws])"
                )
            self._tensors[name, _resolved(t.device)] = t

    def has_tensors(self, device: torch.device | str, *names: str) -> bool:
        """Whether the tree holds device copies of ``names`` (e.g. ``"tokens"``) on ``device``."""
        device = _resolved(device)
        return all((n, device) in self._tensors for n in names)

    def _tensor(self, name: str, device: torch.device | None, host=None) -> torch.Tensor:
        """The LongTensor copy of ``name`` on ``device`` (the attribute of that name, or ``host()``), made once."""
        key = (name, _resolved(device if device is not None else self.device))
        if key not in self._tensors:
            values = getattr(self, name) if host is None else host()
            self._tensors[key] = torch.tensor(values, dtype=torch.long, device=key[1])
        return self._tensors[key]


def _padded_rows(lists: list[list[int]], fill: int) -> list[list[int]]:
    """``lists`` padded with ``fill`` to the longest one's length (at least 1)."""
    width = max(1, max(map(len, lists)))
    return [r + [fill] * (width - len(r)) for r in lists]


def ancestor_masks(parents: Sequence[int]) -> list[int]:
    """The ancestor matrix of a tree as one bit mask a node: bit ``j`` of mask ``i`` is set when node ``j`` is node
    ``i`` or one of its ancestors (parents precede children).
    """
    masks: list[int] = []
    for i, par in enumerate(parents):
        masks.append((masks[par] if par >= 0 else 0) | (1 << i))
    return masks


def unpack_masks(masks: Sequence[int]) -> np.ndarray:
    """Bit masks (:func:`ancestor_masks`) unpacked at once into a uint8 [N, N] matrix of 0/1: bit ``j`` of ``masks[i]``
    at ``[i, j]`` (unpacking every entry in Python costs a CPU 0.4 ms at 48 nodes).
    """
    n = len(masks)
    width = (n + 7) // 8
    packed = np.frombuffer(b"".join(a.to_bytes(width, "little") for a in masks), dtype=np.uint8).reshape(n, width)
    return np.unpackbits(packed, axis=1, count=n, bitorder="little")


def ancestor_rows(parents: list[int]) -> list[list[bool]]:
    """The ancestor matrix of a tree as host lists: row i holds node i and its ancestors (parents precede children)."""
    return unpack_masks(ancestor_masks(parents)).astype(bool).tolist()


def _get_tokens(self: DraftTree) -> list[int]:
    host = self.__dict__.get("_host_tokens")
    if host is None:  # drafted on the device and not read yet: one host read
        self._read_host()
        host = self.__dict__["_host_tokens"]
    return host


def _structure(name: str) -> property:
    """``parents`` or ``child_draws``: a host list, or None given to a slot tree (filled by its first host read)."""
    key = "_host_" + name

    def get(self: DraftTree) -> list:
        if self.__dict__.get(key) is None:
            self._read_host()
        return self.__dict__[key]

    def set_(self: DraftTree, value: list | None) -> None:
        self.__dict__[key] = None if value is None else list(value)

    return property(get, set_)


def _set_tokens(self: DraftTree, value: list[int] | torch.Tensor) -> None:
    if isinstance(value, torch.Tensor):  # drawn on the device: the host list waits for a read
        if value.dim() != 1:
            raise ValueError("DraftTree: tokens as a tensor must be a LongTensor[num_nodes]")
        self.__dict__["_device_tokens"] = value
        self.__dict__["_host_tokens"] = None
    else:
        self.__dict__["_host_tokens"] = list(value)


# ``tokens`` is a dataclass field whose host list may be read lazily; set after the dataclass is built so that
# the generated ``__init__`` goes through the setter.
DraftTree.tokens = property(_get_tokens, _set_tokens, doc="Node i's last token (-1 for the root), as a host list.")
DraftTree.parents = _structure("parents")
DraftTree.child_draws = _structure("child_draws")


def _resolved(device: torch.device | str) -> torch.device:
    """``device`` with its index ("cuda" and "cuda:0" name one device)."""
    device = torch.device(device)
    if device.type != "cpu" and device.index is None:
        device = torch.empty(0, device=device).device
    return device
