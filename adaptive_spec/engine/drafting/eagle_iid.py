"""EAGLE-style trees with i.i.d. children, grown on an accelerator: each level has its most frontier rows
(:func:`~adaptive_spec.engine.drafting.eagle_tree.eagle_iid_slots`), padding after the fed ones, and the host reads the
tree once, at a *look* level chosen from the past trees (:func:`draft_eagle_iid_on_device`), with the torch code
(:class:`_IidTorch`) or the fused kernel (:class:`_IidFused`) a level, or the whole tree in one captured replay
(:func:`captured_eagle_iid_tree`).
"""

from __future__ import annotations

import collections
import dataclasses
from dataclasses import dataclass

import torch

from adaptive_spec.engine import draft_kernels
from adaptive_spec.engine.drafting.base import DraftOutcome, DraftRoot, check_finite
from adaptive_spec.engine.drafting.chains import look_level
from adaptive_spec.engine.drafting.eagle_tree import eagle_iid_slots, eagle_levels, plan_with_cuts
from adaptive_spec.engine.drafting.static import TreeInGraph, drawn_in_graph
from adaptive_spec.engine.logits import ProbsFn, finite_flag
from adaptive_spec.engine.runner import ModelRunner
from adaptive_spec.rng import inverse_cdf_from
from adaptive_spec.trees import DraftTree
from adaptive_spec.trees.draw import draw_tokens
from adaptive_spec.trees.policy import EagleTree
from adaptive_spec.verifiers import kernels


@dataclass(frozen=True)
class _IidPlan:
    """:func:`draft_eagle_iid_on_device`'s constants for a policy on a device (made once, with its depth cuts')."""

    slots: list[int]  # frontier rows per level (eagle_iid_slots)
    certain: int  # the levels whose new nodes are surely fed (those the policy without replacement feeds)
    m: int  # the most nodes a tree can have; index m is a dummy that padding entries point at
    start: torch.Tensor  # long [3, m + 1]: tokens, parents (-1) and depths (0) of every node
    tables: torch.Tensor  # long [2, m + 1, W]: draws and children tables, padded with m
    counters: torch.Tensor  # long [2]: the next node id less one (0), the budget
    ancestors: torch.Tensor  # bool [m + 1, m + 1]: the root its own ancestor; every row has the root (padding rows too)
    limit: list[torch.Tensor]  # per level, [rows, W]: each draw's place in frontier order
    row: list[torch.Tensor]  # per level, [rows * W]: each draw's frontier row
    depth: list[torch.Tensor]  # per level, [rows * W]: the level's depth
    rank: list[torch.Tensor]  # per level, [rows]: 0 .. rows - 1
    earlier: torch.Tensor  # bool [W, W]: column j' before column j
    root: torch.Tensor  # long [1]: node 0
    one: torch.Tensor  # float64 [1]: its path probability
    pad: torch.Tensor  # long [1]: m, the padding entries' node
    layout: torch.Tensor  # long: :class:`_IidFused`'s tensor before a tree (:func:`_iid_layout`)
    offsets: dict[str, int]  # its regions' offsets


def _iid_plan(policy: EagleTree, device: torch.device) -> _IidPlan:
    """The plan of ``policy`` on ``device`` (made once, with its depth cuts', :func:`~.eagle_tree.plan_with_cuts`)."""
    return plan_with_cuts(_IID_PLANS, policy, device, _iid_host, lambda c, h, part, d: _iid_device(c, *h, part, d))


_IID_PLANS: dict[tuple[EagleTree, str], _IidPlan] = {}


def _iid_host(policy: EagleTree) -> tuple:
    """:func:`_iid_plan`'s host part: ``(slots, certain, m, the layout's offsets, flat values)``."""
    w, slots = policy.width, eagle_iid_slots(policy)
    certain = 0
    for _, fed in eagle_levels(policy):
        if not fed:
            break
        certain += 1
    m = min(1 + policy.budget, 1 + w * sum(slots))
    flat = []
    for d, f in enumerate(slots, start=1):
        flat += [*range(f * w), *(i // w for i in range(f * w)), *[d] * (f * w)]
    offsets, layout = _iid_layout(policy, slots, m)
    return slots, certain, m, offsets, flat + layout


def _iid_layout(policy: EagleTree, slots: list[int], m: int) -> tuple[dict[str, int], list[int]]:
    """:class:`_IidFused`'s long tensor before a tree: its regions' offsets and values (tokens and parents -1; the
    fed nodes, the root then m; the counters; draws and children m; depths 0; the next level's tokens).
    """
    w = policy.width
    sizes = {
        "tok": m + 1,
        "par": m + 1,
        "fed": sum(slots),
        "state": 5,  # the next node id less one, the budget left, the next level's fed rows, bad, finite
        "draw": (m + 1) * w,  # the draws and the children tables are adjacent: [2, m + 1, W]
        "child": (m + 1) * w,
        "depth": m + 1,
        "feed": max(slots),
    }
    fill = {"tok": -1, "par": -1, "fed": m, "draw": m, "child": m, "depth": 0, "feed": 0}
    values, offsets = [], {}
    for name, size in sizes.items():
        offsets[name] = len(values)
        values += [0, policy.budget, 1, 0, 1] if name == "state" else [fill[name]] * size
    values[offsets["fed"]] = 0  # the root
    return offsets, values


def _iid_device(
    policy: EagleTree, slots: list[int], certain: int, m: int, offsets: dict, flat: torch.Tensor, device
) -> _IidPlan:
    """:func:`_iid_plan`'s device part, from :func:`_iid_host`'s values copied (``flat``). The torch code's starting
    tensors are the fused layout's regions (:func:`_iid_layout`: one definition of a tree before its first level).
    """
    w, n1 = policy.width, m + 1
    sizes = [f * w for f in slots for _ in range(3)]
    *levels, layout = flat.split([*sizes, len(flat) - sum(sizes)])
    at = offsets
    tables = layout[at["draw"] : at["draw"] + 2 * n1 * w]  # draws and children, adjacent
    ancestors = torch.zeros(m + 1, m + 1, dtype=torch.bool, device=device)
    # the root is every node's ancestor, its own too (and the dummy's: a padding row attends to it); a column is a
    # fill, where a write of one element (`[0, 0] = True`) would copy the True from the host
    ancestors[:, 0] = True
    ranks = torch.arange(max(slots), device=device)
    return _IidPlan(
        slots,
        certain,
        m,
        torch.stack([layout[at[k] : at[k] + n1] for k in ("tok", "par", "depth")]),
        tables.view(2, n1, w),
        layout[at["state"] : at["state"] + 2],
        ancestors,
        [t.view(f, w) for t, f in zip(levels[0::3], slots, strict=True)],
        list(levels[1::3]),
        list(levels[2::3]),
        [ranks[:f] for f in slots],
        torch.ones(w, w, dtype=torch.bool, device=device).tril_(-1),
        ranks[:1],
        torch.ones(1, dtype=torch.float64, device=device),
        tables[:1],  # m: the tables' padding
        layout,
        offsets,
    )


def draft_eagle_iid_on_device(
    runner: ModelRunner,
    root: DraftRoot,
    policy: EagleTree,
    probs_fn: ProbsFn,
    generator: torch.Generator,
    deterministic: bool,
) -> DraftOutcome | EagleTree:
    """An EAGLE-style tree with i.i.d. children, decided on the device: one host read for the whole tree.

    The host path (:func:`~.policy.draft_policy_tree`) gives each fed node ``width`` i.i.d. draws within the budget
    (spent in frontier order), merges a node's draws by token into its children (in the order of first appearance) and
    feeds the ``top_k`` new nodes of highest path probability (ties: the first made), in the order made. How many
    distinct children the draws give is not known in advance, so each level here has its most frontier rows
    (:func:`~.eagle_tree.eagle_iid_slots`): the first are the fed nodes, the others padding rows that are fed to the
    draft too (attending to the root; their rows are never read) and whose draws are invalid. Node numbers, budget,
    merges and the choice of the fed nodes are computed on the device with the host path's arithmetic (float64 path
    probabilities, a stable sort), by the torch code (:class:`_IidTorch`) or, where the fused kernels run, a launch
    a level (:class:`_IidFused`); the host path draws on as many rows (it pads its rows likewise), so from one
    generator state both grow the same tree.

    The levels whose nodes the same policy without replacement feeds are fed here for sure (duplicates only save
    budget); after them, whether any node is fed depends on the merges, which the host does not wait for. The tree is
    grown to level ``l``, the *look*, and read once: it is the host path's tree of ``policy.truncated(l)``. The look
    comes from the past trees of the same policy in the request (``runner.chain_look``, as a policy chain's,
    :func:`~adaptive_spec.engine.drafting.chains.look_level`): the deepest of the last
    :data:`~adaptive_spec.engine.drafting.chains.LOOK_HISTORY` trees, a tree cut at its look (nodes were fed there)
    counting as one level deeper, at least the first level that is not certain (before any tree: that level, so the
    looks of a request's first trees climb a level a tree while trees are cut). A depth chosen from past steps is a plan
    chosen from past steps: the law is the truncated policy's, which the exact tests check like any EAGLE policy's.
    Levels between a tree's end and its look are drafted blind: no node is made there, but their forwards are spent and
    their draws taken from the generator.
    Returns ``policy.truncated(l)`` when a drawn child had probability 0 (a row of zeros): the caller grows its
    tree on the host path from the saved state (and drafts again with the torch code when a fused kernel failed:
    :class:`~.draft_kernels.KernelFailedError`).
    """
    device = runner.device
    p, base = root.pending, root.base
    plan, w = _iid_plan(policy, device), policy.width
    # the level after which the tree is read, and where it ends: the deepest past tree (one deeper if it was cut),
    # at least the first uncertain level (before any tree: that level)
    stops, look = look_level(runner, policy, policy.depth, least=plan.certain + 1, first=plan.certain + 1)
    R, ok = root.probs[-1:], root.ok
    grow = (_IidFused if kernels.fused_on(device) else _IidTorch)(plan, policy, device, p - 1)
    rows, level_logits = [R], []
    for d in range(1, look + 1):
        cand = draw_tokens(R, w, generator, replace=True, greedy=deterministic)  # [f, W], as the host path
        grow.level(d, R, cand, last=d == policy.depth)
        if d == look:
            break
        g = plan.slots[d]
        tokens, allowed = grow.feed()
        pos = torch.full((g,), base + p - 1 + d, dtype=torch.long, device=device)
        logits = runner.block_forward(tokens, pos, allowed, logits_to_keep=g)
        R = probs_fn(logits)
        level_logits.append(logits)
        rows.append(R)
    host = _read_iid(grow, ok, level_logits, rows, look < policy.depth)  # the one read
    return _iid_outcome(plan, policy, host, torch.cat(rows), grow.ancestors, stops, look, p, probs_fn.vocab_size)


def _iid_outcome(
    plan: _IidPlan,
    policy: EagleTree,
    host: _IidRead,
    fed_rows: torch.Tensor,
    ancestors: torch.Tensor,
    stops: collections.deque,
    look: int,
    p: int,
    vocab: int,
) -> DraftOutcome | EagleTree:
    """The tree of :func:`draft_eagle_iid_on_device` or :func:`captured_eagle_iid_tree` after its one read ``host``
    (``plan``: the one its tables were written by; ``fed_rows``: the fed slots' rows, padding's too; ``ancestors``:
    [M + 1, M + 1]), its depth added to the past ``stops``; or ``policy.truncated(look)`` when a drawn child had
    probability 0 (the caller draws the tree again on the host).
    """
    m, w, device = plan.m, policy.width, fed_rows.device
    tokens, parents, draws, fed_order, n, flag, bad, cut = host
    check_finite(bool(flag), "draft")
    if bad:
        return policy.truncated(look)
    tokens, parents = tokens[:n], parents[:n]
    child_draws = [[c for c in draws[j * w : (j + 1) * w] if c < m] for j in range(n)]
    depths = [0] * n
    for j in range(1, n):
        depths[j] = depths[parents[j]] + 1
    stops.append(look + 1 if cut else max(depths))  # the levels with nodes; a tree cut at its look: one more
    fed_d = host.fed
    probs = torch.zeros(m + 1, vocab, dtype=fed_rows.dtype, device=device)
    probs[fed_d] = fed_rows  # padding rows land on the dummy's
    tree = DraftTree(tokens, parents, depths, probs[:n], child_draws, policy.shape)
    widest = max(1, max(len(set(c)) for c in child_draws))
    most = max(1, max(map(len, child_draws)))
    nodes, tables = host.nodes, host.tables[:, :n].clamp_max(n)  # padding: the node count
    tree.keep_tensors(
        tokens=nodes[0][:n],
        parents=nodes[1][:n],
        depths=nodes[2][:n],
        ancestors=ancestors[:n, :n],
        children=tables[1, :, :widest],
        draws=tables[0, :, :most],
    )
    cache_rows = {node: j for j, node in enumerate(fed_order) if node < m}
    rows_d = torch.full((m + 1,), -1, dtype=torch.long, device=device)
    rows_d[fed_d] = torch.arange(len(fed_order), device=device)
    outcome = DraftOutcome(tree, ancestors[:n, :n], p, len(cache_rows), cache_rows, look, 0.0)
    outcome.cache_rows_tensor = rows_d[:n]
    return outcome


def captured_eagle_iid_tree(
    runner: ModelRunner,
    pending: torch.Tensor,
    policy: EagleTree,
    probs_fn: ProbsFn,
    generator: torch.Generator,
    greedy: bool,
) -> DraftOutcome | EagleTree | None:
    """An EAGLE-style tree with i.i.d. children after the ``pending`` tokens, grown to its look in one replay of its
    captured graph (:meth:`~adaptive_spec.engine.runner.ModelRunner.captured_draft`) and read once: the outcome,
    ``policy.truncated(look)`` when a drawn child had probability 0 (as :func:`draft_eagle_iid_on_device`), or None:
    drafted level by level.

    The tree is :func:`draft_eagle_iid_on_device`'s, to the same look (from the same past trees): the torch code's
    bookkeeping (:class:`_IidTorch`, padding rows and all) with every level's forward on the device
    (:meth:`~.runner.ModelRunner.level_forward`, through :class:`~.static.TreeInGraph`), and the draws as
    :func:`~adaptive_spec.trees.draw.draw_tokens` makes them on an accelerator: inverse-CDF draws (the first child the
    argmax at temperature 0) from ``width`` uniforms a frontier row, or the exponential race for one child at
    temperature > 0, the noise drawn before the replay a level a call of the level-by-level drafter's shape from the
    same generator, so the same tree from one generator state (tested). A graph grows a tree of ``d`` levels with the
    plan of ``policy.truncated(d)`` and always counts what its last level would feed, so the policy's cuts share it:
    a look before the depth reads that count, a tree of the policy's own depth does not.
    """
    probs = runner.graph_probs(probs_fn)
    if probs is None:
        return None
    vocab, device, w = probs_fn.vocab_size, runner.device, policy.width
    full = _iid_plan(policy, device)
    stops, look = look_level(runner, policy, policy.depth, least=full.certain + 1, first=full.certain + 1)
    race, noiseless = w == 1 and not greedy, w == 1 and greedy  # one child a row: the race, or the argmax

    def make(d: int):
        cut = policy.truncated(d)
        plan = runner.slot.constant(f"eagle iid plan {cut} {device}", _iid_plan(cut, device))
        core = _iid_core(runner, plan, cut, probs, greedy, race)
        rows = sum(plan.slots)
        noise = ((rows, vocab), torch.float32) if race else ((max(1, rows * w),), torch.float64)
        return core, noise, sum(plan.slots[1:])

    def fill(noise: torch.Tensor) -> None:  # one call a level, as the level-by-level drafter draws
        start = 0
        for f in full.slots[:look]:
            if race:
                noise[start : start + f].exponential_(generator=generator)
                start += f
            else:
                noise[start : start + f * w].uniform_(generator=generator)
                start += f * w

    key = ("eagle-iid", dataclasses.replace(policy, depth=1), probs_fn.graph_key(), greedy)  # its cuts share it
    block = sum(full.slots[1:look])
    out = runner.captured_draft(pending, look, key, make, None if noiseless else fill, block)
    if out is None:
        return None
    flat, nodes, tables, fed, rows, ancestors = out
    plan = _iid_plan(policy.truncated(look), device)  # the graph's
    # the graph's outputs are overwritten by its next replay: the nodes' tokens, which the next step's pending ones may
    # view, are copied; the rest lives within this step
    host = _iid_values(plan, flat, nodes.clone(), tables, fed, mid=look < policy.depth)
    return _iid_outcome(plan, policy, host, rows, ancestors, stops, look, int(pending.numel()), vocab)


def _iid_core(runner: ModelRunner, plan: _IidPlan, policy: EagleTree, probs: ProbsFn, greedy: bool, race: bool):
    """The function an EAGLE-style tree with i.i.d. children records (:func:`captured_eagle_iid_tree`): ``policy``'s
    tree to its depth, ``plan``'s.
    """
    w, depth = policy.width, len(plan.slots)

    def core(ids, pos, mask, *extra, rows, last, noise):
        tree = TreeInGraph(runner, probs, ids, pos, mask, extra, rows, last)
        grow = _IidTorch(plan, policy, tree.root.device, 0)  # the pending rows: every node sees them (the tree's own)
        R, fed_rows, level_logits, start = tree.root, [tree.root], [], 0
        for d in range(1, depth + 1):
            f = plan.slots[d - 1]
            if race:
                cand = drawn_in_graph(R, 1, noise[start : start + f])
                start += f
            elif greedy and w == 1:
                cand = R.argmax(dim=-1, keepdim=True)
            else:
                cand = inverse_cdf_from(R, noise[start : start + f * w].view(f, w))
                start += f * w
                if greedy:  # the first child the argmax, the others drawn (draw_tokens)
                    cand = torch.cat([R.argmax(dim=-1, keepdim=True), cand[:, 1:]], dim=1)
            grow.level(d, R, cand, last=d == depth, count=True)
            if d == depth:
                break
            tokens, allowed = grow.feed()
            logits = tree.level(tokens, allowed, (tree.p0 + d).expand(tokens.numel()))
            R = probs(logits)
            level_logits.append(logits)
            fed_rows.append(R)
        ok = tree.ok
        if level_logits:  # every fed level's logits and rows, checked once (the root's row rides along)
            ok = ok & finite_flag(torch.cat(level_logits), torch.cat(fed_rows))
        flat, nodes, tables, fed = grow.written(ok, mid=True)
        return flat, nodes, tables, fed, torch.cat(fed_rows), grow.ancestors

    return core


class _IidRead(tuple):
    """:func:`_read_iid`'s values ``(tokens, parents, draws, fed slots, nodes, finite, bad, fed next)`` (``fed
    next``: how many nodes the next level feeds), with the tree's device tensors as attributes (``nodes``:
    tokens, parents, depths, [3, M + 1] or their three rows; ``tables``: draws and children [2, M + 1, W]; ``fed``:
    the fed slots' nodes).
    """

    nodes: torch.Tensor | tuple[torch.Tensor, ...]
    tables: torch.Tensor
    fed: torch.Tensor


def _read_iid(grow: _IidTorch | _IidFused, ok, level_logits, rows, mid) -> _IidRead:
    """:func:`draft_eagle_iid_on_device`'s one read of the tree so far (``mid``: before its last level)."""
    if level_logits:  # every fed level's logits and rows, checked once (the root's row rides along)
        ok = ok & finite_flag(torch.cat(level_logits), torch.cat(rows))
    return grow.read(ok, mid)


class _IidTorch:
    """:func:`draft_eagle_iid_on_device`'s bookkeeping in torch ops, a few dozen a level (a CPU's path)."""

    def __init__(self, plan: _IidPlan, policy: EagleTree, device: torch.device, pending: int) -> None:
        self.plan, self.top_k, self.levels = plan, policy.top_k, 0
        self.nxt, self.left = plan.counters.clone().split(1)  # the next node id less one, the budget left
        self.ancestors = plan.ancestors.clone()
        # the frontier: node ids (m: padding), path probabilities, how many of its rows are fed
        self.fr, self.fr_pp, self.fed = plan.root, plan.one, plan.one.long()
        self.fed_ids, self.drawn = [plan.root], []
        self.pending = torch.ones(1, pending, dtype=torch.bool, device=device) if pending else None

    def level(self, d: int, R: torch.Tensor, cand: torch.Tensor, last: bool, count: bool = False) -> None:
        """Level ``d``'s draws ``cand`` from the frontier's rows ``R``: its nodes, and the next frontier (none when
        ``last``; ``count``: how many nodes it would feed, all the same, as a look before the depth reads).
        """
        plan, i, w = self.plan, d - 1, cand.shape[1]
        f, self.levels = plan.slots[i], d
        q = R.gather(1, cand)
        drawn = torch.minimum(self.left, self.fed * w)  # the fed rows' draws, within the budget (frontier order)
        valid = plan.limit[i] < drawn
        same = cand[:, :, None] == cand[:, None, :]  # [f, W, W]
        new = (valid > (same & plan.earlier).any(dim=-1)).view(-1)  # a token's first valid draw at its row
        ids = torch.where(new, new.cumsum(0) + self.nxt, plan.m)  # new nodes numbered in the order made
        made = new.sum()
        self.nxt, self.left = self.nxt + made, self.left - drawn
        par = self.fr[plan.row[i]]
        self.ancestors[ids] = self.ancestors[par]
        self.ancestors[ids, ids] = plan.ancestors[0, 0]  # its own ancestor (padding: the dummy), a True on the device
        self.drawn.append((cand, q, valid, same, ids, self.fr, par))
        if last and not count:
            return
        self.fed = torch.where(self.left > 0, made.clamp_max(self.top_k), 0)  # none once the budget is spent
        if last:
            return
        pp = (self.fr_pp[:, None] * q).view(-1)  # float64: the host path's products
        g = plan.slots[d]
        order = torch.where(new, pp, -1.0).argsort(descending=True, stable=True)[:g]  # the top k, ties: first made
        order = torch.where(plan.rank[d] < self.fed, order, f * w).sort().values  # in the order made, padding last
        self.fr = torch.cat([ids, plan.pad])[order]  # m for padding
        self._next = order.clamp_max(f * w - 1), pp, cand

    def feed(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The next frontier's tokens and its mask over the pending rows and every fed node."""
        order, pp, cand = self._next
        self.fr_pp = pp[order]
        self.fed_ids.append(self.fr)
        allowed = self.ancestors[self.fr][:, torch.cat(self.fed_ids)]
        if self.pending is not None:
            allowed = torch.cat([self.pending.expand(len(order), -1), allowed], dim=1)
        return cand.view(-1)[order], allowed

    def read(self, ok: torch.Tensor, mid: bool) -> _IidRead:
        """The tree so far, written into its tables, and its one read."""
        return _iid_values(self.plan, *self.written(ok, mid))

    def written(self, ok: torch.Tensor, mid: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """The tree so far written into its tables, on the device: ``(the read's values in one tensor, nodes, tables,
        fed slots' nodes)`` (:class:`_IidRead`'s; no host read: a captured tree's graph ends here).
        """
        plan, m = self.plan, self.plan.m
        w = plan.tables.shape[-1]
        cand, q, valid, same, ids, fr, par = (torch.cat(t) for t in zip(*self.drawn, strict=True))  # every level's
        ids2 = ids.view(-1, w)
        nodes = plan.start.clone()
        depth = torch.cat([plan.depth[i] for i in range(len(self.drawn))])
        nodes[:, ids] = torch.stack([cand.view(-1), par, depth])
        child = torch.where(valid, ids2.gather(1, same.byte().argmax(dim=-1)), m)  # each draw's node: its token's 1st
        tables = plan.tables.clone()
        tables[:, fr] = torch.stack([child, ids2.sort(dim=1).values])  # draws in order; distinct children, padding last
        bad = ((q <= 0) & valid).any()  # a drawn child of probability 0 (a row of zeros)
        fed_d = torch.cat(self.fed_ids)
        tail = [self.nxt + 1, ok.long()[None], bad.long()[None], self.fed.reshape(1) if mid else self.nxt.new_zeros(1)]
        flat = torch.cat([nodes[:2, :m].flatten(), tables[0, :m].flatten(), fed_d, *tail])
        return flat, nodes, tables, fed_d


def _iid_values(plan: _IidPlan, flat: torch.Tensor, nodes, tables, fed_d: torch.Tensor, mid: bool = True) -> _IidRead:
    """:meth:`_IidTorch.written`'s tree read: its one host read (``flat``'s values), sliced (``mid`` False: the count
    of what a level after the tree would feed is 0, as a tree of its policy's depth has none).
    """
    m, w = plan.m, plan.tables.shape[-1]
    values = flat.tolist()  # the one read
    if not mid:
        values[-1] = 0
    a, b, c, k = m, 2 * m, 2 * m + m * w, fed_d.numel()
    out = _IidRead((values[:a], values[a:b], values[b:c], values[c : c + k], *values[c + k :]))
    out.nodes, out.tables, out.fed = nodes, tables, fed_d
    return out


class _IidFused:
    """:func:`draft_eagle_iid_on_device`'s bookkeeping in one launch a level
    (:func:`~adaptive_spec.engine.draft_kernels.eagle_iid_level`): the tree's tables, fed nodes and counters in one
    long tensor (:func:`_iid_layout`), read in one slice.
    """

    def __init__(self, plan: _IidPlan, policy: EagleTree, device: torch.device, pending: int) -> None:
        self.plan, self.policy, self.pending, self.levels = plan, policy, pending, 0
        self.fed = 1  # the levels fed so far (the root's first)
        self.work = plan.layout.clone()
        self.pp = torch.empty(2 * max(plan.slots), dtype=torch.float64, device=device)
        self.ancestors = plan.ancestors.clone()
        self.allowed = None

    def level(self, d: int, R: torch.Tensor, cand: torch.Tensor, last: bool) -> None:
        """Level ``d``'s draws ``cand`` from the frontier's rows ``R``: its nodes, and the next frontier."""
        plan, at, w = self.plan, self.plan.offsets, cand.shape[1]
        self.levels = d
        f, g = plan.slots[d - 1], 0 if last else plan.slots[d]
        before = sum(plan.slots[: d - 1])  # fed slots before this level's frontier
        fr, nxt = at["fed"] + before, at["fed"] + before + f
        self.allowed = (
            None if last else torch.empty(g, self.pending + before + f + g, dtype=torch.bool, device=R.device)
        )
        half = len(self.pp) // 2
        offsets = (at["tok"], at["par"], at["depth"], at["draw"], at["child"], at["state"], at["fed"], fr, nxt)
        offsets += (at["feed"], half * (d % 2 == 0), half * (d % 2))  # path probabilities in, out
        shape = (f, w, g, d, plan.m, self.policy.top_k)
        draft_kernels.eagle_iid_level(
            R, cand.contiguous(), self.work, self.pp, self.ancestors, self.allowed, shape, offsets, self.pending
        )

    def feed(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The next frontier's tokens and its mask (written by the level's launch)."""
        at, g = self.plan.offsets["feed"], self.plan.slots[self.fed]
        self.fed += 1
        return self.work[at : at + g], self.allowed

    def read(self, ok: torch.Tensor, mid: bool) -> _IidRead:
        """The tree so far (its tables written at every level) and its one read."""
        m, at, work = self.plan.m, self.plan.offsets, self.work
        work[at["state"] + 4 : at["state"] + 5].copy_(ok)
        flat = work[: at["child"]].tolist()  # tokens, parents, fed nodes, counters and draws
        fed = sum(self.plan.slots[: self.fed])
        state = flat[at["state"] : at["state"] + 5]
        out = _IidRead(
            (
                flat[at["tok"] : at["tok"] + m],
                flat[at["par"] : at["par"] + m],
                flat[at["draw"] : at["draw"] + (m + 1) * self.policy.width],
                flat[at["fed"] : at["fed"] + fed],
                state[0] + 1,
                state[4],
                state[3],
                state[2] if mid else 0,
            )
        )
        w, n1 = self.policy.width, m + 1
        out.nodes = tuple(work[at[k] : at[k] + n1] for k in ("tok", "par", "depth"))
        out.tables = work[at["draw"] : at["draw"] + 2 * n1 * w].view(2, n1, w)
        out.fed = work[at["fed"] : at["fed"] + fed]
        return out
