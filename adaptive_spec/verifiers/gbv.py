"""Greedy multi-path block verification, GBV (Thomas & Pal, arXiv 2602.16961), reference §8.

Rank the tokens at a context c by the key (min(1, p(t|c)/q(t|c)), t), ascending, ties by
token id. Among the K drafted paths take the best one in the lexicographic order of ranks
(a greedy descent to the highest-ranked child). The law of "the best of K i.i.d. paths" is
autoregressive with

    q_skew(t|c) ∝ (A + y_t + z_t)^K − (A + y_t)^K,  y_t = x (F(t) − q(t|c)),  z_t = x q(t|c),

where F is the rank CDF of q(·|c), A the q-mass of paths ranked strictly below the current
prefix and x the q-mass of the prefix. BV on the chosen path with q replaced by q_skew is
lossless, because BV is lossless for any chain drawn from a known autoregressive law.

Departures from the authors' code (both exact, see reference §8): the difference of K-th
powers is evaluated as z · Σ_j a^j b^(K−1−j), with no 1e-8 floor, and one total order
(a stable sort on the key) serves both the CDF and the choice of the best child.

Delayed trees: the trunk is shared by all K paths, so q_skew = q along the trunk and the
K-path skew starts at the branching node (A = 0, x = 1 there).
"""

from __future__ import annotations

import torch

from adaptive_spec.rng import Sampler
from adaptive_spec.trees import DraftLaw, DraftTree
from adaptive_spec.verifiers.base import VerifyResult
from adaptive_spec.verifiers.block import block_verify_path


def rank_key(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """min(1, p/q) per token; 1 where q = 0 < p and 0 where p = q = 0."""
    safe_q = torch.where(q > 0, q, torch.ones_like(q))
    key = torch.where(q > 0, (p / safe_q).clamp(max=1.0), (p > 0).to(p.dtype))
    return key


def rank_cdf(q: torch.Tensor, key: torch.Tensor) -> torch.Tensor:
    """F(t) = Σ_{s ≤_rank t} q(s): the draft CDF in rank order (ascending key, ties by id)."""
    order = torch.sort(key, stable=True).indices
    cdf = torch.empty_like(q)
    cdf[order] = q[order].cumsum(0)
    return cdf


def skewed_draft(q: torch.Tensor, cdf: torch.Tensor, a_mass: float, x_mass: float, k: int) -> torch.Tensor:
    """q_skew(·|c) for the best of ``k`` paths, given the rank CDF and the masses A and x."""
    z = x_mass * q
    b = a_mass + x_mass * (cdf - q)  # A + y_t
    a = b + z  # A + y_t + z_t
    # a^k − b^k = z · Σ_{j<k} a^j b^(k−1−j): no cancellation, never negative.
    acc = torch.zeros_like(q)
    for j in range(k):
        acc = acc + a**j * b ** (k - 1 - j)
    skew = z * acc
    return skew / skew.sum()


def verify_gbv(tree: DraftTree, target_probs: torch.Tensor, sampler: Sampler) -> VerifyResult:
    """GBV on a chain (= BV), an i.i.d. tree or a delayed tree."""
    k = tree.shape.paths if tree.law in (DraftLaw.IID, DraftLaw.DELAYED) else 1
    branch_depth = tree.shape.branch_depth
    path = [0]
    draft_rows: list[torch.Tensor] = []
    draft_edge: list[float] = []
    a_mass, x_mass = 0.0, 1.0
    node = 0
    while tree.children[node]:
        p = target_probs[node].double()
        q = tree.draft_probs[node].double()
        key = rank_key(p, q)
        kids = tree.children[node]
        kid_tokens = [tree.tokens[c] for c in kids]
        kid_keys = key[torch.tensor(kid_tokens, device=key.device)].tolist()
        # Highest rank: largest key, then largest token id (the same total order as the sort).
        best = max(range(len(kids)), key=lambda i: (kid_keys[i], kid_tokens[i]))
        t = kid_tokens[best]
        if tree.depths[node] < branch_depth or k == 1:
            row = q
        else:
            cdf = rank_cdf(q, key)
            row = skewed_draft(q, cdf, a_mass, x_mass, k)
            # A gains the mass of the paths ranked strictly below c·t; x becomes c·t's mass.
            a_mass = a_mass + x_mass * (float(cdf[t]) - float(q[t]))
            x_mass = x_mass * float(q[t])
        draft_rows.append(row)
        draft_edge.append(float(row[t]))
        node = kids[best]
        path.append(node)
    return block_verify_path(tree, path, target_probs, draft_edge, lambda i: draft_rows[i], sampler)
