"""Token-level speculative sampling on a chain (Leviathan et al. 2023; Chen et al. 2023).

docs/algorithms.md §2. Each drafted token x_i is accepted with probability min(1, p(x_i)/q(x_i));
at the first rejection a recovered token is drawn from norm((p - q)_+) at that node; if all
γ tokens are accepted, a bonus token is drawn from p at the leaf.
"""

from __future__ import annotations

import torch

from adaptive_spec.rng import Sampler
from adaptive_spec.trees import DraftTree
from adaptive_spec.verifiers.base import VerifyResult, accept_prob, edge_probs, positive_part, result_for


def verify_token(tree: DraftTree, target_probs: torch.Tensor, sampler: Sampler) -> VerifyResult:
    """Token-level rejection sampling along a chain.

    Args:
        tree: a chain (node i + 1 is the only child of node i).
        target_probs: Tensor[N, V], target distribution after each node's prefix.
        sampler: source of randomness.
    """
    p_edge = edge_probs(tree, target_probs)  # p(x_i | x_<i) for every node i
    q_edge = edge_probs(tree, tree.draft_probs)
    node = 0
    while tree.children[node]:
        child = tree.children[node][0]
        if not sampler.flip(accept_prob(p_edge[child], q_edge[child])):
            p = target_probs[node]
            residual = positive_part(p - tree.draft_probs[node])
            # An all-zero residual means p == q here, so rejection had probability 0.
            weights = residual if float(residual.sum()) > 0 else p
            return result_for(tree, node, sampler.categorical(weights), bonus=False)
        node = child
    return result_for(tree, node, sampler.categorical(target_probs[node]), bonus=True)
