"""SpecInfer's multi-step speculative sampling: recursive rejection sampling over i.i.d.
candidates, taken with multiplicity (with replacement). docs/algorithms.md §5; the node solver is
:func:`~adaptive_spec.verifiers.rrs.rrs_solve`.
"""

from __future__ import annotations

import torch

from adaptive_spec.rng import Sampler
from adaptive_spec.trees import DraftTree
from adaptive_spec.verifiers.base import VerifyResult
from adaptive_spec.verifiers.rrs import rrs_solve, verify_rrs


def specinfer_solver(p, q, candidates, sampler):
    return rrs_solve(p, q, candidates, sampler, without_replacement=False)


def verify_specinfer(
    tree: DraftTree, target_probs: torch.Tensor, sampler: Sampler, ride: torch.Tensor | None = None
) -> VerifyResult:
    """SpecInfer multi-step speculative sampling (i.i.d. candidates, with replacement).

    The top-down walk with :func:`~adaptive_spec.verifiers.rrs.rrs_solve`, or on the rows' device for a slot tree
    (:func:`~adaptive_spec.verifiers.rrs.verify_rrs`).
    """
    return verify_rrs(tree, target_probs, sampler, ride, without_replacement=False)
