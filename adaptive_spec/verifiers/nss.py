"""Naive speculative sampling, NSS (SpecInfer), docs/algorithms.md §5.

Ignore the draft: draw Y ~ p at the node and move to the child holding Y, if any. Lossless
for any tree, deterministic ones included.

With a ``torch.Generator``'s sampler (the engine's case) every node's ``Y`` is drawn at once on the
rows' device (:func:`~adaptive_spec.trees.draw.draw_children`): a node is visited at most once and its draw is
independent of the others', so drawing them all ahead leaves the walk's law unchanged; one host read brings them
back (with the caller's ``ride``) and the walk runs on the host (``tests/verifiers/test_nss_device.py``).
"""

from __future__ import annotations

import torch

from adaptive_spec.rng import Sampler, TorchSampler
from adaptive_spec.trees import DraftTree
from adaptive_spec.trees.draw import draw_tokens
from adaptive_spec.verifiers.base import VerifyResult, ride_first
from adaptive_spec.verifiers.walk import follow_choices, top_down_walk


def nss_solver(p, q, candidates, sampler):  # noqa: ARG001
    return sampler.categorical(p), True


def verify_nss(
    tree: DraftTree, target_probs: torch.Tensor, sampler: Sampler, ride: torch.Tensor | None = None
) -> VerifyResult:
    """NSS: sample from the target at each node and follow the tree while it matches."""
    if isinstance(sampler, TorchSampler):
        return follow_choices(tree, draw_tokens(target_probs, 1, sampler.generator)[:, 0], ride)  # every Y
    return ride_first(tree, ride, lambda: top_down_walk(tree, target_probs, sampler, nss_solver, distinct=True))
