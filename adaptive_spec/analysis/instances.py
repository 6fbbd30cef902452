"""Small context-dependent (target, draft) instances for exact tests and benchmarks.

Each context gets its own distributions, drawn from a generator seeded by a hash of
(seed, model, context) (docs/algorithms.md §9), so an instance is a pure function of its
seed and needs no stored tables.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cache

import numpy as np
import torch

ProbsFn = Callable[[tuple[int, ...]], torch.Tensor]


@dataclass(frozen=True)
class Instance:
    """A (target, draft) pair of next-token distribution functions over a small vocabulary."""

    name: str
    vocab: int
    target_fn: ProbsFn
    draft_fn: ProbsFn


def toy_instance() -> Instance:
    """A context-free toy instance: p = (1/3, 2/3) and q = (2/3, 1/3) at every position."""
    p = torch.tensor([1 / 3, 2 / 3], dtype=torch.float64)
    q = torch.tensor([2 / 3, 1 / 3], dtype=torch.float64)
    return Instance("toy", 2, lambda _c: p, lambda _c: q)


@cache
def _row(seed: int, model: int, context: tuple[int, ...], vocab: int, zero_frac: float, alpha: float) -> torch.Tensor:
    rng = np.random.default_rng([seed, model, len(context), *context])
    x = rng.dirichlet(np.full(vocab, alpha))
    if zero_frac > 0:
        keep = rng.random(vocab) >= zero_frac
        if not keep.any():
            keep[rng.integers(vocab)] = True
        x = np.where(keep, x, 0.0)
    return torch.tensor(x / x.sum(), dtype=torch.float64)


def random_instance(seed: int, vocab: int, *, zero_frac: float = 0.25, alpha: float = 1.0) -> Instance:
    """Independent random target and draft rows per context, about ``zero_frac`` exact zeros."""
    return Instance(
        f"random(seed={seed},V={vocab})",
        vocab,
        lambda c: _row(seed, 0, tuple(c), vocab, zero_frac, alpha),
        lambda c: _row(seed, 1, tuple(c), vocab, zero_frac, alpha),
    )


def divergence_instance(seed: int, vocab: int, mix: float) -> Instance:
    """Draft = (1 − mix)·target + mix·noise per context: low ``mix`` means a close draft."""

    def draft(c: tuple[int, ...]) -> torch.Tensor:
        return (1 - mix) * _row(seed, 0, tuple(c), vocab, 0.0, 1.0) + mix * _row(seed, 1, tuple(c), vocab, 0.0, 1.0)

    return Instance(
        f"dirichlet(seed={seed},V={vocab},mix={mix})",
        vocab,
        lambda c: _row(seed, 0, tuple(c), vocab, 0.0, 1.0),
        draft,
    )


def one_hot_target(inst: Instance) -> Instance:
    """The same instance with the target made one-hot at its argmax (temperature 0)."""

    def target(c: tuple[int, ...]) -> torch.Tensor:
        row = inst.target_fn(c)
        out = torch.zeros_like(row)
        out[int(row.argmax())] = 1.0
        return out

    return Instance(inst.name + "+greedy", inst.vocab, target, inst.draft_fn)
