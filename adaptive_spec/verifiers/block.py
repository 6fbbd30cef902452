"""Block verification, BV (Sun et al., arXiv 2403.10444), docs/algorithms.md §3.

Weights w_0 = 1, w_i = min(1, w_{i-1} p(x_i)/q(x_i)); block acceptance probabilities
h_γ = w_γ and h_i = S_i / (S_i + 1 - w_i) with S_i = Σ_y (w_i p(y|x_≤i) - q(y|x_≤i))_+.
τ is the largest i whose η_i ≤ h_i, found by a backward scan, so h_i is computed only for
the positions the scan reaches. The recovered token at τ < γ is drawn from
norm((w_τ p - q)_+); at τ = γ a bonus token is drawn from p.

``block_verify_path`` is also the last stage of GBV, which runs BV with a skewed draft law.

On a chain drawn with a ``torch.Generator`` (the engine's case), :func:`verify_block` runs the same law on
the rows' device without reading them one by one: :func:`chain_block_law` computes every ``w_i``, ``h_i``
and candidate row at once (``w_i = exp(L_i - max_{j<=i} L_j)`` with ``L`` the cumulative log-ratios, the
closed form of the recursion), the backward scan becomes "the largest ``i`` whose uniform is below
``h_i``", and one host read brings back ``tau`` and the token. Its law equals the scan's exactly
(``tests/verifiers/test_block_device.py`` compares them by enumeration).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.nn.functional import pad

from adaptive_spec.rng import Sampler, TorchSampler, search_cdf
from adaptive_spec.trees import DraftTree
from adaptive_spec.verifiers.base import (
    VerifyResult,
    edge_probs,
    host_read,
    positions,
    positive_part,
    result_for,
    ride_first,
)


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


def chain_block_law(
    target_probs: torch.Tensor, draft_probs: torch.Tensor, tokens: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """BV's acceptance probabilities and candidate rows along a chain, all at once, on the rows' device.

    Args:
        target_probs / draft_probs: Tensor[γ + 1, V], the chain's nodes in order (root first).
        tokens: LongTensor[γ], node ``i + 1``'s token.

    Returns:
        ``h``: Tensor[γ + 1] (float64), ``h[i]`` for ``1 <= i <= γ`` (``h[γ] = w_γ``; ``h[0]`` is unused);
        ``rows``: Tensor[γ + 1, V] (the rows' dtype), the unnormalised law of the emitted token when ``τ = i``:
        the residual ``(w_i p_i - q_i)_+`` for ``i < γ`` (``p_i`` when it is all zero: for ``i = 0`` that is BV's
        rule, for ``i >= 1`` then ``h_i = 0`` and ``τ = i`` never happens) and ``p_γ``.
    """
    P, Q = target_probs, draft_probs  # rows in their own dtype; the weights in float64 (module docstring of base)
    g = tokens.numel()
    if g == 0:
        return P.new_zeros(1, dtype=torch.float64), P
    P1, Q1, idx = P[:-1], Q[:-1], tokens[:, None]  # the weights below are columns: Tensor[γ (+ 1), 1]
    pe, qe = P1.gather(1, idx).double(), Q1.gather(1, idx).double()
    ratio = torch.where(qe > 0, pe / qe, 0.0)  # 0 where q = 0 (the quotient's inf or NaN there is not taken)
    L = pad(ratio.log().cumsum(0), (0, 0, 1, 0))  # L_0 = 0; -inf once a ratio is 0: w stays 0 after it
    w = (L - L.cummax(0).values).exp()  # w_i = min(1, w_{i-1} * ratio_i), in closed form
    w1 = w[:-1]
    R = (w1.to(P.dtype) * P1 - Q1).clamp_min_(0.0)  # [γ, V]
    S = R.sum(-1, keepdim=True, dtype=torch.float64)
    denom = S - w1 + 1.0
    h = (S / denom).nan_to_num_(0.0)  # denom >= S >= 0, and 0 / 0 only when S = 0 and w = 1: h = 0
    h = torch.cat([h, w[-1:]]).view(-1)  # h_γ = w_γ; h_0 is unused (τ = 0 when every later position is rejected)
    # a residual of total 0 gives way to p_i: the root's emits p_0; for i >= 1, h_i = 0 and the row is never drawn
    rows = torch.cat([torch.where(S > 0, R, P1), P[-1:]])
    return h, rows


def chain_block_draw(
    h: torch.Tensor, rows: torch.Tensor, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(τ, token)`` (each LongTensor[1] on the rows' device) of BV from :func:`chain_block_law`'s output, drawn there;
    nothing is read back (the caller's one read takes both with the rest of its parts).
    """
    g = h.numel() - 1
    u = torch.rand(g + 1, generator=generator, dtype=torch.float64, device=generator.device)
    if u.device != h.device:  # a generator on another device than the rows (the engine keeps them together)
        u = u.to(h.device)
    # τ, LongTensor[1]: the backward scan's stop, the largest i with η_i < h_i, else 0
    tau = ((u < h) * positions(g + 1, h.device)).max(0, keepdim=True).values
    row = rows.index_select(0, tau)  # [1, V]
    token = search_cdf(row.cumsum(-1), u[:1, None])  # [1, 1]: η_0 draws the emitted token too
    return tau, token.view(1)


def _is_chain(tree: DraftTree) -> bool:
    return tree.parents == list(range(-1, tree.num_nodes - 1))


def verify_block(
    tree: DraftTree, target_probs: torch.Tensor, sampler: Sampler, ride: torch.Tensor | None = None
) -> VerifyResult:
    """Block verification of a chain (on the rows' device with a ``torch.Generator``'s sampler: one host read
    brings back τ, the token, ``ride`` and the tree's tokens if they are still on the device).
    """
    extra = [] if ride is None else [ride]
    if isinstance(sampler, TorchSampler) and _is_chain(tree):
        tokens = tree.tokens_tensor(target_probs.device)[1:]
        tau_d, token_d = chain_block_draw(*chain_block_law(target_probs, tree.draft_probs, tokens), sampler.generator)
        ([tau], [token], *rest) = host_read(tree, tau_d, token_d, *extra)
        return result_for(tree, tau, token, tau == tree.num_nodes - 1, rest[0] if rest else (), token_d)
    return ride_first(tree, ride, lambda: _verify_block_host(tree, target_probs, sampler))


def _verify_block_host(tree: DraftTree, target_probs: torch.Tensor, sampler: Sampler) -> VerifyResult:
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
