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

import torch

from adaptive_spec.rng import Sampler, TorchSampler
from adaptive_spec.trees import DraftLaw, DraftTree
from adaptive_spec.trees.draw import draw_tokens
from adaptive_spec.verifiers.base import (
    VerifyResult,
    accept_prob,
    host_read,
    normalized_or,
    positive_part,
    result_for,
    ride_first,
    run_ahead,
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

    Every fed slot runs :func:`rrs_solve` at once, candidate by candidate (at most K steps over [fed, V] rows):
    its candidates are the draws at its prefix (:meth:`SlotLayout.groups`), each accepted with probability
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
    cand, real = layout.candidates(device)
    active = real & layout.groups(tokens) & valid[cand]  # [fed, K]
    x = tokens[cand].clamp_min(0)  # [fed, K] candidate tokens (padding: slot 0, the root, -1)
    accepted, p = _solve_rows(target_probs[:fed], tree.draft_probs[:fed], x, active, generator, without_replacement)
    # The walk, on the device: from the root to each accepted candidate's slot (a walker on a duplicate slot has
    # the rows and the law of the node it stands for), then Y from where it stops.
    node = torch.zeros(1, dtype=torch.long, device=device)
    for _ in range(layout.shape.depth):
        inner = node < fed
        j = torch.where(inner, accepted[node.clamp_max(fed - 1)], -1)
        node = torch.where(j >= 0, cand[node.clamp_max(fed - 1), j.clamp_min(0)], node)
    inner = (node < fed)[:, None]
    row = torch.where(inner, p[node.clamp_max(fed - 1)], target_probs[node])
    y = draw_tokens(row, 1, generator)[:, 0]  # LongTensor[1]
    parts = [node, y] + ([] if ride is None else [ride])
    (slot,), (token,), *rest = host_read(tree, *parts)  # the one host read
    at = slot if tree.used[slot] else tree.child_with_token(tree.parents[slot], tree.tokens[slot])
    return result_for(tree, at, token, not tree.child_draws[at], rest[0] if rest else (), y)


def _solve_rows(
    p: torch.Tensor,
    q: torch.Tensor,
    x: torch.Tensor,
    active: torch.Tensor,
    generator: torch.Generator,
    without_replacement: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`rrs_solve` at every row at once: each row's candidates ``x`` [M, K] (where ``active``) tried in
    order; returns the accepted column per row (-1: none) and the rows' final residuals [M, V].
    """
    q = q.to(p.dtype)
    u = torch.rand(x.shape, generator=generator, device=p.device, dtype=torch.float64)
    accepted = torch.full((p.shape[0],), -1, dtype=torch.long, device=p.device)
    for j in range(x.shape[1]):
        xj = x[:, j : j + 1]
        pa, qa = p.gather(1, xj)[:, 0].double(), q.gather(1, xj)[:, 0].double()
        a = torch.where(qa > 0, (pa / qa.clamp_min(1e-300)).clamp_max(1.0), torch.zeros_like(qa))
        live = active[:, j] & (accepted < 0)
        accepted = torch.where(live & (u[:, j] < a), j, accepted)
        rejected = (live & (accepted < 0))[:, None]
        r = (p - q).clamp_min_(0.0)
        total = r.sum(dim=-1, keepdim=True)
        p = torch.where(rejected & (total > 0), r / total.clamp_min(1e-30), p)  # an all-zero residual keeps p
        if without_replacement:
            qz = q.scatter(1, xj, 0.0)
            qt = qz.sum(dim=-1, keepdim=True)
            q = torch.where(rejected & (qt > 0), qz / qt.clamp_min(1e-30), q)
    return accepted, p


def rrs_on_children(
    tree: DraftTree, target_probs: torch.Tensor, generator: torch.Generator, ride: torch.Tensor | None = None
) -> VerifyResult:
    """RRSw on the rows' device for a tree drawn without replacement whose children table is on the device (a
    policy tree's: :meth:`DraftTree.children_tensor`); one host read. Taken on an accelerator
    (:func:`~adaptive_spec.verifiers.base.run_ahead`): it solves every node's rows, where the host walk solves
    only the visited nodes', which a CPU does faster.

    Without replacement a node's draws are its children, in order, so the table gives every node's candidates:
    every node runs :func:`rrs_solve` at once (a node with no children accepts none), the walk follows the
    accepted children from the root on the device, and ``Y`` is drawn where it stops, as in
    :func:`rrs_on_slots`.
    """
    device, n = target_probs.device, tree.num_nodes
    cand = tree.children_tensor(device)  # [N, W], padded with N
    active = cand < n
    x = tree.tokens_tensor(device)[cand.clamp_max(n - 1)].clamp_min(0)
    accepted, p = _solve_rows(target_probs[:n], tree.draft_probs[:n], x, active, generator, True)
    node = torch.zeros(1, dtype=torch.long, device=device)
    for _ in range(tree.shape.depth):
        j = accepted[node]
        node = torch.where(j >= 0, cand[node, j.clamp_min(0)], node)
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
    if (
        isinstance(sampler, TorchSampler)
        and without_replacement
        and tree.shape.law in (DraftLaw.DYNAMIC_WOR, DraftLaw.DYNAMIC_CHAIN)
        and tree.has_tensors(target_probs.device, "children", "tokens")
        and run_ahead(target_probs.device)  # every node's rows at once: an accelerator's work, not a CPU's
    ):
        return rrs_on_children(tree, target_probs, sampler.generator, ride)

    def solver(p, q, candidates, s):
        return rrs_solve(p, q, candidates, s, without_replacement=without_replacement)

    return ride_first(
        tree, ride, lambda: top_down_walk(tree, target_probs, sampler, solver, distinct=without_replacement)
    )
