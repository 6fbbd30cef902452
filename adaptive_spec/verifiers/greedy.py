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
from adaptive_spec.verifiers.base import VerifyResult
from adaptive_spec.verifiers.walk import follow_choices


def verify_greedy(
    tree: DraftTree,
    target_probs: torch.Tensor,
    sampler: Sampler,  # noqa: ARG001
    ride: torch.Tensor | None = None,
) -> VerifyResult:
    """Greedy verification of any tree; ``sampler`` is unused.

    Every row's argmax comes back in one host read (one small kernel over the rows, with ``ride`` and
    the tree's tokens if they are still on the device), then the walk down the tree runs on the host.
    """
    return follow_choices(tree, target_probs.argmax(dim=-1), ride)
