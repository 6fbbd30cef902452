"""Naive speculative sampling, NSS (SpecInfer), docs/algorithms.md §5.

Ignore the draft: draw Y ~ p at the node and move to the child holding Y, if any. Lossless
for any tree, deterministic ones included.
"""

from __future__ import annotations

import torch

from adaptive_spec.rng import Sampler
from adaptive_spec.trees import DraftTree
from adaptive_spec.verifiers.base import VerifyResult
from adaptive_spec.verifiers.walk import top_down_walk


def nss_solver(p, q, candidates, sampler):  # noqa: ARG001
    return sampler.categorical(p), True


def verify_nss(tree: DraftTree, target_probs: torch.Tensor, sampler: Sampler) -> VerifyResult:
    """NSS: sample from the target at each node and follow the tree while it matches."""
    return top_down_walk(tree, target_probs, sampler, nss_solver, distinct=True)
