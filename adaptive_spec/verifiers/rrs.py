"""The node solver of recursive rejection sampling, shared by SpecInfer's multi-step speculative
sampling (with replacement, :mod:`~adaptive_spec.verifiers.specinfer`) and RRSw / RSD (without
replacement, :mod:`~adaptive_spec.verifiers.rrsw`). docs/algorithms.md §5.

Node solver, for candidates x_1..x_k at a node with target p and draft q::

    p' = p, q' = q
    for j in 1..k:
        accept x_j with probability min(1, p'(x_j) / q'(x_j))
        p' = norm((p' − q')_+)
        without replacement only: q'(x_j) = 0, q' = norm(q')
    otherwise return Y ~ p'

SpecInfer takes every draw with multiplicity (i.i.d. candidates); RRSw takes distinct
candidates drawn one after another without replacement. Mixing the two contracts is lossy.
"""

from __future__ import annotations

import functools

import torch

from adaptive_spec.rng import Sampler, TorchSampler
from adaptive_spec.trees import DraftLaw, DraftTree
from adaptive_spec.trees.draw import draw_tokens
from adaptive_spec.verifiers import kernels
from adaptive_spec.verifiers.base import (
    VerifyResult,
    accept_prob,
    host_read,
    normalized_or,
    positive_part,
    result_for,
    ride_first,
    run_ahead,
    scalars,
)
from adaptive_spec.verifiers.walk import top_down_walk


def rrs_solve(
    p: torch.Tensor, q: torch.Tensor, candidates: list[int], sampler: Sampler, *, without_replacement: bool
) -> tuple[int, bool]:
    """One node of recursive rejection sampling; returns (token, drawn from unmodified p)."""
    touched = False
    for x in candidates:
        if sampler.flip(accept_prob(float(p[x]), float(q[x]))):
            return x, False
        # Residual; an all-zero residual means p' == q' and the rejection had probability 0.
        p = normalized_or(positive_part(p - q), p)
        touched = True
        if without_replacement:
            q = q.clone()
            q[x] = 0.0
            q = normalized_or(q, q)
    return sampler.categorical(p), not touched


def rrs_on_slots(
    tree: DraftTree,
    target_probs: torch.Tensor,
    generator: torch.Generator,
    *,
    without_replacement: bool,
    ride: torch.Tensor | None = None,
) -> VerifyResult:
    """Recursive rejection sampling of a slot tree (:mod:`adaptive_spec.trees.slots`) on the rows' device.

    Every fed slot runs :func:`rrs_solve` at once (:func:`rrs_states`, one pass over the vocabulary per candidate
    column): its candidates are the draws at its prefix (:meth:`SlotLayout.drawn`), each accepted with probability
    ``min(1, p'(x) / q'(x))``, the residual ``p' = norm((p' − q')_+)`` after each rejection (and ``q'(x) = 0``
    renormalised without replacement). A node's outcome depends only on its own rows and draws, and the walk
    visits a node at most once, so running all of them ahead leaves the law unchanged. The walk runs on the
    device from the root, to each accepted candidate's slot (a walker on a duplicate slot has the rows, and
    so the law, of the node it stands for), and ``Y`` is drawn where it stops, from the final residual (a
    leaf's target row: a bonus). One host read brings back the slot, ``Y``, ``ride`` and the tree's tokens and
    flags; a duplicate slot is reported as the node it stands for.
    """
    layout, valid = tree.slots
    device, fed = target_probs.device, layout.fed
    tokens = tree.tokens_tensor(device)
    cand, _ = layout.candidates(device)
    active = layout.drawn(tokens, valid)  # [fed, K]
    x = tokens[cand].clamp_min(0)  # [fed, K] candidate tokens (padding: slot 0, the root, -1)
    step, residual = _solve_rows(
        target_probs[:fed], tree.draft_probs[:fed], cand, x, active, generator, without_replacement
    )
    # The walk, on the device: from the root to each accepted candidate's slot (a walker on a duplicate slot has
    # the rows and the law of the node it stands for), then Y from where it stops.
    node = follow_accepted(step, target_probs.shape[0], layout.shape.depth)
    inner = (node < fed)[:, None]
    row = torch.where(inner, residual[node.clamp_max(fed - 1)], target_probs[node])
    y = draw_tokens(row, 1, generator)[:, 0]  # LongTensor[1]
    parts = [node, y] + ([] if ride is None else [ride])
    (slot,), (token,), *rest = host_read(tree, *parts)  # the one host read
    at = slot if tree.used[slot] else tree.child_with_token(tree.parents[slot], tree.tokens[slot])
    return result_for(tree, at, token, not tree.child_draws[at], rest[0] if rest else (), y)


def follow_accepted(step: torch.Tensor, n: int, depth: int) -> torch.Tensor:
    """The node where the walk from the root stops (LongTensor[1]), on the device, in ``⌈log2 depth⌉ + 1`` indexings.

    ``step`` [M, 1]: the next node of each of the first M nodes (its accepted candidate, or itself:
    :func:`_solve_rows`); ``n``: the number of nodes (those from M on are leaves, their own next node). The next
    nodes are one table; squaring it ``⌈log2 depth⌉`` times gives where ``depth`` steps lead, and the walk takes at
    most ``depth`` steps.
    """
    m = step.shape[0]
    nxt = step.view(-1) if m == n else torch.cat([step, _steps(n, step.device)[m:]]).view(-1)
    for _ in range(max(depth - 1, 0).bit_length()):
        nxt = nxt[nxt]
    return nxt[:1]


@functools.lru_cache(maxsize=64)
def _steps(n: int, device: torch.device) -> torch.Tensor:
    """LongTensor[n, 1] of ``0 .. n - 1`` (each node its own next node), made once: read only."""
    return torch.arange(n, device=device)[:, None]


def rrs_states(
    p: torch.Tensor, q: torch.Tensor, x: torch.Tensor, active: torch.Tensor, without_replacement: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`rrs_solve` at every row at once, with no randomness: the probability that each active candidate is
    accepted when it is tried (every earlier one rejected), float64 [M, K] (0 where inactive), and each row's
    residual after every active candidate is rejected, unnormalised, in the rows' dtype [M, V] (``p`` itself
    where none is active).

    The residuals stay in one form: after ``j`` rejections ``p' ∝ (p − c_j q)_+`` with a scalar ``c_j`` per row.
    Rejecting ``x`` from ``p' = (p − c q)_+ / N`` against ``q' = q / L`` leaves ``(p' − q')_+ ∝ (p − (c + N / L) q)_+``
    (where ``p − c q ≤ 0`` both sides are 0), so each candidate costs one pass over the vocabulary: the new
    ``N = Σ (p − c q)_+``. An all-zero residual (a rejection of probability 0) keeps ``p'``, as :func:`rrs_solve`
    does. Without replacement, ``q'(x) = 0`` after ``x`` is rejected and ``q'`` is renormalised (``L`` falls
    by ``q(x)``), and ``p'(x)`` stays at its value then: ``x`` is frozen, written into ``p``'s copy and zeroed
    in ``q``'s. With replacement ``L = 1``. Inactive columns change nothing. On CUDA, one launch of a fused kernel
    with the same arithmetic (:func:`adaptive_spec.verifiers.kernels.rrs_rows`), else the torch code below.
    """
    dtype, (m, k), v = p.dtype, x.shape, p.shape[1]

    def rows_dtype(t: torch.Tensor) -> torch.Tensor:  # a no-op cast is an op (a launch) too
        return t if t.dtype == dtype else t.to(dtype)

    q = rows_dtype(q)
    if kernels.fused_on(p.device):  # a row a program, one launch (adaptive_spec.verifiers.kernels)
        try:
            return kernels.rrs_rows(p, q, x, active, without_replacement)
        except Exception as exc:  # noqa: BLE001 - any failure of the kernel: the torch code below
            kernels.failed("RRS", exc)
    px, qx = p.gather(1, x).double(), q.gather(1, x).double()
    on = active.double()
    c, n = scalars(m, 0.0, p.device), scalars(m, 1.0, p.device)  # p' = p: c = 0, N = 1
    if without_replacement:
        gone = qx * on  # the draft mass each rejection removes
        # L when each candidate is tried: q's total less the mass of the rejected candidates before it
        ell = (q.sum(dim=-1, keepdim=True, dtype=torch.float64) - gone.cumsum(dim=1) + gone).clamp_min_(1e-300)
        step = on / ell  # c's increment per unit of N
        pad = torch.nn.functional.pad
        pz, qz = pad(p, (0, 1)), pad(q, (0, 1))  # rejected tokens frozen; column v takes the inactive columns'
        at = torch.where(active, x, v).split(1, dim=1)
        px_on, qx_cols = (px * on).split(1, dim=1), qx.split(1, dim=1)  # p (0 where inactive) and q, per candidate
    else:
        step, pz, qz = on, p, q
    cs, ns = [], []
    for j, inc in enumerate(step.split(1, dim=1)):
        cs.append(c)
        ns.append(n)
        c2 = torch.addcmul(c, n, inc)  # c + N / L on an active column
        r = torch.addcmul(pz, qz, rows_dtype(c2), value=-1.0).clamp_min_(0.0)
        n2 = r.sum(dim=-1, keepdim=True, dtype=torch.float64)
        keep = n2 > 0  # else the residual is all zero: keep p'
        c, n = torch.where(keep, c2, c), torch.where(keep, n2, n)
        if without_replacement and j + 1 < k:  # freeze the rejected token: p'(x) now, q'(x) = 0
            f = torch.addcmul(px_on[j], qx_cols[j], c, value=-1.0).clamp_min_(0.0)
            pz.scatter_(1, at[j], rows_dtype(f))
            qz.scatter_(1, at[j], 0.0)
    residual = torch.addcmul(pz, qz, rows_dtype(c), value=-1.0).clamp_min_(0.0)
    residual = residual[:, :v] if without_replacement else residual
    num = torch.addcmul(px, qx, torch.cat(cs, dim=1), value=-1.0).clamp_min_(0.0)  # (p − c q)_+ when tried
    den = torch.cat(ns, dim=1) * qx * step  # N q(x) / L; 0 on an inactive column or a q = 0 candidate (never drafted)
    accept = torch.where(den > 0, (num / den).clamp_max_(1.0), 0.0)
    return accept, residual


def _solve_rows(
    p: torch.Tensor,
    q: torch.Tensor,
    cand: torch.Tensor,
    x: torch.Tensor,
    active: torch.Tensor,
    generator: torch.Generator,
    without_replacement: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`rrs_solve` at every row at once: each row's candidates ``x`` [M, K] (where ``active``; their nodes
    ``cand``) tried in order with one uniform each; returns each row's next node [M, 1] (its first accepted
    candidate's, else the row itself: :func:`follow_accepted`'s table) and the rows' final residuals [M, V]
    (unnormalised, :func:`rrs_states`).
    """
    accept, residual = rrs_states(p, q, x, active, without_replacement)
    u = torch.rand(x.shape, generator=generator, device=p.device, dtype=torch.float64)
    hit = u < accept  # an inactive column accepts with probability 0
    first = hit.byte().argmax(dim=1, keepdim=True)
    step = torch.where(hit.any(dim=1, keepdim=True), cand.gather(1, first), _steps(cand.shape[0], p.device))
    return step, residual


def rrs_on_children(
    tree: DraftTree,
    target_probs: torch.Tensor,
    generator: torch.Generator,
    ride: torch.Tensor | None = None,
    *,
    without_replacement: bool = True,
) -> VerifyResult:
    """RRSw (or SpecInfer, ``without_replacement=False``) on the rows' device for a policy tree whose children
    table (without replacement: :meth:`DraftTree.children_tensor`) or draws table (i.i.d.: a drafter's
    :meth:`DraftTree.draws_tensor`) is on the device; one host read. Taken on an accelerator
    (:func:`~adaptive_spec.verifiers.base.run_ahead`): it solves every node's rows, where the host walk solves
    only the visited nodes', which a CPU does faster.

    Without replacement a node's draws are its children, in order; with replacement its draws (duplicates
    included, in draw order) are its candidates: every node runs :func:`rrs_solve` at once (a node with no
    children accepts none), the walk follows the accepted draws' nodes from the root on the device, and ``Y`` is
    drawn where it stops, as in :func:`rrs_on_slots`.
    """
    device, n = target_probs.device, tree.num_nodes
    cand = tree.children_tensor(device) if without_replacement else tree.draws_tensor(device)  # [N, W], padded with N
    active = cand < n
    x = tree.tokens_tensor(device)[cand.clamp_max(n - 1)].clamp_min(0)
    step, p = _solve_rows(target_probs[:n], tree.draft_probs[:n], cand, x, active, generator, without_replacement)
    node = follow_accepted(step, n, tree.shape.depth)
    y = draw_tokens(p[node], 1, generator)[:, 0]  # LongTensor[1]: the final residual (a leaf's: its row)
    parts = [node, y] + ([] if ride is None else [ride])
    (at,), (token,), *rest = host_read(tree, *parts)  # the one host read
    return result_for(tree, at, token, not tree.child_draws[at], rest[0] if rest else (), y)


def verify_rrs(
    tree: DraftTree,
    target_probs: torch.Tensor,
    sampler: Sampler,
    ride: torch.Tensor | None,
    *,
    without_replacement: bool,
) -> VerifyResult:
    """SpecInfer (i.i.d. draws, with multiplicity) or RRSw (distinct draws): the top-down walk with
    :func:`rrs_solve` at each node; a tree drafted into slots, verified with a ``torch.Generator``'s sampler
    (the engine's case), on the rows' device with one host read (:func:`rrs_on_slots`).
    """
    if isinstance(sampler, TorchSampler) and tree.slots is not None:
        return rrs_on_slots(tree, target_probs, sampler.generator, without_replacement=without_replacement, ride=ride)
    # a chain draws once a node, with or without replacement alike: its children table is its draws
    distinct = without_replacement or tree.shape.law in (DraftLaw.CHAIN, DraftLaw.DYNAMIC_CHAIN)
    table = "children" if distinct else "draws"  # a node's candidates, on the device
    laws = (DraftLaw.DYNAMIC_WOR, DraftLaw.DYNAMIC_CHAIN, DraftLaw.CHAIN) if distinct else (DraftLaw.DYNAMIC_IID,)
    if (
        isinstance(sampler, TorchSampler)
        and tree.shape.law in laws
        and tree.has_tensors(target_probs.device, table, "tokens")
        and run_ahead(target_probs.device)  # every node's rows at once: an accelerator's work, not a CPU's
    ):
        return rrs_on_children(tree, target_probs, sampler.generator, ride, without_replacement=distinct)

    def solver(p, q, candidates, s):
        return rrs_solve(p, q, candidates, s, without_replacement=without_replacement)

    return ride_first(
        tree, ride, lambda: top_down_walk(tree, target_probs, sampler, solver, distinct=without_replacement)
    )
