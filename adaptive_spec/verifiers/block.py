"""Block verification, BV (Sun et al., arXiv 2403.10444), docs/algorithms.md §3.

Weights w_0 = 1, w_i = min(1, w_{i-1} p(x_i)/q(x_i)); block acceptance probabilities
h_γ = w_γ and h_i = S_i / (S_i + 1 - w_i) with S_i = Σ_y (w_i p(y|x_≤i) - q(y|x_≤i))_+.
τ is the largest i whose η_i ≤ h_i, found by a backward scan, so h_i is computed only for
the positions the scan reaches. The recovered token at τ < γ is drawn from
norm((w_τ p - q)_+); at τ = γ a bonus token is drawn from p.

``block_verify_path`` is also the last stage of GBV, which runs BV with a skewed draft law.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from adaptive_spec.rng import Sampler
from adaptive_spec.trees import DraftTree
from adaptive_spec.verifiers.base import VerifyResult, edge_probs, positive_part, result_for


def block_verify_path(
    tree: DraftTree,
    path: list[int],
    target_probs: torch.Tensor,
    draft_edge: list[float],
    draft_row: Callable[[int], torch.Tensor],
    sampler: Sampler,
) -> VerifyResult:
    """BV along ``path`` (node indices from the root) under a given draft law.

    Args:
        tree: the draft tree (for tokens and prefixes).
        path: root-to-leaf node indices ``[0, n_1, ..., n_γ]``.
        target_probs: Tensor[N, V].
        draft_edge: ``draft_edge[i]`` is the draft probability of ``path[i + 1]``'s token
            at ``path[i]`` (γ floats).
        draft_row: ``draft_row(i)`` is the draft law at ``path[i]`` (Tensor[V], float64),
            called only for the positions the backward scan reaches.
        sampler: source of randomness.
    """
    gamma = len(path) - 1
    if gamma == 0:
        return result_for(tree, 0, sampler.categorical(target_probs[0]), bonus=True)
    nodes = torch.tensor(path, device=target_probs.device)
    toks = torch.tensor([tree.tokens[n] for n in path[1:]], device=target_probs.device)
    p_edge = target_probs[nodes[:-1], toks].double().tolist()
    w = [1.0]
    for pe, qe in zip(p_edge, draft_edge, strict=True):
        w.append(min(1.0, w[-1] * pe / qe) if qe > 0 else 0.0)

    if sampler.flip(w[gamma]):
        leaf = path[gamma]
        return result_for(tree, leaf, sampler.categorical(target_probs[leaf]), bonus=True)
    residuals: dict[int, torch.Tensor] = {}

    def h(i: int) -> float:
        residual = positive_part(w[i] * target_probs[path[i]] - draft_row(i))
        residuals[i] = residual
        s = float(residual.sum())
        denom = s + (1.0 - w[i])
        return s / denom if denom > 0 else 0.0  # S = 0 and w = 1: p == q, h undefined, set 0 (docs/algorithms.md §3)

    for i in range(gamma - 1, 0, -1):
        # h_i <= w_i (S_i <= w_i), so the row pass is skipped whenever the uniform exceeds w_i.
        if w[i] > 0.0 and sampler.flip_bounded(w[i], lambda i=i: h(i)):
            return result_for(tree, path[i], sampler.categorical(residuals[i]), bonus=False)
    p0 = target_probs[0]
    residual = positive_part(p0 - draft_row(0))
    weights = residual if float(residual.sum()) > 0 else p0
    return result_for(tree, 0, sampler.categorical(weights), bonus=False)


def verify_block(tree: DraftTree, target_probs: torch.Tensor, sampler: Sampler) -> VerifyResult:
    """Block verification of a chain."""
    path = tree.path(tree.num_nodes - 1)
    q_edge = edge_probs(tree, tree.draft_probs)
    return block_verify_path(
        tree,
        path,
        target_probs,
        [q_edge[n] for n in path[1:]],
        lambda i: tree.draft_probs[path[i]],
        sampler,
    )
