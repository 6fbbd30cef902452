"""RRSw / RSD: recursive rejection sampling over distinct candidates drawn one after another
without replacement. docs/algorithms.md §5; the node solver is :func:`~adaptive_spec.verifiers.rrs.rrs_solve`.
"""

from __future__ import annotations

import torch

from adaptive_spec.rng import Sampler, TorchSampler
from adaptive_spec.trees import DraftTree
from adaptive_spec.verifiers.base import VerifyResult, ride_first
from adaptive_spec.verifiers.rrs import rrs_on_slots, rrs_solve
from adaptive_spec.verifiers.walk import top_down_walk


def rrsw_solver(p, q, candidates, sampler):
    return rrs_solve(p, q, candidates, sampler, without_replacement=True)


def verify_rrsw(
    tree: DraftTree, target_probs: torch.Tensor, sampler: Sampler, ride: torch.Tensor | None = None
) -> VerifyResult:
    """Recursive rejection sampling without replacement (RSD).

    A tree drafted into slots, verified with a ``torch.Generator``'s sampler (the engine's case), runs on the rows'
    device with one host read (:func:`~adaptive_spec.verifiers.rrs.rrs_on_slots`); any other, on the host.
    """
    if isinstance(sampler, TorchSampler) and tree.slots is not None:
        return rrs_on_slots(tree, target_probs, sampler.generator, without_replacement=True, ride=ride)
    return ride_first(tree, ride, lambda: top_down_walk(tree, target_probs, sampler, rrsw_solver, distinct=True))
