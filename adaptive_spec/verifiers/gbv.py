"""Greedy multi-path block verification, GBV (Thomas & Pal, arXiv 2602.16961), docs/algorithms.md §6.

Rank the tokens at a context c by the key (min(1, p(t|c)/q(t|c)), t), ascending, ties by
token id. Among the K drafted paths take the best one in the lexicographic order of ranks
(a greedy descent to the highest-ranked child). The law of "the best of K i.i.d. paths" is
autoregressive with

    q_skew(t|c) ∝ (A + y_t + z_t)^K − (A + y_t)^K,  y_t = x (F(t) − q(t|c)),  z_t = x q(t|c),

where F is the rank CDF of q(·|c), A the q-mass of paths ranked strictly below the current
prefix and x the q-mass of the prefix. BV on the chosen path with q replaced by q_skew is
lossless, because BV is lossless for any chain drawn from a known autoregressive law.

Departures from the authors' code (all exact, see docs/algorithms.md §6): the difference of K-th
powers is evaluated as z · Σ_j a^j b^(K−1−j), with no 1e-8 floor; one total order serves
both the CDF and the choice of the best child; and tokens whose draft probability is below
``GBV_TAIL_PROB`` rank below all others by token id, so only the head of the vocabulary is
sorted. GBV is lossless for any draft-independent ranking, so this changes only its
efficiency, and only through tokens the draft almost never proposes.

Delayed trees: the trunk is shared by all K paths, so q_skew = q along the trunk and the
K-path skew starts at the branching node (A = 0, x = 1 there).
"""

from __future__ import annotations

import torch

from adaptive_spec.rng import Sampler
from adaptive_spec.trees import DraftLaw, DraftTree
from adaptive_spec.verifiers.base import VerifyResult
from adaptive_spec.verifiers.block import block_verify_path

# Draft probabilities below this rank below every other token, in token-id order. Any
# ranking that is a fixed function of (p, q) keeps GBV lossless; this one spares a sort of
# the whole vocabulary (costly at V = 128k): only the "head" tokens are sorted.
# A power of two, so that float32 and float64 rows put every token on the same side of it.
GBV_TAIL_PROB = 2.0**-17  # about 7.6e-6


def rank_key(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """min(1, p/q) per token; 1 where q = 0 < p and 0 where p = q = 0."""
    safe_q = torch.where(q > 0, q, torch.ones_like(q))
    return torch.where(q > 0, (p / safe_q).clamp(max=1.0), (p > 0).to(p.dtype))


def rank_cdf(p: torch.Tensor, q: torch.Tensor, tail_prob: float | None = None) -> torch.Tensor:
    """F(t) = Σ_{s ≤_rank t} q(s): the draft CDF in rank order (float64).

    The rank order is: tail tokens (q < ``tail_prob``) first, by token id; then the head
    tokens by (min(1, p/q), token id) ascending, the key computed in the rows' own dtype.
    :func:`rank_tuple` and :func:`mass_ranked_below` use the same order.
    """
    tail_prob = GBV_TAIL_PROB if tail_prob is None else tail_prob
    head = q >= tail_prob
    q64 = q.double()
    cdf = torch.where(head, torch.zeros_like(q64), q64).cumsum(0)  # tail part, in id order
    tail_mass = cdf[-1]
    hidx = head.nonzero().flatten()  # ascending ids: the stable sort breaks ties by id
    order = hidx[torch.sort(rank_key(p[hidx], q[hidx]), stable=True).indices]
    cdf[order] = tail_mass + q64[order].cumsum(0)
    return cdf


def rank_tuple(
    p_t: float, q_t: float, t: int, tail_prob: float | None = None, dtype: torch.dtype = torch.float64
) -> tuple[int, float, int]:
    """Sort key of token t in the order of :func:`rank_cdf` (larger = ranked higher).

    The key is computed as :func:`rank_key` does on rows of ``dtype`` (one IEEE division in
    that precision, capped at 1), so the orders agree exactly.
    """
    tail_prob = GBV_TAIL_PROB if tail_prob is None else tail_prob
    if q_t < tail_prob:
        return (0, 0.0, t)
    if q_t <= 0:
        return (1, 1.0 if p_t > 0 else 0.0, t)
    if dtype == torch.float64:
        key = min(1.0, p_t / q_t)
    else:  # the division in the rows' precision, as torch does it
        key = min(1.0, float(torch.tensor(p_t, dtype=dtype) / torch.tensor(q_t, dtype=dtype)))
    return (1, key, t)


def skewed_draft(q: torch.Tensor, cdf: torch.Tensor, a_mass: float, x_mass: float, k: int) -> torch.Tensor:
    """q_skew(·|c) for the best of ``k`` paths, given the rank CDF and the masses A and x."""
    q = q.double()
    z = x_mass * q
    b = cdf - q  # y_t / x, then A + y_t below
    b.mul_(x_mass).add_(a_mass)
    a = b + z  # A + y_t + z_t
    # a^k − b^k = z · Σ_{j<k} a^j b^(k−1−j): no cancellation, never negative. Horner in a:
    # s_0 = 1, s_m = a · s_{m−1} + b^m, so s_{k−1} = Σ_j a^j b^(k−1−j); two passes per term.
    acc = torch.ones_like(q)
    power = torch.ones_like(q)
    for _ in range(k - 1):
        power.mul_(b)
        acc.mul_(a).add_(power)
    acc.mul_(z)
    return acc.div_(acc.sum())


def _skew_factor(a_mass: float, below: float, qt: float, x_mass: float, k: int) -> float:
    """P(best path continues with t | best path starts with c), from scalar masses."""
    b = a_mass + x_mass * below
    a = b + x_mass * qt
    num = x_mass * qt * sum(a**j * b ** (k - 1 - j) for j in range(k))
    den = x_mass * sum((a_mass + x_mass) ** j * a_mass ** (k - 1 - j) for j in range(k))
    return num / den if den > 0 else 0.0


def mass_ranked_below(p: torch.Tensor, q: torch.Tensor, t: int, tail_prob: float | None = None) -> float:
    """``F(t) − q(t)``: the draft mass ranked strictly below token ``t`` in :func:`rank_cdf`'s order.

    No sort: one pass to find the head tokens, then the ranking keys of the head only (in the
    rows' dtype, as :func:`rank_cdf` computes them) and masked sums accumulated in float64.
    """
    tail_prob = GBV_TAIL_PROB if tail_prob is None else tail_prob
    hidx = (q >= tail_prob).nonzero().flatten()  # ascending ids
    q_head = q[hidx]
    head_mass = float(q_head.sum(dtype=torch.float64))
    qt = float(q[t])
    if qt < tail_prob:  # tail tokens rank by id, below every head token
        return float(q[:t].sum(dtype=torch.float64)) - float(q_head[hidx < t].sum(dtype=torch.float64))
    tail_mass = float(q.sum(dtype=torch.float64)) - head_mass
    keys = rank_key(p[hidx], q_head)
    _, key_t, _ = rank_tuple(float(p[t]), qt, t, tail_prob, dtype=q.dtype)
    below = (keys < key_t) | ((keys == key_t) & (hidx < t))
    return tail_mass + float(q_head[below].sum(dtype=torch.float64))


def verify_gbv(tree: DraftTree, target_probs: torch.Tensor, sampler: Sampler) -> VerifyResult:
    """GBV on a chain (= BV), an i.i.d. tree or a delayed tree.

    Eagerly, per skewed depth: the ranks of the children and the mass ranked below the chosen
    one (:func:`mass_ranked_below`, no sort). The rank CDF (a sort of the head tokens) and the
    full skewed row are built only for the positions the backward scan of BV reaches.
    """
    k = tree.shape.paths if tree.law in (DraftLaw.IID, DraftLaw.DELAYED) else 1
    branch_depth = tree.shape.branch_depth
    path = [0]
    draft_edge: list[float] = []
    # Per path position: (node, A, x) for skewed positions, None for plain q.
    skew_state: list[tuple[int, float, float] | None] = []
    a_mass, x_mass = 0.0, 1.0
    node = 0
    while tree.children[node]:
        kids = tree.children[node]
        kid_tokens = [tree.tokens[c] for c in kids]
        if tree.depths[node] < branch_depth or k == 1:
            # Along a shared trunk (or with one path) the chosen path is the drafted one.
            best = 0
            t = kid_tokens[0]
            skew_state.append(None)
            draft_edge.append(float(tree.draft_probs[node, t]))
        else:
            p, q = target_probs[node], tree.draft_probs[node]
            idx = torch.tensor(kid_tokens, device=q.device)
            ranks = [
                rank_tuple(pt, qt, tok, dtype=q.dtype)
                for pt, qt, tok in zip(p[idx].double().tolist(), q[idx].double().tolist(), kid_tokens, strict=True)
            ]
            best = max(range(len(kids)), key=lambda i: ranks[i])  # the highest-ranked child
            t = kid_tokens[best]
            qt = float(q[t])
            below = mass_ranked_below(p, q, t)  # mass ranked strictly below t
            skew_state.append((node, a_mass, x_mass))
            draft_edge.append(_skew_factor(a_mass, below, qt, x_mass, k))
            a_mass = a_mass + x_mass * below
            x_mass = x_mass * qt
        node = kids[best]
        path.append(node)

    def draft_row(i: int) -> torch.Tensor:
        state = skew_state[i]
        if state is None:
            return tree.draft_probs[path[i]].double()
        n, a, x = state
        q = tree.draft_probs[n]
        return skewed_draft(q.double(), rank_cdf(target_probs[n], q), a, x, k)

    return block_verify_path(tree, path, target_probs, draft_edge, draft_row, sampler)
