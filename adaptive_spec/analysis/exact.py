"""Exact laws by probabilistic-program enumeration (docs/algorithms.md §9).

A program is any function of a :class:`~adaptive_spec.rng.Sampler`; drafting
(``sample_tree``) and every verifier are written against that interface. :func:`enumerate_law`
runs the program under a :class:`Chooser` that replays a forced prefix of choices, explores
every alternative of every new choice point, and multiplies the probabilities of the chosen
options. The result is the exact law of the program's output, without sampling noise;
zero-probability options are dropped, so branches such as q(x) = 0 are handled exactly.

On top of it: the exact output law of (drafting, verifier), its completion to a fixed
length with target samples, the completed total variation from the target law, and the
exact block efficiency.
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Callable, Hashable
from typing import TypeVar

import torch

from adaptive_spec.rng import Sampler
from adaptive_spec.trees import DraftPolicy, DraftTree, TreeShape, sample_policy_tree, sample_tree

T = TypeVar("T", bound=Hashable)
ProbsFn = Callable[[tuple[int, ...]], torch.Tensor]


class EnumerationBudgetError(RuntimeError):
    """The enumeration needed more runs than allowed."""


class Chooser:
    """A :class:`Sampler` that follows forced choices, then takes option 0 and records the rest."""

    def __init__(self, forced: list[int]) -> None:
        self.forced = forced
        self.trace: list[int] = []
        self.n_options: list[int] = []
        self.weight = 1.0
        self._options: list[list[tuple[object, float]]] = []

    def _choose(self, options: list[tuple[object, float]]) -> object:
        pos = len(self.trace)
        pick = self.forced[pos] if pos < len(self.forced) else 0
        value, prob = options[pick]
        self.trace.append(pick)
        self.n_options.append(len(options))
        self.weight *= prob
        return value

    def flip(self, prob: float) -> bool:
        prob = float(prob)
        options = [(v, w) for v, w in ((True, prob), (False, 1.0 - prob)) if w > 0.0]
        return bool(self._choose(options))

    def flip_bounded(self, bound: float, prob: Callable[[], float]) -> bool:  # noqa: ARG002
        return self.flip(prob())

    def categorical(self, weights: torch.Tensor) -> int:
        w = weights.detach().double().cpu()
        total = float(w.sum())
        if not total > 0.0:
            raise ValueError("categorical draw from all-zero weights")
        nz = torch.nonzero(w).flatten().tolist()
        vals = (w[nz] / total).tolist()
        return int(self._choose(list(zip(nz, vals, strict=True))))


def enumerate_law(
    program: Callable[[Sampler], T], chooser: Callable[[list[int]], Chooser] = Chooser, max_runs: int | None = None
) -> dict[T, float]:
    """The exact law of ``program``'s output: {output: probability}.

    Args:
        program: a function of a sampler.
        chooser: makes the :class:`Chooser` for each run from its forced prefix of choices.
        max_runs: raise :class:`EnumerationBudgetError` after this many runs (None: no limit).
    """
    law: dict[T, float] = defaultdict(float)
    stack: list[list[int]] = [[]]
    runs = 0
    while stack:
        forced = stack.pop()
        runs += 1
        if max_runs is not None and runs > max_runs:
            raise EnumerationBudgetError(f"more than {max_runs} runs")
        ch = chooser(forced)
        out = program(ch)
        law[out] += ch.weight
        for pos in range(len(forced), len(ch.trace)):
            prefix = ch.trace[:pos]
            for alt in range(1, ch.n_options[pos]):
                stack.append(prefix + [alt])
    return dict(law)


def target_rows(tree: DraftTree, target_fn: ProbsFn) -> torch.Tensor:
    """Tensor[N, V]: the target row after every prefix of the tree."""
    return torch.stack([target_fn(pre) for pre in tree.prefixes])


Drafter = TreeShape | DraftPolicy | Callable[[Sampler], DraftTree]


def draw_tree(drafter: Drafter, draft_fn: ProbsFn, sampler: Sampler) -> DraftTree:
    """One tree from a static shape, a drafting policy, or any ``sampler -> DraftTree`` program."""
    if isinstance(drafter, TreeShape):
        return sample_tree(drafter, draft_fn, sampler)
    if isinstance(drafter, DraftPolicy):
        return sample_policy_tree(drafter, draft_fn, sampler)
    return drafter(sampler)


def tree_law(shape: Drafter, draft_fn: ProbsFn) -> list[tuple[DraftTree, float]]:
    """Every draft tree of ``shape`` with its exact probability (one entry per run of the drafter).

    ``shape`` is a static :class:`TreeShape`, a :class:`DraftPolicy` (its decisions, random or
    not, are enumerated together with the draws), or a ``sampler -> DraftTree`` program.
    """
    trees: list[DraftTree] = []

    def program(ch: Sampler) -> int:
        trees.append(draw_tree(shape, draft_fn, ch))
        return len(trees) - 1  # every run ends in its own leaf of the choice tree

    return [(trees[i], prob) for i, prob in enumerate_law(program).items()]


def output_law(
    verifier: Callable[[DraftTree, torch.Tensor, Sampler], object],
    shape: Drafter,
    draft_fn: ProbsFn,
    target_fn: ProbsFn,
) -> dict[tuple[int, ...], float]:
    """Exact law of the emitted tokens over drafting and verification.

    Args:
        verifier: ``(tree, target_probs, sampler) -> VerifyResult`` (a registry ``fn``).
        shape: the drafting recipe: a static shape, a drafting policy or a drafting program.
        draft_fn / target_fn: ``prefix -> Tensor[V]`` for the draft and the target.
    """
    law: dict[tuple[int, ...], float] = defaultdict(float)
    for tree, p_tree in tree_law(shape, draft_fn):
        rows = target_rows(tree, target_fn)
        sub = enumerate_law(lambda ch, tree=tree, rows=rows: verifier(tree, rows, ch).tokens)
        for out, prob in sub.items():
            law[out] += p_tree * prob
    return dict(law)


def fixed_tree_law(
    verifier: Callable[[DraftTree, torch.Tensor, Sampler], object], tree: DraftTree, target_probs: torch.Tensor
) -> dict[tuple[int, tuple[int, ...]], float]:
    """Exact law of (accepted node, emitted tokens) for one fixed tree."""

    def program(ch: Sampler) -> tuple[int, tuple[int, ...]]:
        res = verifier(tree, target_probs, ch)
        return res.node, res.tokens

    return enumerate_law(program)


def target_joint(target_fn: ProbsFn, vocab: int, length: int) -> dict[tuple[int, ...], float]:
    """The target's joint law of ``length`` tokens: {sequence: probability}."""
    joint: dict[tuple[int, ...], float] = {(): 1.0}
    for _ in range(length):
        nxt: dict[tuple[int, ...], float] = {}
        for seq, prob in joint.items():
            row = target_fn(seq).double().tolist()
            for y in range(vocab):
                nxt[seq + (y,)] = prob * row[y]
        joint = nxt
    return joint


def completed_tv(law: dict[tuple[int, ...], float], target_fn: ProbsFn, vocab: int, length: int) -> tuple[float, float]:
    """Complete each output to ``length`` tokens with target samples; return (TV, total mass).

    TV = ½ Σ_s |P_completed(s) − p^n(s)| over all s in V^length (docs/algorithms.md §9).
    """
    cache: dict[tuple[int, ...], list[float]] = {}

    def row(seq: tuple[int, ...]) -> list[float]:
        if seq not in cache:
            cache[seq] = target_fn(seq).double().tolist()
        return cache[seq]

    completed: dict[tuple[int, ...], float] = defaultdict(float)
    for out, prob in law.items():
        if len(out) > length:
            raise ValueError(f"output {out} is longer than the completion length {length}")
        frontier = {out: prob}
        for _ in range(length - len(out)):
            nxt: dict[tuple[int, ...], float] = {}
            for seq, pr in frontier.items():
                for y, py in enumerate(row(seq)):
                    if py > 0:
                        nxt[seq + (y,)] = pr * py
            frontier = nxt
        for seq, pr in frontier.items():
            completed[seq] += pr
    joint = target_joint(target_fn, vocab, length)
    tv = 0.5 * sum(abs(completed.get(s, 0.0) - joint[s]) for s in itertools.product(range(vocab), repeat=length))
    return tv, sum(law.values())


def block_efficiency(law: dict[tuple[int, ...], float]) -> float:
    """E[τ + 1]: the expected number of emitted tokens, from an exact output law."""
    return sum(len(out) * prob for out, prob in law.items())
