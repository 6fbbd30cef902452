"""SpecTr K-SEQ with ρ* (Sun et al., arXiv 2310.15141), docs/algorithms.md §5.

Node solver for k i.i.d. candidates::

    β(ρ) = Σ_x min(p(x)/ρ, q(x)),   p_acc(ρ) = 1 − (1 − β(ρ))^k
    ρ*   = root in [1, k] of p_acc(ρ) − ρ β(ρ)
    accept x_j (in order) with probability min(1, p(x_j) / (ρ* q(x_j)))
    otherwise Y ~ norm((p − γ min(p/ρ*, q))_+),  γ = p_acc(ρ*) / β(ρ*)

Any ρ ≥ ρ* is lossless and any ρ < ρ* is lossy, so ρ* is bracketed and the *upper* end is
returned. β is piecewise of the form A/ρ + B between the sorted ratios p/q, so ρ* is found
with one sort of the ratios that lie in (1, k), one vectorised pass over the breakpoints and
a scalar bisection inside the right piece; no per-iteration pass over the vocabulary.
"""

from __future__ import annotations

import math

import torch

from adaptive_spec.rng import Sampler
from adaptive_spec.trees import DraftTree
from adaptive_spec.verifiers.base import VerifyResult, normalized_or, positive_part
from adaptive_spec.verifiers.walk import top_down_walk

_BISECTION_STEPS = 200


def _f(rho: float, a: float, b: float, k: int) -> float:
    """p_acc(ρ) − ρ β(ρ) with β(ρ) = a/ρ + b."""
    beta = min(1.0, a / rho + b)
    return 1.0 - (1.0 - beta) ** k - rho * beta


_SORT_LIMIT = 2048  # above this many breakpoints, bucket them first
_BUCKETS = 1024


def spectr_rho(p: torch.Tensor, q: torch.Tensor, k: int) -> float:
    """ρ* for k i.i.d. candidates (the upper end of a bracket of width < 1e-15·k).

    Args:
        p: Tensor[V], target row.
        q: Tensor[V], draft row.
        k: number of candidates.
    """
    if k <= 1:
        return 1.0
    # Tokens with p <= q contribute p/ρ for every ρ >= 1; tokens with p >= k q contribute q
    # for every ρ <= k; only the ratios in (1, k) are breakpoints.
    low = p <= q
    high = p >= k * q
    mid = ~(low | high)
    a0 = float(torch.where(low, p, 0.0).sum())
    b0 = float(torch.where(high, q, 0.0).sum())
    pm, qm = p[mid].double(), q[mid].double()
    ratios = pm / qm
    if ratios.numel() > _SORT_LIMIT:
        # Bucket the log-ratios; f at each non-empty bucket's largest ratio is exact from
        # the bucket sums, and the root lies in the first bucket where f <= 0, so only that
        # bucket's breakpoints are sorted.
        idx = (ratios.log() / math.log(k) * _BUCKETS).long().clamp_(0, _BUCKETS - 1)
        psum = torch.zeros(_BUCKETS, dtype=pm.dtype, device=pm.device).index_add_(0, idx, pm)
        qsum = torch.zeros(_BUCKETS, dtype=pm.dtype, device=pm.device).index_add_(0, idx, qm)
        rmax = torch.ones(_BUCKETS, dtype=pm.dtype, device=pm.device).scatter_reduce_(
            0, idx, ratios, "amax", include_self=False
        )
        filled = torch.zeros(_BUCKETS, dtype=torch.bool, device=pm.device).index_fill_(0, idx, True)
        a_up = a0 + psum.cumsum(0)  # tokens in buckets <= j contribute p/ρ at ρ = rmax_j
        b_up = b0 + qm.sum() - qsum.cumsum(0)
        beta = (a_up / rmax.clamp(min=1.0) + b_up).clamp(max=1.0)
        f = 1.0 - (1.0 - beta) ** k - rmax * beta
        hits = (filled & (f <= 0)).nonzero()
        j = int(hits[0]) if hits.numel() else _BUCKETS
        if j < _BUCKETS:
            sel = idx == j
            a_below = float(a_up[j - 1]) if j > 0 else a0
            b_above = float(b_up[j])
            return _solve_sorted(pm[sel], qm[sel], ratios[sel], a_below, b_above, k)
        # f > 0 at every breakpoint: the root is above them all, in the last piece.
        return _solve_sorted(pm[:0], qm[:0], ratios[:0], float(a_up[-1]), b0, k, lo=float(ratios.max()))
    return _solve_sorted(pm, qm, ratios, a0, b0, k)


def _solve_sorted(
    pm: torch.Tensor, qm: torch.Tensor, ratios: torch.Tensor, a0: float, b0: float, k: int, lo: float = 1.0
) -> float:
    """Root of f on breakpoints ``ratios``; tokens below contribute ``a0``/ρ, above ``b0``."""
    ratios, order = ratios.sort()
    pm, qm = pm[order], qm[order]
    # Between breakpoints r_(j) and r_(j+1): β = (a0 + Σ_{i≤j} p_i)/ρ + b0 + Σ_{i>j} q_i.
    a_cum = torch.cat([pm.new_zeros(1), pm.cumsum(0)]) + a0  # [M+1]
    b_cum = qm.sum() - torch.cat([qm.new_zeros(1), qm.cumsum(0)]) + b0  # [M+1]
    if ratios.numel():
        # f at each breakpoint r_(j), using the piece to its left (continuous there).
        beta = (a_cum[:-1] / ratios + b_cum[:-1]).clamp(max=1.0)
        f = 1.0 - (1.0 - beta) ** k - ratios * beta
        nonpos = (f <= 0).nonzero()
        j = int(nonpos[0]) if nonpos.numel() else ratios.numel()
    else:
        j = 0
    lo = float(ratios[j - 1]) if j > 0 else lo
    hi = float(ratios[j]) if j < ratios.numel() else float(k)
    a, b = float(a_cum[j]), float(b_cum[j])
    if _f(lo, a, b, k) <= 0:  # root at the left breakpoint (or at 1)
        return lo
    for _ in range(_BISECTION_STEPS):
        mid_rho = 0.5 * (lo + hi)
        if mid_rho <= lo or mid_rho >= hi:
            break
        if _f(mid_rho, a, b, k) <= 0:
            hi = mid_rho
        else:
            lo = mid_rho
    return hi


def spectr_solve(
    p: torch.Tensor, q: torch.Tensor, candidates: list[int], sampler: Sampler, rho: float | None = None
) -> tuple[int, bool]:
    """One node of K-SEQ; returns (token, drawn from unmodified p). ``rho``: precomputed ρ*(p, q, k)."""
    k = len(candidates)
    if rho is None:
        rho = spectr_rho(p, q, k)
    for x in candidates:
        qx = float(q[x])
        if qx > 0 and sampler.flip(min(1.0, float(p[x]) / (rho * qx))):
            return x, False
    m = torch.minimum(p / rho, q)
    beta = float(m.sum())
    if beta <= 0.0:  # disjoint supports: nothing could be accepted, the residual is p
        return sampler.categorical(p), True
    gamma = (1.0 - (1.0 - min(beta, 1.0)) ** k) / beta
    return sampler.categorical(normalized_or(positive_part(p - gamma * m), p)), False


def verify_spectr(tree: DraftTree, target_probs: torch.Tensor, sampler: Sampler) -> VerifyResult:
    """SpecTr K-SEQ over an i.i.d. (or delayed) tree, k = the node's number of draws."""
    return top_down_walk(tree, target_probs, sampler, spectr_solve, distinct=False)
