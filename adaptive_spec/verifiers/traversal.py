"""Traversal verification, TV (Weng et al., arXiv 2505.12398), docs/algorithms.md §4.

Post-order traversal of the tree, bottom-up. Each surviving node n carries a target row
Mb[n] (initially p(·|n)), a draft row Ms[n] (initially q(·|n)) and a weight
w[c] = min(1, w[n] · Mb[n][t_c] / Ms[n][t_c]) for each child c. The first leaf in drafting
order is accepted whole with probability w[leaf]; otherwise it is deleted and its parent n
is updated as one step of sequence-level RRSw over an augmented vocabulary:

    r = (w[n] · Mb[n] − Ms[n])_+,  S = Σ r,
    w[n] ← S / (S + 1 − w[n]),  Mb[n] ← r / S,  Ms[n][t] ← 0 then renormalise,

and the weights of n's remaining subtrees are recomputed top-down. The node that is
finally accepted emits a token from its current Mb row (the bonus token if it was never
touched, a recovered token otherwise).

Lossless for chains (where it equals BV), for trees drawn without replacement, and for
i.i.d. trees with duplicates merged (children in order of first appearance).

w is never clamped with an epsilon (docs/algorithms.md §4). Speed at large vocabularies:
rows are never copied up front. A node's Mb row is the target's own row until its first
rejection, then the residual vector; its Ms row is the draft's own row plus the set of tokens
zeroed so far and a scale. A rejection costs three passes over the vocabulary in the rows'
dtype (a fused ``Mb − α·Ms``, the clamp, and a float64-accumulated sum), and Ms is touched
only at nodes that still have children. The reference keeps Mb and Ms in float64: the
exact tests run on float64 rows, so they check this code in float64; the engine's rows are
the models' float32 probabilities, whose own rounding is of the same order as float32
arithmetic on them, and every sum is accumulated in float64.

Host reads of this lazy walk (the CPU's path): one first (every edge's p and q, a block of uniforms, the
caller's ride and a drafted tree's tokens), one per rejection (the residual's mass; where the node keeps
children, with the residual at every node's token, so that their weights need no read of their own (their draft
masses are the edges' q, read first), and at its first such rejection the draft row's total), and one for the
emitted token, drawn on the device.

On an accelerator the engine runs :func:`traversal_on_device` instead: every node's weights and rows computed
ahead on the device, with no read, and one host read for the outcome (docs/algorithms.md §4); on CUDA by fused
kernels, two launches a level (:mod:`adaptive_spec.verifiers.kernels`), else by the torch code.
"""

from __future__ import annotations

import functools

import torch

from adaptive_spec.rng import Sampler, TorchSampler
from adaptive_spec.trees import DraftTree
from adaptive_spec.trees.draw import draw_tokens
from adaptive_spec.verifiers import kernels
from adaptive_spec.verifiers.base import (
    VerifyResult,
    edge_values,
    host_read,
    positions,
    result_for,
    run_ahead,
    scalars,
)


def verify_traversal(
    tree: DraftTree, target_probs: torch.Tensor, sampler: Sampler, ride: torch.Tensor | None = None
) -> VerifyResult:
    """Traversal verification of a chain, an i.i.d./delayed tree or a without-replacement tree.

    On an accelerator (:func:`~adaptive_spec.verifiers.base.run_ahead`), with a ``torch.Generator``'s sampler:
    :func:`traversal_on_device`, one host read. Otherwise the reference's lazy walk, :func:`traversal_impl`, whose
    host reads are one for every edge's probabilities, the first block of uniforms and ``ride`` (with the tree's
    tokens if still on the device); one per rejection (its residual's mass, with the residual at every node's token
    and the draft row's total where the node keeps children); one for the emitted token.
    """
    device = target_probs.device
    if isinstance(sampler, TorchSampler) and sampler.generator.device.type == device.type and run_ahead(device):
        return traversal_on_device(tree, target_probs, sampler.generator, ride=ride)
    return traversal_impl(tree, target_probs, sampler, ride=ride)


def traversal_impl(
    tree: DraftTree,
    target_probs: torch.Tensor,
    sampler: Sampler,
    *,
    zero_rejected: bool = True,
    parent_rule: str = "residual",
    ride: torch.Tensor | None = None,
) -> VerifyResult:
    """Traversal verification with switches for the reference's negative controls.

    Only the defaults are lossless. ``zero_rejected=False`` (not removing the rejected token
    from the parent's draft row) and ``parent_rule="remaining_mass"`` (w ← min(1, S / the
    remaining draft mass)) are the lossy variants the exact test (docs/algorithms.md §9) rejects, kept so the
    exact tests can show that they are caught.
    """
    p_edge, q_edge, rode = _first_read(tree, target_probs, sampler, ride)
    n_nodes = tree.num_nodes
    parents, tokens = tree.parents, tree.tokens
    tok_all = tree.tokens_tensor(target_probs.device).clamp_min(0)  # every node's token, for the residuals' values
    # Original ratio p/q on every edge; a q = 0 edge cannot have been drafted, its weight is 0.
    ratio = [p / q if q > 0 else 0.0 for p, q in zip(p_edge, q_edge, strict=True)]
    children = [list(c) for c in tree.children]
    w = [1.0] * n_nodes
    for i in range(1, n_nodes):  # parents precede children
        w[i] = min(1.0, w[parents[i]] * ratio[i])
    # Lazy rows (see the module docstring): Mb[n] = cb * rb with rb a vector in the rows' dtype
    # (the target's own row until n's first rejection, no copy); Ms[n] = cs * q[n] with the
    # rejected tokens ``zeroed`` (q[n] itself until then, cs = 1). Scalars are float64. The values of rb at
    # every node's token come with the read of each rejection that leaves n children (``rb_at``; the target's own
    # row: ``p_edge``), the
    # draft's at the children's tokens are ``q_edge``, and a zeroed token's draft mass is its child's ``q_edge``.
    mb: dict[int, tuple[torch.Tensor, float]] = {}
    rb_at: dict[int, list[float]] = {}
    q_total: dict[int, float] = {}  # a draft row's total (float64), read with the first rejection that leaves n kids
    ms: dict[int, tuple[float, dict[int, float], torch.Tensor | None]] = {}

    def finish(node: int, bonus: bool) -> VerifyResult:
        row = mb[node][0] if not bonus else target_probs[node]
        if isinstance(sampler, TorchSampler) and row.device.type == sampler.generator.device.type:
            y = draw_tokens(row[None], 1, sampler.generator)[:, 0]  # on the device: the next step's input
            return result_for(tree, node, y.item(), bonus=bonus, ride=rode, on_device=y)
        return result_for(tree, node, sampler.categorical(row), bonus=bonus, ride=rode)

    while True:
        leaf = 0
        while children[leaf]:
            leaf = children[leaf][0]
        if leaf == 0 or sampler.flip(w[leaf]):
            return finish(leaf, bonus=leaf not in mb)

        # Reject the leaf: delete it and update its parent n.
        n, t = parents[leaf], tokens[leaf]
        children[n].pop(0)
        if w[n] <= 0.0:
            # A parent of weight 0 (a residual of mass 0 before, or p = 0 on its edge) keeps it (S = 0), and every
            # node under it got weight 0 with it: nothing there is accepted, and its rows would not change (a node
            # of weight 0 is never accepted but the root, whose rows were set by the rejection that zeroed it).
            # Three in four of a 48-node tree's rejections at T = 1: no residual, total or copy is made for them.
            continue
        rb, cb = mb[n] if n in mb else (target_probs[n], 1.0)
        q = tree.draft_probs[n]
        cs, zeroed, qz = ms.get(n, (1.0, {}, None))
        # r = (w · Mb − Ms)_+ / (w · cb); its values at the tokens only where n keeps children (their weights), and
        # q's total once, the first time they are needed (the Ms of the children left; the negative control's mass)
        more = bool(children[n])
        total_now = n not in q_total and (more or parent_rule == "remaining_mass")
        r, r_sum, r_at, total = _residual(rb, w[n] * cb, q, cs, qz, tok_all if more else None, total_now)
        if total_now:
            q_total[n] = total
        s = w[n] * cb * r_sum  # S = Σ (w · Mb − Ms)_+
        if parent_rule == "residual":
            new_w = s / (s + (1.0 - w[n])) if s > 0 else 0.0
        elif parent_rule == "remaining_mass":  # negative control, lossy
            remaining = cs * (_mass(q_total[n], zeroed) - q_edge[leaf])
            new_w = min(1.0, s / remaining) if remaining > 0 else 0.0
        else:
            raise ValueError(f"unknown parent_rule {parent_rule!r}")
        w[n] = new_w
        if s > 0:
            rb, cb = r, 1.0 / r_sum  # Mb ← r / Σ r
            if more:
                rb_at[n] = r_at
        mb[n] = (rb, cb)
        kids = children[n]
        if zero_rejected and kids:  # Ms[n] is read again only if n has children left
            zeroed = {**zeroed, t: q_edge[leaf]}
            qz = q.clone() if qz is None else qz  # n's own copy, updated in place from then on
            qz[t] = 0.0  # a Python index: no copy
            total = _mass(q_total[n], zeroed)
            if total > 0:
                cs = 1.0 / total
            ms[n] = (cs, zeroed, qz)

        # Recompute the weights of n's remaining subtrees, top-down.
        if kids:
            at = rb_at.get(n)
            stack = []
            for c in kids:
                a = (at[c] if at is not None else p_edge[c]) * cb
                b = 0.0 if tokens[c] in zeroed else cs * q_edge[c]
                w[c] = min(1.0, w[n] * a / b) if b > 0 else 0.0
                stack.extend(children[c])
            while stack:
                d = stack.pop()
                w[d] = min(1.0, w[parents[d]] * ratio[d])
                stack.extend(children[d])


def _first_read(
    tree: DraftTree, target_probs: torch.Tensor, sampler: Sampler, ride: torch.Tensor | None
) -> tuple[list[float], list[float], tuple[int, ...]]:
    """``p`` and ``q`` on every edge (0.0 at the root) and ``ride``: one read.

    A slot tree's edges are read at its slots' parents (:mod:`adaptive_spec.trees.slots`), whose rows are
    those of the merged parents' prefixes; the first block of the sampler's uniforms comes along. A draft row's
    total is read with the first rejection at its node that leaves it children (:func:`_residual`): most nodes have
    none, and a float64 sum of every row costs a CPU more than the rest of the walk.
    """
    device = target_probs.device
    slots = tree.slots
    par = slots[0].parents_tensor(device) if slots is not None else None
    parts = [edge_values(tree, target_probs, par), edge_values(tree, tree.draft_probs, par)]
    uniforms = sampler.next_block(device) if isinstance(sampler, TorchSampler) else None
    if uniforms is not None:
        parts.append(uniforms)
    if ride is not None:
        parts.append(ride)
    values = host_read(tree, *parts)
    if uniforms is not None:
        sampler.load_block(values[2])
    return [0.0, *values[0]], [0.0, *values[1]], tuple(int(v) for v in values[-1]) if ride is not None else ()


def _mass(total: float, zeroed: dict[int, float]) -> float:
    """Σ q over the tokens not in ``zeroed`` (float64): the row's total less the zeroed tokens' draft masses."""
    return max(total - sum(zeroed.values()), 0.0) if zeroed else max(total, 0.0)


def _residual(
    rb: torch.Tensor,
    scale_b: float,
    q: torch.Tensor,
    cs: float,
    qz: torch.Tensor | None,
    tok_all: torch.Tensor | None,
    with_total: bool = False,
) -> tuple[torch.Tensor, float, list[float] | None, float]:
    """``r = (scale_b·rb − cs·q_zeroed)_+ / scale_b``, ``Σ r`` (float64), r at every node's token (``tok_all``; None:
    not read) and, ``with_total``, ``Σ q`` (float64; else 0.0): one read.

    Three passes over the vocabulary in the rows' dtype (one fused ``rb − α q``, the clamp,
    the float64-accumulated sum). ``qz``: ``q`` with the rejected tokens' entries set to 0 (Ms = 0 there, so
    r = rb exactly: ``rb − α·0``), or None when none is rejected yet. The values at the tokens are read in the rows'
    dtype (exact as Python floats). ``scale_b`` is positive: the walk skips parents of weight 0, and ``cb >= 1``.
    """
    total = q.sum(dtype=torch.float64, dim=0, keepdim=True) if with_total else None
    alpha = cs / scale_b
    if alpha < 1e30:
        r = torch.sub(rb, q if qz is None else qz, alpha=alpha)
    else:  # a tiny weight: avoid overflowing alpha·q in float32
        r = rb * (scale_b / cs) - (q if qz is None else qz)
        r.mul_(cs / scale_b)
        if qz is not None:  # a zeroed token keeps rb exactly (the scaling round trip may round it)
            r = torch.where(qz != q, rb, r)
    r.clamp_(min=0.0)
    parts = [r.sum(dtype=torch.float64, dim=0, keepdim=True)]
    if tok_all is not None:
        parts.append(r[tok_all])
    if total is not None:
        parts.append(total)
    values = (torch.cat(parts) if len(parts) > 1 else parts[0]).tolist()  # the rejection's read
    at = values[1 : 1 + tok_all.numel()] if tok_all is not None else None
    return r, values[0], at, (values[-1] if total is not None else 0.0)


def traversal_on_device(
    tree: DraftTree,
    target_probs: torch.Tensor,
    generator: torch.Generator,
    *,
    ride: torch.Tensor | None = None,
    zero_rejected: bool = True,
) -> VerifyResult:
    """Traversal verification on the rows' device with one host read (the engine's path, a ``torch.Generator``).

    The weights and rows that :func:`traversal_impl` computes do not depend on its flips: the flips only decide
    where the traversal stops. A node's updates are those of rejecting its children one after another, from its
    weight when it is first reached, which is set by its parent's state after the rejections of its earlier
    siblings. So every node's trajectory is computed ahead (:func:`traversal_states`), level by level from the
    root (all nodes of a level at once, child column by child column), with no read: each node's weight when it
    is tested as a leaf and its final ``Mb`` row. Then every node flips its own uniform against that weight,
    the first flagged node in post-order (the root at last) is found bottom-up, level by level, and its token
    is drawn from its row (the target's own row for a leaf: the bonus). The law is the reference's: the flips
    are independent and tested in the same order. One host read brings back the node, its token, ``ride`` and
    a drafted tree's tokens.

    Rows are the target's dtype, scalars float64, as in :func:`traversal_impl` (whose overflow guard for a
    tiny weight is a clamp of ``α`` at 3e38 here: it differs only for weights below about 1e-38).
    ``zero_rejected=False`` is the reference's lossy negative control (the rejected token stays in ``Ms``).
    """
    node = None
    if kernels.fused_on(target_probs.device):  # a level a launch (adaptive_spec.verifiers.kernels)
        try:
            node, row = _fused_outcome(tree, target_probs, generator, zero_rejected)
        except Exception as exc:  # noqa: BLE001 - any failure of a kernel: the torch code below
            kernels.failed("traversal", exc)
    if node is None:
        node, row = _outcome(tree, target_probs, generator, zero_rejected)
    y = draw_tokens(row, 1, generator)[:, 0]  # LongTensor[1]
    parts = [node, y] + ([] if ride is None else [ride])
    (accepted,), (token,), *rest = host_read(tree, *parts)  # the one host read
    return result_for(tree, accepted, token, not tree.children[accepted], rest[0] if rest else (), y)


def _outcome(
    tree: DraftTree, target_probs: torch.Tensor, generator: torch.Generator, zero_rejected: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`traversal_on_device`'s accepted node (LongTensor[1]) and the row its token is drawn from, by the torch
    code: the states, each node's flip, the first flagged node in post-order found bottom-up, level by level.
    """
    n, device = tree.num_nodes, target_probs.device
    levels = _device_levels(tree, device)
    w, residuals, pos = traversal_states(tree, target_probs, levels, zero_rejected=zero_rejected, fused=False)
    found = torch.rand(n + 1, dtype=torch.float64, device=device, generator=generator) < w  # each node's flip
    # the root is accepted when everything below is rejected; the dummy never (slices: a fill each, where a write
    # of one element copies the number from the host)
    found[:1], found[n:] = True, False
    first = torch.arange(n + 1, device=device)  # the first flagged node in post-order under each node
    for parents, cand, _, _ in reversed(levels):
        below = found[cand]  # an inactive column points at the dummy, never flagged
        j = below.byte().argmax(dim=1, keepdim=True)  # the first child (in drafting order) with a flagged node below
        hit = below.any(dim=1)
        first[parents] = torch.where(hit, first[cand.gather(1, j)[:, 0]], parents)
        found[parents] |= hit
    node = first[:1]
    row = target_probs[node]
    if levels:  # a node with children emits from its residual
        at = pos[node]
        row = torch.where(at[:, None] >= 0, residuals[at.clamp_min(0)], row)
    return node, row


def _fused_outcome(
    tree: DraftTree, target_probs: torch.Tensor, generator: torch.Generator, zero_rejected: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`_outcome` with the fused kernels: a launch a level for the states, then one a level for the search
    (the generator's draws in the same order: every node's flip, then the token).
    """
    n, device = tree.num_nodes, target_probs.device
    w, rows, levels = _fused_states(tree, target_probs, zero_rejected)
    found = torch.rand(n + 1, dtype=torch.float64, device=device, generator=generator) < w  # each node's flip
    first = torch.arange(n + 1, device=device)  # the root's and the dummy's flags are never read
    for parents, cand, tok, act, row0, count, merge in reversed(levels):
        kernels.traversal_search_level(parents, cand, tok, act, found, first, row0, count, merge)
    node = first[:1]
    return node, rows[node]


def traversal_states(
    tree: DraftTree,
    target_probs: torch.Tensor,
    levels: list | None = None,
    *,
    zero_rejected: bool = True,
    fused: bool = True,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Every node's weight when traversal tests it as a leaf and the row it emits from if accepted, computed on
    the rows' device with no host read (see :func:`traversal_on_device`).

    Returns ``(w, residuals, pos)``: ``w`` float64 [N + 1] (the last entry a dummy), ``residuals`` [P, V] the final
    ``Mb`` rows of the P nodes with children, and ``pos`` LongTensor[N + 1], each node's row in ``residuals``
    (-1 for a leaf, whose row is the target's own). Nodes a verifier cannot reach (a slot tree's unused slots)
    have arbitrary values. ``levels``: :func:`_device_levels`, if the caller has them.
    """
    device, dtype = target_probs.device, target_probs.dtype
    n = tree.num_nodes
    if fused and kernels.fused_on(device):  # a level a launch (adaptive_spec.verifiers.kernels): every node's row
        try:
            w, rows, _ = _fused_states(tree, target_probs, zero_rejected)
            return w, rows, positions(n + 1, device)
        except Exception as exc:  # noqa: BLE001 - any failure of the kernel: the torch code below
            kernels.failed("traversal", exc)
    levels = _device_levels(tree, device) if levels is None else levels
    w_all = torch.ones(n + 1, 1, dtype=torch.float64, device=device)  # each node's weight; row n is a dummy
    residuals, order = [], []
    for parents, cand, tok, act in levels:
        w = w_all[parents]  # [P, 1]
        rb = target_probs[parents]
        q = tree.draft_probs[parents]
        q = q if q.dtype == dtype else q.to(dtype)
        qz, left = q, q.sum(dim=-1, keepdim=True, dtype=torch.float64)
        q_t = q.gather(1, tok).double()  # [P, K] the draft's mass at each child's token
        gone = q_t * act  # the draft mass each rejection zeroes
        cb = cs = scalars(len(parents), 1.0, device)
        k = cand.shape[1]
        ratios, at_child = [], []  # per column: w · cb / cs and rb at the child's token, when the child is reached
        for j, (t, on, g) in enumerate(zip(tok.split(1, 1), act.split(1, 1), gone.split(1, 1), strict=True)):
            scale = w * cb  # w · cb: Mb = cb · rb
            ratios.append(scale / cs)
            at_child.append(rb.gather(1, t))
            # Reject the child: r = (w · Mb − Ms)_+ / (w · cb), S = w · cb · Σ r (see traversal_impl).
            alpha = (cs / scale).clamp_max(3e38).to(dtype)  # w = 0: r is rb where Ms is 0, and S = 0
            r = torch.addcmul(rb, qz, alpha, value=-1.0).clamp_min_(0.0)
            r_sum = r.sum(dim=-1, keepdim=True, dtype=torch.float64)
            s = scale * r_sum
            moved = on & (s > 0)
            w = torch.where(on, s / (s + (1.0 - w)).clamp_min(1e-300), w)
            rb = torch.where(moved, r, rb)
            cb = torch.where(moved, r_sum.reciprocal(), cb)
            if zero_rejected and j + 1 < k:  # Ms is read again only if a child is left
                qz = torch.where(on, qz.scatter(1, t, 0.0), qz)
                left = left - g
                cs = torch.where(on & (left > 0), left.reciprocal(), cs)
        # each child's weight when reached: min(1, w · Mb(t) / Ms(t)); a q = 0 edge cannot have been drafted: 0
        w_child = torch.cat(ratios, dim=1) * torch.cat(at_child, dim=1) / q_t
        w_all[cand] = torch.where(q_t > 0, w_child.clamp_max_(1.0), 0.0)[..., None]
        w_all[parents] = w  # its weight when tested as a leaf
        residuals.append(rb)  # and the row its token is drawn from if accepted
        order.append(parents)
    pos = torch.full((n + 1,), -1, dtype=torch.long, device=device)
    if not residuals:
        return w_all[:, 0], target_probs[:0], pos
    order = torch.cat(order)
    pos[order] = torch.arange(len(order), device=device)
    return w_all[:, 0], torch.cat(residuals), pos


def _fused_states(
    tree: DraftTree, target_probs: torch.Tensor, zero_rejected: bool
) -> tuple[torch.Tensor, torch.Tensor, list[tuple]]:
    """:func:`traversal_states` with a level a launch (:func:`adaptive_spec.verifiers.kernels.traversal_level`):
    ``(w float64 [N + 1], every node's row [N, V] (a leaf's: its target row), the levels for the search)``, each
    level ``(parents or None, children, active, first table row, parents)``. A slot tree's levels are its whole
    tables (:func:`_slot_tables`), its parents the slots of each depth, which nodes they are decided level by level
    in the launches; any other tree's, :func:`_device_levels`'.
    """
    device, dtype, n = target_probs.device, target_probs.dtype, tree.num_nodes
    p = target_probs.contiguous()
    q = tree.draft_probs if tree.draft_probs.dtype == dtype else tree.draft_probs.to(dtype)
    q = q.contiguous()
    w_all = torch.ones(n + 1, 1, dtype=torch.float64, device=device)
    rows = p.clone()  # a parent's is rewritten to its final Mb
    nodes, merge = None, False
    if tree.slots is not None and not tree.tokens_on_host:  # the merge and which slots are nodes: in the launches
        cand, tok, act, bounds = _slot_tables(tree, device, merged=False)
        nodes, merge = _root_flag(n + 1, device).clone(), True
        levels = [(None, cand, tok, act, first, end - first) for first, end in bounds]
    elif _numbered_by_depth(tree, device):  # each depth's nodes a range, the parents of its rows of the tables
        cand, tok, act, bounds = _range_tables(tree, device)
        levels = [(None, cand, tok, act, first, end - first) for first, end in bounds]
    else:
        levels = [
            (parents, cand, tok, act, 0, len(parents)) for parents, cand, tok, act in _device_levels(tree, device)
        ]
    for parents, cand, tok, act, row0, count in levels:
        kernels.traversal_level(p, q, parents, cand, tok, act, nodes, w_all, rows, row0, count, zero_rejected, merge)
    return w_all[:, 0], rows, [(*level, merge) for level in levels]


@functools.lru_cache(maxsize=64)
def _root_flag(n: int, device: torch.device) -> torch.Tensor:
    """BoolTensor[n]: True at 0 only (the root), made once: read only (callers clone it)."""
    return torch.arange(n, device=device) == 0  # on the device: `flag[0] = True` copies the True from the host


def _device_levels(tree: DraftTree, device: torch.device) -> list[tuple[torch.Tensor, ...]]:
    """Per depth with children: ``(parents [P], children [P, K], their tokens [P, K], active [P, K])`` on ``device``.

    Children in drafting order; an inactive column points at the dummy node ``num_nodes``. A slot tree's come
    from its layout and its tokens on the device (:func:`_slot_levels`); a tree numbered depth by depth whose
    tokens or children table are on the device (a chain, a policy-grown tree), from slices of that table
    (:func:`_range_levels`); any other tree's are built on the host from its structure and copied in one transfer.
    """
    if tree.slots is not None and not tree.tokens_on_host:
        return _slot_levels(tree, device)
    n, children, depths = tree.num_nodes, tree.children, tree.depths
    if _numbered_by_depth(tree, device):
        return _range_levels(tree, device)
    tokens = tree.tokens
    by_depth: dict[int, list[int]] = {}
    for node in range(n):
        if children[node]:
            by_depth.setdefault(depths[node], []).append(node)
    flat, shapes = [], []
    for d in sorted(by_depth):
        ps = by_depth[d]
        k = max(len(children[p]) for p in ps)
        cand = [c for p in ps for c in children[p] + [n] * (k - len(children[p]))]
        flat += ps + cand + [tokens[c] if c < n else 0 for c in cand]
        shapes.append((len(ps), k))
    if not flat:
        return []
    packed = torch.tensor(flat, dtype=torch.long, device=device)  # the one copy
    out, i = [], 0
    for p, k in shapes:
        parents, cand, tok = packed[i : i + p], packed[i + p : i + p + p * k], packed[i + p + p * k : i + p + 2 * p * k]
        out.append((parents, cand.view(p, k), tok.view(p, k), cand.view(p, k) < n))
        i += p + 2 * p * k
    return out


def _numbered_by_depth(tree: DraftTree, device: torch.device) -> bool:
    """Whether ``tree`` is numbered depth by depth with its tokens or children table on ``device`` (a chain, a
    policy-grown tree): its levels are ranges of its children table (:func:`_range_levels`, :func:`_range_tables`).
    """
    depths = tree.depths
    return depths == sorted(depths) and (not tree.tokens_on_host or tree.has_tensors(device, "tokens", "children"))


def _range_tables(tree: DraftTree, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list]:
    """:func:`_range_levels` as whole tables: ``(children [N, K], their tokens, active, each depth's parents
    (first, end))``, the depths with children only; K the widest node's children, a column past a node's own
    inactive (it points at the dummy ``num_nodes``).
    """
    n = tree.num_nodes
    bounds = _depth_ranges(tree)
    cand = tree.children_tensor(device)[:, : max(k for _, _, k in bounds)]
    tokens = torch.cat([tree.tokens_tensor(device), positions(1, device)])  # the dummy child n: token 0
    return cand, tokens[cand], cand < n, [(first, end) for first, end, _ in bounds]


def _depth_ranges(tree: DraftTree) -> list[tuple[int, int, int]]:
    """A tree numbered depth by depth: ``(first, end, widest)`` of each depth whose nodes have children."""
    n, children, depths = tree.num_nodes, tree.children, tree.depths
    out, first = [], 0
    while first < n:
        end = first
        while end < n and depths[end] == depths[first]:
            end += 1
        k = max(len(children[i]) for i in range(first, end))
        if k:
            out.append((first, end, k))
        first = end
    return out


@functools.lru_cache(maxsize=64)
def _earlier(k: int, device: torch.device) -> torch.Tensor:
    """BoolTensor[k, k]: column j' before column j, made once: read only."""
    return torch.ones(k, k, dtype=torch.bool, device=device).tril_(-1)


def _range_levels(tree: DraftTree, device: torch.device) -> list[tuple[torch.Tensor, ...]]:
    """:func:`_device_levels` of a tree numbered depth by depth (a chain, a policy-grown tree): each depth's nodes are
    one range, its children a slice of :meth:`DraftTree.children_tensor` (a drafter hands it over with the tree's
    other tensors), its tokens gathered on the device. Nothing is copied when the tree holds both; a leaf in the
    range is a row with no active column.
    """
    n = tree.num_nodes
    steps = positions(n, device)
    kids = tree.children_tensor(device)
    tokens = torch.cat([tree.tokens_tensor(device), steps[:1]])  # the dummy child n: token 0
    out = []
    for first, end, k in _depth_ranges(tree):
        cand = kids[first:end, :k]
        out.append((steps[first:end], cand, tokens[cand], cand < n))
    return out


def _slot_tables(
    tree: DraftTree, device: torch.device, merged: bool = True
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list]:
    """A slot tree's candidate tables on the device, its tokens unread: ``(children [F, K], their tokens [F, K],
    active [F, K], each depth's fed slots (first, end))``. A candidate slot is active when validly drawn at its
    slot's prefix (:meth:`SlotLayout.drawn`) and (``merged``; else the caller's) the first with its token there
    (the merge: walkers that drew the same token stand on one node); it is a child when its slot is itself a node
    (decided level by level).
    """
    layout, valid = tree.slots
    tokens = tree.tokens_tensor(device)
    cand_all, _ = layout.candidates(device)
    tok_all = tokens[cand_all].clamp_min(0)
    act_all = layout.drawn(tokens, valid)
    bounds = [(0, 1), *layout.levels[:-1]]
    if merged:
        earlier = _earlier(tok_all.shape[1], device)
        dup = ((tok_all[:, :, None] == tok_all[:, None, :]) & act_all[:, None, :] & earlier).any(dim=-1)  # j' < j
        act_all = act_all & ~dup
    return cand_all, tok_all, act_all, bounds


def _slot_levels(tree: DraftTree, device: torch.device) -> list[tuple[torch.Tensor, ...]]:
    """:func:`_device_levels` of a slot tree whose tokens are on the device: nothing read, nothing copied.

    The parents of level d are its slots; a slot's children are its active candidate slots (:func:`_slot_tables`)
    under a slot that is itself a node.
    """
    n = tree.num_nodes
    cand_all, tok_all, act_all, bounds = _slot_tables(tree, device)
    widths = tree.slots[0].candidate_widths
    node = _root_flag(n + 1, device).clone()  # whether each slot is a node of the merged tree
    out = []
    for k, (first, end) in zip(widths, bounds, strict=True):
        act = act_all[first:end, :k] & node[first:end, None]  # under a slot that is itself a node
        cand = torch.where(act, cand_all[first:end, :k], n)
        node[cand] = act
        out.append((torch.arange(first, end, device=device), cand, tok_all[first:end, :k], act))
    return out
