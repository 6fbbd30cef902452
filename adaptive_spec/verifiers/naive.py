"""NaiveTree, docs/algorithms.md §5 (DDTE App. B).

Run the token-level test (docs/algorithms.md §2) on the first drawn candidate only. If it is rejected, draw
from norm((p − q)_+); that token may still be another child, and the walk continues there.
Lossless whenever the first candidate is a draw from q: i.i.d., delayed and
without-replacement trees.
"""

from __future__ import annotations

import torch

from adaptive_spec.rng import Sampler
from adaptive_spec.trees import DraftTree
from adaptive_spec.verifiers.base import VerifyResult, accept_prob, normalized_or, positive_part
from adaptive_spec.verifiers.walk import top_down_walk


def naive_solver(p, q, candidates, sampler):
    x = candidates[0]
    if sampler.flip(accept_prob(float(p[x]), float(q[x]))):
        return x, False
    return sampler.categorical(normalized_or(positive_part(p - q), p)), False


def verify_naive(tree: DraftTree, target_probs: torch.Tensor, sampler: Sampler) -> VerifyResult:
    """NaiveTree: token-level test on the first candidate, then a residual draw."""
    return top_down_walk(tree, target_probs, sampler, naive_solver, distinct=False)
