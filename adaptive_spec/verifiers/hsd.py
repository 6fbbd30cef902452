"""Hierarchical Speculative Decoding, HSD (Zhou et al., arXiv 2601.05724), docs/algorithms.md §7.

This is the single-draft "clever" rule as the official code implements it
(``_speculative_sampling(..., backward=True, clever=True)`` in the authors' repository),
with one round and one correction token. Chain x_0..x_{γ−1}; P_k and Q_k are the target
and draft joint probabilities of the prefix x_<k::

    accept the whole block with probability min(1, P_γ / Q_γ), then a bonus token
    otherwise, for k = 0..γ−1:
        R_k = max(1, max_{j≤k} P_j/Q_j),  P̃_k = P_k / R_k
        plus_k  = (P̃_k p(·|x_<k) − Q_k q(·|x_<k))_+,  minus_k = (Q_k q − P̃_k p)_+
        s_k = Σ plus_k / max(Σ plus_k, Σ minus_k)  (s_0 = 1)
    k* = the largest k with U_k < s_k (backward scan); emit x_<k*, then Y ~ norm(plus_k*)

**It is not lossless.** The exact test of docs/algorithms.md §9 measures a completed-output total
variation of about 0.04–0.11 from the target law (1/9 on the toy instance), so the registry
marks it lossy and ``verify`` refuses it unless ``allow_lossy=True``.
"""

from __future__ import annotations

import torch

from adaptive_spec.rng import Sampler
from adaptive_spec.trees import DraftTree
from adaptive_spec.verifiers.base import VerifyResult, edge_probs, normalized_or, positive_part, result_for


def verify_hsd(tree: DraftTree, target_probs: torch.Tensor, sampler: Sampler) -> VerifyResult:
    """HSD-clever on a chain, as coded by its authors (lossy)."""
    path = tree.path(tree.num_nodes - 1)
    gamma = len(path) - 1
    p_edge = edge_probs(tree, target_probs)
    q_edge = edge_probs(tree, tree.draft_probs)
    big_p, big_q = [1.0], [1.0]  # joint probabilities of x_<k, k = 0..γ
    for n in path[1:]:
        big_p.append(big_p[-1] * p_edge[n])
        big_q.append(big_q[-1] * q_edge[n])
    if gamma == 0:
        return result_for(tree, 0, sampler.categorical(target_probs[0]), bonus=True)
    full_ratio = big_p[gamma] / big_q[gamma] if big_q[gamma] > 0 else 0.0
    if sampler.flip(min(1.0, full_ratio)):
        leaf = path[gamma]
        return result_for(tree, leaf, sampler.categorical(target_probs[leaf]), bonus=True)

    def plus(k: int) -> tuple[torch.Tensor, float]:
        run_max = max([1.0] + [big_p[j] / big_q[j] for j in range(k + 1) if big_q[j] > 0])
        diff = (big_p[k] / run_max) * target_probs[path[k]] - big_q[k] * tree.draft_probs[path[k]]
        pos = positive_part(diff)
        s_plus, s_minus = float(pos.sum()), float(positive_part(-diff).sum())
        stop = s_plus / max(s_plus, s_minus) if s_plus > 0 else 0.0
        return pos, stop

    for k in range(gamma - 1, 0, -1):
        pos, stop = plus(k)
        if sampler.flip(stop):
            return result_for(tree, path[k], sampler.categorical(pos), bonus=False)
    pos, _ = plus(0)  # s_0 = 1
    p0 = target_probs[0]
    return result_for(tree, 0, sampler.categorical(normalized_or(pos, p0)), bonus=False)
