"""Greedy verification (temperature 0), docs/algorithms.md §2.

The target at temperature 0 is one-hot at argmax p. Take the longest root path whose every
token equals the target's argmax at its parent, then emit the argmax at its end. Ties are
broken towards the lowest token id, as ``torch.argmax`` and transformers' greedy search do.
Lossless for any tree with respect to the greedy target; no randomness is used.
"""

from __future__ import annotations

import torch

from adaptive_spec.rng import Sampler
from adaptive_spec.trees import DraftTree
from adaptive_spec.verifiers.base import VerifyResult, result_for


def verify_greedy(tree: DraftTree, target_probs: torch.Tensor, sampler: Sampler) -> VerifyResult:  # noqa: ARG001
    """Greedy verification of any tree; ``sampler`` is unused."""
    node = 0
    while True:
        best = int(target_probs[node].argmax())  # only the rows on the accepted path are read
        child = tree.child_with_token(node, best)
        if child is None:
            return result_for(tree, node, best, bonus=True)
        node = child
