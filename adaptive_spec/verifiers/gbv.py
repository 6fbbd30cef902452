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


def _skew_factor(a_mass: float, below: float, qt: float, x_mass: float, k: int) -> float:
    """P(best path continues with t | best path starts with c), from scalar masses."""
    b = a_mass + x_mass * below
    a = b + x_mass * qt
    num = x_mass * qt * sum(a**j * b ** (k - 1 - j) for j in range(k))
    den = x_mass * sum((a_mass + x_mass) ** j * a_mass ** (k - 1 - j) for j in range(k))
    return num / den if den > 0 else 0.0


def verify_gbv(tree: DraftTree, target_probs: torch.Tensor, sampler: Sampler) -> VerifyResult:
    """GBV on a chain (= BV), an i.i.d. tree or a delayed tree.

    Only what BV needs is computed eagerly: the rank keys and the CDF value F(t) of the
    chosen token at each depth (one masked pass per depth). Full skewed rows (one sort each)
    are built only for the positions the backward scan of BV reaches.
    """
    k = tree.shape.paths if tree.law in (DraftLaw.IID, DraftLaw.DELAYED) else 1
    branch_depth = tree.shape.branch_depth
    path = [0]
    draft_edge: list[float] = []
    # Per path position: (q row, key row, A, x) for skewed positions, None for plain q.
    skew_state: list[tuple[torch.Tensor, torch.Tensor, float, float] | None] = []
    a_mass, x_mass = 0.0, 1.0
    node = 0
    while tree.children[node]:
        kids = tree.children[node]
        kid_tokens = [tree.tokens[c] for c in kids]
        q = tree.draft_probs[node].double()
        if tree.depths[node] < branch_depth or k == 1:
            # Along a shared trunk (or with one path) the chosen path is the drafted one.
            best = 0
            t = kid_tokens[0]
            skew_state.append(None)
            draft_edge.append(float(q[t]))
        else:
            p = target_probs[node].double()
            key = rank_key(p, q)
            kid_keys = key[torch.tensor(kid_tokens, device=key.device)].tolist()
            # Highest rank: largest key, then largest token id (the order of the stable sort).
            best = max(range(len(kids)), key=lambda i: (kid_keys[i], kid_tokens[i]))
            t, kt = kid_tokens[best], kid_keys[best]
            ids = torch.arange(key.shape[0], device=key.device)
            # Mass ranked strictly below t: F(t) − q(t).
            below = float(q[(key < kt) | ((key == kt) & (ids < t))].sum())
            qt = float(q[t])
            skew_state.append((q, key, a_mass, x_mass))
            draft_edge.append(_skew_factor(a_mass, below, qt, x_mass, k))
            a_mass = a_mass + x_mass * below
            x_mass = x_mass * qt
        node = kids[best]
        path.append(node)

    def draft_row(i: int) -> torch.Tensor:
        state = skew_state[i]
        if state is None:
            return tree.draft_probs[path[i]].double()
        q, key, a, x = state
        return skewed_draft(q, rank_cdf(q, key), a, x, k)

    return block_verify_path(tree, path, target_probs, draft_edge, draft_row, sampler)
