"""The node solver of recursive rejection sampling, shared by SpecInfer's multi-step speculative
sampling (with replacement, :mod:`~adaptive_spec.verifiers.specinfer`) and RRSw / RSD (without
replacement, :mod:`~adaptive_spec.verifiers.rrsw`). docs/algorithms.md §5.

Node solver, for candidates x_1..x_k at a node with target p and draft q::

    p' = p, q' = q
    for j in 1..k:
        accept x_j with probability min(1, p'(x_j) / q'(x_j))
        p' = norm((p' − q')_+)
        without replacement only: q'(x_j) = 0, q' = norm(q')
    otherwise return Y ~ p'

SpecInfer takes every draw with multiplicity (i.i.d. candidates); RRSw takes distinct
candidates drawn one after another without replacement. Mixing the two contracts is lossy.
"""

from __future__ import annotations

import torch

from adaptive_spec.rng import Sampler
from adaptive_spec.verifiers.base import accept_prob, normalized_or, positive_part


def rrs_solve(
    p: torch.Tensor, q: torch.Tensor, candidates: list[int], sampler: Sampler, *, without_replacement: bool
) -> tuple[int, bool]:
    """One node of recursive rejection sampling; returns (token, drawn from unmodified p)."""
    touched = False
    for x in candidates:
        if sampler.flip(accept_prob(float(p[x]), float(q[x]))):
            return x, False
        # Residual; an all-zero residual means p' == q' and the rejection had probability 0.
        p = normalized_or(positive_part(p - q), p)
        touched = True
        if without_replacement:
            q = q.clone()
            q[x] = 0.0
            q = normalized_or(q, q)
    return sampler.categorical(p), not touched
