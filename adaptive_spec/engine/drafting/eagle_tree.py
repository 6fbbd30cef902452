"""EAGLE-style trees (:class:`~adaptive_spec.trees.policy.EagleTree`) whose children are drawn without
replacement, grown on the device: the counts per level are known in advance (:func:`eagle_levels`), so each level's
top nodes by path probability are chosen and fed with no host read, and the host reads the tree once
(:func:`draft_eagle_on_device`), or the whole tree is one captured replay (:func:`captured_eagle_tree`), read after the
target's pass over it is queued (:class:`~adaptive_spec.engine.drafting.base.DeferredTree`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from adaptive_spec.engine.drafting.base import DeferredTree, DraftOutcome, DraftRoot, QueuedRead, check_finite
from adaptive_spec.engine.drafting.static import TreeInGraph, drawn_in_graph
from adaptive_spec.engine.logits import ProbsFn, finite_flag
from adaptive_spec.engine.runner import ModelRunner
from adaptive_spec.trees import DraftTree
from adaptive_spec.trees.draw import draw_tokens
from adaptive_spec.trees.policy import (
    DraftPolicy,
    EagleTree,
)


def eagle_on_device(policy: DraftPolicy, vocab: int) -> bool:
    """Whether the device grows ``policy``'s trees: EAGLE-style, no wider than the vocabulary
    (:func:`draft_eagle_on_device` without replacement, :func:`~.eagle_iid.draft_eagle_iid_on_device` with i.i.d.
    children).
    """
    return isinstance(policy, EagleTree) and policy.depth > 0 and policy.width <= vocab


def eagle_iid_slots(policy: EagleTree) -> list[int]:
    """Per level of an EAGLE-style tree with i.i.d. children, the most frontier nodes it can have: the rows its
    children are drawn from on the device (:func:`~.eagle_iid.draft_eagle_iid_on_device`), and on the host too (the host
    path pads its rows to as many, so that both draw the same uniforms from one generator state).
    """
    out = [1]
    while len(out) < policy.depth:
        out.append(min(policy.top_k, out[-1] * policy.width))
    return out


def eagle_levels(policy: EagleTree) -> list[tuple[list[int], int]]:
    """The levels of ``policy``'s trees when every drawn child has positive probability.

    Per level: the children of each frontier node (its width, within the node budget, spent in frontier
    order), and how many of the new nodes are fed next (0 on the last level). This is the host path's loop
    with every count known in advance: without replacement each frontier node gets its width in distinct
    children.
    """
    levels, frontier, depth, budget = [], 1, 0, policy.budget
    while frontier and budget > 0:
        widths, left = [], budget
        for _ in range(frontier):
            k = max(0, min(policy.width, left))
            widths.append(k)
            left -= k
        new = sum(widths)
        budget -= new
        fed = min(policy.top_k, new) if new and budget > 0 and depth + 1 < policy.depth else 0
        levels.append((widths, fed))
        frontier, depth = fed, depth + 1
    return levels


@dataclass(frozen=True)
class _EagleLevel:
    """One level of :func:`eagle_levels` as device index tensors (made once per policy and device)."""

    widths: list[int]
    fed: int
    used: torch.Tensor  # [new] the frontier's children among its candidates (row * K + column)
    of: torch.Tensor  # [new] each child's frontier row
    ids: torch.Tensor  # [new] the children's node ids
    kids: list[list[int]]  # per frontier row, its children's ids
    own: torch.Tensor  # [new, N] bool: each child's own column (its row of the identity)


@dataclass(frozen=True)
class _EaglePlan:
    """:func:`eagle_levels` of a policy on a device, with the tree's starting tensors (made once; each tree clones
    ``start`` and ``ancestors`` once, the other tensors are read only).
    """

    levels: list[_EagleLevel]
    n: int  # nodes
    fed: int  # fed rows, the root's included
    widest: int
    depths: list[int]
    depths_d: torch.Tensor
    start: torch.Tensor  # [2N + N·widest] long: tokens and parents -1, children padded with N
    kids: torch.Tensor  # [frontier rows of every level, widest]: each frontier row's children, padded with N
    ancestors: torch.Tensor  # [N, N] bool: the root its own ancestor
    root: torch.Tensor  # [1] long 0: the first frontier's node id
    one: torch.Tensor  # [1] float64 1: its path probability


def _eagle_plan(policy: EagleTree, device: torch.device) -> _EaglePlan:
    """The levels, node and fed counts, widest node, depths and starting tensors of ``policy``'s trees (made once per
    policy and device, with its depth cuts', :func:`plan_with_cuts`).
    """
    return plan_with_cuts(_EAGLE_PLANS, policy, device, _eagle_host, lambda _, h, part, d: _eagle_device(*h, part, d))


def plan_with_cuts(cache: dict, policy: EagleTree, device: torch.device, host, build):
    """``cache``'s plan of ``policy`` on ``device``. The first time, the plans of every depth cut of ``policy``
    (its last steps in a request, :meth:`~adaptive_spec.trees.policy.DraftPolicy.truncated`) are made with it, all
    in one transfer: ``host(cut)`` gives a cut's host values, the last of them the integers to copy, and
    ``build(cut, the other host values, its part of the copy, device)`` its plan.
    """
    key = policy, str(device)
    if key not in cache:
        cuts = dict.fromkeys(policy.truncated(d) for d in range(1, policy.depth + 1))
        todo = [c for c in cuts if (c, str(device)) not in cache]
        hosts = [host(c) for c in todo]
        flat = torch.tensor([v for h in hosts for v in h[-1]], dtype=torch.long, device=device)  # the one copy
        if len(cache) > 256:
            cache.clear()
        for c, h, part in zip(todo, hosts, flat.split([len(h[-1]) for h in hosts]), strict=True):
            cache[c, str(device)] = build(c, h[:-1], part, device)
    return cache[key]


_EAGLE_PLANS: dict[tuple[EagleTree, str], _EaglePlan] = {}


def _eagle_host(policy: EagleTree) -> tuple:
    """:func:`_eagle_plan`'s host part: ``(levels, n, widest, depths, kid lists, split sizes, flat values)``."""
    levels = eagle_levels(policy)
    n = 1 + sum(sum(w) for w, _ in levels)
    widest = max(1, max((max(w, default=0) for w, _ in levels), default=0))
    host, parts, first, depths, kid_lists = [], [], 1, [0], []
    for depth, (widths, _) in enumerate(levels, start=1):
        used = [i * policy.width + j for i, k in enumerate(widths) for j in range(k)]
        of = [i for i, k in enumerate(widths) for _ in range(k)]
        kids = [[first + c for c, i in enumerate(of) if i == row] for row in range(len(widths))]
        pad = [c for k in kids for c in k + [n] * (widest - len(k))]
        kid_lists.append(kids)
        host += [*used, *of, *range(first, first + len(used)), *pad]
        parts += [len(used)] * 3 + [len(pad)]
        first += len(used)
        depths += [depth] * len(used)
    start = [-1] * (2 * n) + [n] * (n * widest)
    return levels, n, widest, depths, kid_lists, [*parts, n, len(start), 1], host + depths + start + [0]


def _eagle_device(
    levels: list, n: int, widest: int, depths: list[int], kid_lists: list, sizes: list[int], flat: torch.Tensor, device
) -> _EaglePlan:
    """:func:`_eagle_plan`'s device part, from :func:`_eagle_host`'s values copied (``flat``)."""
    tensors = flat.split(sizes)
    eye = torch.eye(n, dtype=torch.bool, device=device)
    out, pads = [], []
    for i, (widths, fed) in enumerate(levels):
        used, of, ids, pad = tensors[4 * i : 4 * i + 4]
        out.append(_EagleLevel(widths, fed, used, of, ids, kid_lists[i], eye[ids]))
        pads.append(pad.view(len(widths), widest))
    if any(not fed for _, fed in levels[:-1]):
        raise AssertionError("eagle_levels: only the last level feeds nothing")
    fed_total = 1 + sum(fed for _, fed in levels)
    ancestors = torch.zeros(n, n, dtype=torch.bool, device=device)
    ancestors[0, 0].fill_(True)  # no host tensor to copy in
    one = torch.ones(1, dtype=torch.float64, device=device)
    kids = torch.cat(pads) if pads else tensors[-2][:0].view(0, widest)  # the levels' frontiers' (fed nodes') order
    return _EaglePlan(out, n, fed_total, widest, depths, tensors[-3], tensors[-2], kids, ancestors, tensors[-1], one)


def draft_eagle_on_device(
    runner: ModelRunner,
    root: DraftRoot,
    policy: EagleTree,
    probs_fn: ProbsFn,
    generator: torch.Generator,
    deterministic: bool,
) -> DraftOutcome | EagleTree:
    """An EAGLE-style tree without replacement, decided on the device: one host read for the whole tree.

    The host path (:func:`~.policy.draft_policy_tree`) feeds, per level, the ``top_k`` new nodes of highest path
    probability (ties: the first made) and gives each ``width`` children within the budget. Without
    replacement a frontier node gets exactly its width in distinct children unless its row has fewer
    positive entries, so the counts per level are known in advance (:func:`eagle_levels`) and only *which*
    nodes are fed depends on the draws: chosen here by a stable sort of the path probabilities (float64
    products, as the host's), with each level's tokens, positions and mask rows gathered on the device
    (:func:`eagle_grow`). The candidates are drawn by the same calls on the same shapes as the host path's, so the
    tree is the host path's whenever every child drawn has positive probability; the one read at the end says
    whether so. Returns ``policy`` when not: the caller draws its tree again on the host from the generator state it
    saved.
    """
    device = runner.device
    p, base = root.pending, root.base
    plan = _eagle_plan(policy, device)
    pending_pos = torch.ones(1, p - 1, dtype=torch.bool, device=device) if p > 1 else None

    def forward(depth: int, ids: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
        if pending_pos is not None:  # the fed rows' mask over the block's rows: the pending tokens, then the fed nodes
            allowed = torch.cat([pending_pos.expand(ids.numel(), -1), allowed], dim=1)
        pos = torch.full((ids.numel(),), base + p - 1 + depth, dtype=torch.long, device=device)
        return runner.block_forward(ids, pos, allowed, logits_to_keep=ids.numel())

    def draw(rows: torch.Tensor, depth: int) -> torch.Tensor:  # noqa: ARG001 - as the host path draws
        return draw_tokens(rows, policy.width, generator, replace=False, greedy=deterministic)

    grown = eagle_grow(plan, root.probs[-1:], root.ok, probs_fn, forward, draw)
    return eagle_outcome(plan, policy, grown, probs_fn.vocab_size, p)


def captured_eagle_tree(
    runner: ModelRunner,
    pending: torch.Tensor,
    policy: EagleTree,
    probs_fn: ProbsFn,
    generator: torch.Generator,
    greedy: bool,
    defer: bool = False,
) -> DraftOutcome | EagleTree | DeferredTree | None:
    """An EAGLE-style tree without replacement after the ``pending`` tokens, grown in one replay of its captured graph
    (:meth:`~adaptive_spec.engine.runner.ModelRunner.captured_draft`) and read once: the outcome, ``policy`` when a
    drawn child had probability 0 (as :func:`draft_eagle_on_device`), or None: drafted level by level. ``defer``
    (the slot's ``early_pass`` on too): the tree before its read, a :class:`~.base.DeferredTree` whose ``finish`` gives
    one of the first two.

    The graph grows the tree by :func:`eagle_grow`, with every level's forward on the device
    (:meth:`~.runner.ModelRunner.level_forward`: the fed nodes' cache rows after the root's, their mask over the
    capacity from their ancestor rows, their parents' features gathered from the fed nodes' outputs) and the
    candidates drawn as :func:`draft_eagle_on_device` draws them: at temperature 0 each frontier row's top ``width``,
    else the exponential race's first ``width`` with the exponentials drawn before the replay, a level a call of the
    level-by-level drafter's shape from the same generator, so the same tree from one generator state (tested).
    """
    probs = runner.graph_probs(probs_fn)
    if probs is None:
        return None
    vocab, device = probs_fn.vocab_size, runner.device
    full = _eagle_plan(policy, device)

    def make(d: int):
        cut = policy.truncated(d)
        plan = runner.slot.constant(f"eagle plan {cut}", _eagle_plan(cut, device))  # kept as long as its graph
        frontiers = [len(lv.widths) for lv in plan.levels]
        core = _tree_core(runner, plan, cut.width, probs, greedy, frontiers)
        return core, ((sum(frontiers), vocab), torch.float32), plan.fed - 1  # the rows' dtype (ProbsFn's)

    def fill(noise: torch.Tensor) -> None:  # the race's exponentials, one call a level as the level-by-level drafter
        start = 0
        for lv in full.levels:
            noise[start : start + len(lv.widths)].exponential_(generator=generator)
            start += len(lv.widths)

    key = ("eagle", dataclasses.replace(policy, depth=1), probs_fn.graph_key(), greedy)  # its cuts share it
    out = runner.captured_draft(pending, policy.depth, key, make, None if greedy else fill, full.fed - 1)
    if out is None:
        return None
    tokens, parents, fed, rows, ancestors, ok, bad = out
    # the graph's outputs are overwritten by its next replay: the tokens, which the next step's pending ones may view,
    # are copied; the rest lives within this step
    grown = EagleGrown(tokens.clone(), parents, fed, rows, ancestors, ok, bad)
    p = int(pending.numel())
    if not (defer and runner.slot.early_pass):
        return eagle_outcome(full, policy, grown, vocab, p)
    read = QueuedRead(_eagle_read(grown))  # queued before the target's pass, waited for after it
    return DeferredTree(
        grown.tokens, full.depths_d, grown.ancestors, full.n, lambda: eagle_outcome(full, policy, grown, vocab, p, read)
    )


def _tree_core(runner: ModelRunner, plan: _EaglePlan, width: int, probs: ProbsFn, greedy: bool, frontiers: list[int]):
    """The function an EAGLE-style tree's graph records (:func:`captured_eagle_tree`)."""
    offsets = [sum(frontiers[:i]) for i in range(len(frontiers))]

    def core(ids, pos, mask, *extra, rows, last, noise):
        tree = TreeInGraph(runner, probs, ids, pos, mask, extra, rows, last)

        def forward(depth: int, tokens: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
            return tree.level(tokens, allowed, (tree.p0 + depth).expand(tokens.numel()))

        def draw(rows_: torch.Tensor, depth: int) -> torch.Tensor:
            start = offsets[depth - 1]
            return drawn_in_graph(rows_, width, None if greedy else noise[start : start + rows_.shape[0]])

        g = eagle_grow(plan, tree.root, tree.ok, probs, forward, draw)
        return g.tokens, g.parents, g.fed, g.rows, g.ancestors, g.ok, g.bad

    return core


@dataclass(frozen=True)
class EagleGrown:
    """An EAGLE-style tree without replacement grown on the device (:func:`eagle_grow`), before its one read."""

    tokens: torch.Tensor  # [N] the nodes' tokens (the root's -1)
    parents: torch.Tensor  # [N] their parents (the root's -1)
    fed: torch.Tensor  # [fed] the fed nodes, in feed order (the root first)
    rows: torch.Tensor  # [fed, V] their rows, in that order
    ancestors: torch.Tensor  # [N, N] bool
    ok: torch.Tensor  # 0-dim bool: every fed row's logits finite
    bad: torch.Tensor  # 0-dim bool: a drawn child of probability 0 (the host path's tree differs)


def eagle_grow(plan: _EaglePlan, R: torch.Tensor, ok: torch.Tensor, probs_fn: ProbsFn, forward, draw) -> EagleGrown:
    """Grow ``plan``'s tree from the root's row ``R`` [1, V] on the device, with no host read: per level, the
    frontier's candidates ``draw(rows, depth)`` ([F, width]), the path probabilities' top ``fed`` new nodes, and
    ``forward(depth, their tokens, their mask rows over the fed nodes so far (feed order, the root first))`` over
    them (the logits, which ``probs_fn`` makes rows). The level-by-level drafter (:func:`draft_eagle_on_device`)
    and a captured tree (:func:`captured_eagle_tree`) give it their
    own forward and draws.
    """
    rows = [R]  # the fed rows' probabilities, in feed order (the root's first)
    ancestors = plan.ancestors.clone()
    front_ids, front_pp = plan.root, plan.one  # the frontier: node ids and path probabilities
    fed_ids, qs, level_logits = [front_ids], [], []  # qs: the drawn children's probabilities, checked at the end
    # every level's tokens and parents: the nodes are numbered level by level, so the tree's are their concatenation
    cands, parent_ids = [plan.start[:1]], [plan.start[:1]]  # the root's: -1
    for depth, lv in enumerate(plan.levels, start=1):
        cand = draw(R, depth)
        cand = cand.flatten()[lv.used]
        q = R[lv.of, cand]  # each used child's probability in its parent's row
        qs.append(q)
        parents = front_ids[lv.of]
        cands.append(cand)
        parent_ids.append(parents)
        ancestors[lv.ids] = ancestors[parents] | lv.own
        if lv.fed:
            pp = front_pp[lv.of] * q.to(torch.float64)
            chosen = pp.argsort(descending=True, stable=True)[: lv.fed].sort().values  # the top k, in the order made
            front_ids, front_pp = lv.ids[chosen], pp[chosen]
            fed_ids.append(front_ids)
            allowed = ancestors[front_ids][:, torch.cat(fed_ids)]  # their mask rows over every fed node, in feed order
            logits = forward(depth, cand[chosen], allowed)  # the fed nodes' tokens
            R = probs_fn(logits)
            level_logits.append(logits)
            rows.append(R)
    fed_rows = torch.cat(rows)
    if level_logits:  # every fed level's logits and rows, checked once (the root's row rides along)
        ok = ok & finite_flag(torch.cat(level_logits), fed_rows)
    bad = (torch.cat(qs) <= 0).any()  # a drawn child of probability 0 (a row with fewer positive entries)
    return EagleGrown(torch.cat(cands), torch.cat(parent_ids), torch.cat(fed_ids), fed_rows, ancestors, ok, bad)


def _eagle_read(grown: EagleGrown) -> torch.Tensor:
    """What :func:`eagle_outcome` reads of a grown tree, in one tensor: its tokens, parents, fed nodes, ok and bad."""
    return torch.cat([grown.tokens, grown.parents, grown.fed, torch.stack([grown.ok, grown.bad])])


def eagle_outcome(
    plan: _EaglePlan, policy: EagleTree, grown: EagleGrown, vocab: int, p: int, read: QueuedRead | None = None
) -> DraftOutcome | EagleTree:
    """The drafted tree of :func:`eagle_grow` after its one host read, or ``policy`` when a drawn child had probability
    0 (the caller draws the tree again on the host). ``p``: the pending tokens fed before the tree; ``read``: that
    read, queued earlier (:class:`~.base.DeferredTree`), else made here.
    """
    n, fed_total, device = plan.n, plan.fed, grown.tokens.device
    kids_d = plan.start[2 * n :].view(n, plan.widest).clone()
    if plan.levels:  # a frontier a level (the root's first): fed_d, whose children the plan lists in that order
        kids_d[grown.fed] = plan.kids
    host = read.tolist() if read is not None else _eagle_read(grown).tolist()  # the read
    check_finite(bool(host[-2]), "draft")
    if host[-1]:
        return policy
    tokens, parents, fed_order = host[:n], host[n : 2 * n], host[2 * n : 2 * n + fed_total]
    child_draws: list[list[int]] = [[] for _ in range(n)]
    start, frontier = 0, 1
    for lv in plan.levels:  # level by level, the frontier is the nodes fed last
        for node, kids in zip(fed_order[start : start + frontier], lv.kids, strict=True):
            child_draws[node] = kids
        start, frontier = start + frontier, lv.fed
    probs = torch.zeros(n, vocab, dtype=grown.rows.dtype, device=device)
    probs[grown.fed] = grown.rows
    tree = DraftTree(tokens, parents, plan.depths, probs, child_draws, policy.shape)
    tree.keep_tensors(
        tokens=grown.tokens, parents=grown.parents, depths=plan.depths_d, ancestors=grown.ancestors, children=kids_d
    )
    cache_rows = {node: i for i, node in enumerate(fed_order)}
    rows_d = torch.full((n,), -1, dtype=torch.long, device=device).index_copy_(
        0, grown.fed, torch.arange(fed_total, device=device)
    )
    return DraftOutcome(
        tree, grown.ancestors, p, fed_total, cache_rows, len(plan.levels), 0.0, cache_rows_tensor=rows_d
    )
