"""Tree shapes and drafting laws.

A :class:`TreeShape` says *how* a draft tree is drawn from the draft model. Its
:class:`DraftLaw` is the part of that description a verifier's losslessness depends on
(docs/algorithms.md §1: "the drafting law is part of the verifier's contract").

Shapes are canonical: a shape that is, as a law, a single chain (``iid(1, L)``,
``delayed(t, 1, L)``, ``delayed(t, K, 0)``, ``without_replacement((1, 1))``) is built as
``chain``; ``delayed(0, K, L)`` is built as ``iid(K, L)``. So the law tag is always the most
specific one, and every verifier that accepts a richer law accepts the chain too.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass


class DraftLaw(str, enum.Enum):
    """The drafting law a tree was drawn from."""

    CHAIN = "chain"
    """One path, each token drawn from the draft's distribution at its parent."""
    IID = "iid"
    """K i.i.d. rollouts from the root; child draws kept with multiplicity."""
    DELAYED = "delayed"
    """A single trunk path, then K i.i.d. rollouts from the trunk's end (DDTE, docs/algorithms.md §8)."""
    WITHOUT_REPLACEMENT = "without_replacement"
    """k distinct children per node, drawn one after another without replacement."""
    # Dynamic laws: the tree grows level by level and a drafting policy
    # (:mod:`adaptive_spec.trees.policy`) decides, from draft-side information only and before
    # the children are drawn, how many children each frontier node gets.
    DYNAMIC_CHAIN = "dynamic_chain"
    """One path whose length a policy decides while drafting (0 or 1 child per node)."""
    DYNAMIC_IID = "dynamic_iid"
    """Each node gets a policy-chosen number of i.i.d. draws, kept with multiplicity."""
    DYNAMIC_WOR = "dynamic_wor"
    """Each node gets a policy-chosen number of distinct children, drawn without replacement."""
    DETERMINISTIC = "deterministic"
    """Distinct children that are a deterministic function of the root context (a trie of looked-up
    continuations, :func:`adaptive_spec.trees.lookup.lookup_trie`); the draft rows carry no information."""

    @property
    def dynamic(self) -> bool:
        """Whether trees of this law are grown by a drafting policy."""
        return self in _DYNAMIC_LAWS


@dataclass(frozen=True)
class TreeShape:
    """A drafting recipe: which law and which sizes.

    Build shapes with the constructors :meth:`chain`, :meth:`iid`, :meth:`delayed`,
    :meth:`without_replacement` (or :meth:`parse`) and :meth:`lookup` (a trie found in the context,
    never sampled), not with the dataclass constructor.

    Attributes:
        law: the drafting law.
        trunk: length of the single trunk path (the whole length for a chain).
        paths: number K of i.i.d. rollouts after the trunk (1 for a chain); a lookup trie's most paths.
        branch_len: length of each rollout after the trunk (0 for a chain).
        widths: number of distinct children per node at each depth (without replacement only).
    """

    law: DraftLaw
    trunk: int = 0
    paths: int = 1
    branch_len: int = 0
    widths: tuple[int, ...] = ()
    budget: int = 0  # dynamic laws: the most drafted nodes, root excluded

    # ----------------------------------------------------------------- constructors
    @classmethod
    def chain(cls, length: int) -> TreeShape:
        """A single path of ``length`` draft tokens."""
        _check_int("length", length, 0)
        return cls(DraftLaw.CHAIN, trunk=length)

    @classmethod
    def iid(cls, paths: int, length: int) -> TreeShape:
        """``paths`` i.i.d. rollouts of ``length`` tokens from the root."""
        _check_int("paths", paths, 1)
        _check_int("length", length, 0)
        if paths == 1 or length == 0:
            return cls.chain(length)
        return cls(DraftLaw.IID, trunk=0, paths=paths, branch_len=length)

    @classmethod
    def delayed(cls, trunk: int, paths: int, branch_len: int) -> TreeShape:
        """A trunk of ``trunk`` tokens, then ``paths`` i.i.d. rollouts of ``branch_len`` tokens."""
        _check_int("trunk", trunk, 0)
        _check_int("paths", paths, 1)
        _check_int("branch_len", branch_len, 0)
        if paths == 1 or branch_len == 0:
            return cls.chain(trunk + (branch_len if paths == 1 else 0))
        if trunk == 0:
            return cls.iid(paths, branch_len)
        return cls(DraftLaw.DELAYED, trunk=trunk, paths=paths, branch_len=branch_len)

    @classmethod
    def without_replacement(cls, widths: tuple[int, ...] | list[int]) -> TreeShape:
        """``widths[d]`` distinct children per node at depth ``d``, drawn without replacement."""
        widths = tuple(int(w) for w in widths)
        for w in widths:
            _check_int("width", w, 1)
        if all(w == 1 for w in widths):
            return cls.chain(len(widths))
        return cls(DraftLaw.WITHOUT_REPLACEMENT, widths=widths)

    @classmethod
    def lookup(cls, paths: int, length: int) -> TreeShape:
        """A trie of up to ``paths`` distinct looked-up continuations of up to ``length`` tokens (one path: a chain)."""
        _check_int("paths", paths, 1)
        _check_int("length", length, 0)
        if paths == 1 or length == 0:
            return cls.chain(length)
        return cls(DraftLaw.DETERMINISTIC, trunk=0, paths=paths, branch_len=length)

    @classmethod
    def dynamic(cls, law: DraftLaw, depth: int, budget: int) -> TreeShape:
        """The envelope of a policy-grown tree: at most ``depth`` levels and ``budget`` drafted nodes."""
        if not isinstance(law, DraftLaw) or not law.dynamic:
            raise ValueError(f"tree shape: {law!r} is not a dynamic drafting law")
        _check_int("depth", depth, 0)
        _check_int("budget", budget, 0)
        if law is DraftLaw.DYNAMIC_CHAIN:
            budget = min(budget, depth)
        return cls(law, trunk=depth, budget=budget)

    # ----------------------------------------------------------------- properties
    @property
    def depth(self) -> int:
        """Maximum depth of a drafted node (number of draft tokens on the longest path)."""
        if self.law.dynamic:
            return self.trunk
        if self.law is DraftLaw.WITHOUT_REPLACEMENT:
            return len(self.widths)
        return self.trunk + self.branch_len

    @property
    def branch_depth(self) -> int:
        """Depth of the node where i.i.d. branching starts (the trunk length)."""
        return self.trunk if self.law in (DraftLaw.IID, DraftLaw.DELAYED) else 0

    @property
    def max_nodes(self) -> int:
        """Largest possible number of nodes, root included (duplicates merged make it smaller)."""
        if self.law.dynamic:
            return 1 + self.budget
        if self.law is DraftLaw.WITHOUT_REPLACEMENT:
            total, level = 1, 1
            for w in self.widths:
                level *= w
                total += level
            return total
        return 1 + self.trunk + self.paths * self.branch_len

    @property
    def num_draws(self) -> int:
        """Number of tokens the draft model samples to build the tree (before merging)."""
        if self.law.dynamic:
            return self.budget
        if self.law is DraftLaw.WITHOUT_REPLACEMENT:
            return self.max_nodes - 1
        return self.trunk + self.paths * self.branch_len

    def truncated(self, max_depth: int) -> TreeShape:
        """This shape with every path cut to at most ``max_depth`` tokens (canonical constructors)."""
        if self.depth <= max_depth:
            return self
        max_depth = max(0, max_depth)
        if self.law.dynamic:
            return TreeShape.dynamic(self.law, max_depth, self.budget)
        if self.law is DraftLaw.WITHOUT_REPLACEMENT:
            return TreeShape.without_replacement(self.widths[:max_depth])
        if self.law is DraftLaw.CHAIN:
            return TreeShape.chain(min(self.trunk, max_depth))
        if self.law is DraftLaw.DETERMINISTIC:
            return TreeShape.lookup(self.paths, max_depth)
        trunk = min(self.trunk, max_depth)
        return TreeShape.delayed(trunk, self.paths, min(self.branch_len, max_depth - trunk))

    def __str__(self) -> str:
        if self.law.dynamic:
            return f"{self.law.value}:{self.trunk}x{self.budget}"
        if self.law is DraftLaw.CHAIN:
            return f"chain:{self.trunk}"
        if self.law is DraftLaw.IID:
            return f"iid:{self.paths}x{self.branch_len}"
        if self.law is DraftLaw.DELAYED:
            return f"delayed:{self.trunk}x{self.paths}x{self.branch_len}"
        if self.law is DraftLaw.DETERMINISTIC:
            return f"trie:{self.paths}x{self.branch_len}"
        return "wor:" + "x".join(str(w) for w in self.widths)

    @classmethod
    def parse(cls, text: str) -> TreeShape:
        """Parse ``chain:L``, ``iid:KxL``, ``delayed:TxKxB`` or ``wor:W1xW2x...``.

        Raises:
            ValueError: if the text does not follow that grammar.
        """
        m = re.fullmatch(r"\s*(chain|iid|delayed|wor|without_replacement):([0-9]+(?:x[0-9]+)*)\s*", text)
        if not m:
            raise ValueError(
                f"cannot parse tree shape {text!r}: expected chain:L, iid:KxL, delayed:TxKxB "
                "or wor:W1xW2x... (for example 'delayed:2x3x3')"
            )
        kind, sizes = m.group(1), [int(s) for s in m.group(2).split("x") if s]
        expected = {"chain": 1, "iid": 2, "delayed": 3}
        if kind in expected and len(sizes) != expected[kind]:
            raise ValueError(f"tree shape {text!r}: '{kind}' takes {expected[kind]} sizes")
        if kind == "chain":
            return cls.chain(sizes[0])
        if kind == "iid":
            return cls.iid(sizes[0], sizes[1])
        if kind == "delayed":
            return cls.delayed(*sizes)
        return cls.without_replacement(sizes)


_DYNAMIC_LAWS = frozenset({DraftLaw.DYNAMIC_CHAIN, DraftLaw.DYNAMIC_IID, DraftLaw.DYNAMIC_WOR})


def _check_int(name: str, value: int, minimum: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"tree shape: {name} must be an integer >= {minimum}, got {value!r}")
