"""Static tree shapes (:class:`~adaptive_spec.trees.TreeShape`): chains, and the slot trees (``iid``, ``delayed``,
``wor``) drafted into fixed slots (:mod:`adaptive_spec.trees.slots`), so that no level reads the host.

:func:`draft_tree` drafts one, level by level, or the whole chain or tree in one replay of a captured graph
(:func:`captured_chain`, :func:`captured_slots`). The graph cores' shared pieces (:func:`graph_root`,
:func:`chain_step`, :class:`TreeInGraph`) serve the captured policy trees of the other modules too.
"""

from __future__ import annotations

import functools

import torch

from adaptive_spec.engine.drafting.base import DraftOutcome, DraftRoot, draft_root
from adaptive_spec.engine.logits import ProbsFn, finite_flag, rows_ok
from adaptive_spec.engine.runner import ModelRunner
from adaptive_spec.rng import inverse_cdf_from
from adaptive_spec.trees import DraftLaw, DraftTree, TreeShape
from adaptive_spec.trees.draw import draw_children, draw_tokens
from adaptive_spec.trees.slots import SlotLayout, slot_layout


def draft_tree(
    runner: ModelRunner,
    pending: torch.Tensor | DraftRoot,  # [p] committed tokens not yet in the draft cache (root last), or their forward
    shape: TreeShape,
    probs_fn: ProbsFn,
    generator: torch.Generator,
    deterministic: bool,
) -> DraftOutcome:
    """Draft a tree of ``shape`` after the committed context; see the module docstring.

    ``pending`` is either the pending tokens, fed here (not at all for a depth-0 shape), or
    the :class:`~.base.DraftRoot` of their forward, already run. The draft cache is left holding
    the pending tokens plus the fed tree nodes; the caller commits or rolls back.
    """
    V, device, D = probs_fn.vocab_size, runner.device, shape.depth
    if D == 0:
        return _root_only(pending, shape, V, device)
    if runner.captures_drafts and not isinstance(pending, DraftRoot) and shape.law is not DraftLaw.CHAIN:
        captured = captured_slots(runner, pending, slot_layout(shape, V), probs_fn, generator, deterministic)
        if captured is not None:  # the whole tree in one replay
            return captured
    elif runner.captures_drafts and not isinstance(pending, DraftRoot):  # the whole chain in one replay
        base = runner.cached
        captured = captured_chain(runner, pending, D, probs_fn, generator, deterministic)
        if captured is not None:
            tokens, rows, ok = captured
            return chain_outcome(DraftRoot(int(pending.numel()), base, rows[:1], ok), shape, [rows], [tokens], device)
    root = pending if isinstance(pending, DraftRoot) else draft_root(runner, pending, probs_fn)
    if shape.law is DraftLaw.CHAIN:
        return _draft_chain(runner, root, shape, probs_fn, generator, deterministic)
    return draft_slots(runner, root, slot_layout(shape, V), probs_fn, generator, deterministic)


def captured_chain(
    runner: ModelRunner,
    pending: torch.Tensor,
    depth: int,
    probs_fn: ProbsFn,
    generator: torch.Generator,
    greedy: bool,
    given: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """A chain of ``depth`` tokens after the ``pending`` ones in one replay of its captured graph
    (:meth:`~adaptive_spec.engine.runner.ModelRunner.captured_draft`): ``(tokens [depth], rows [depth, V] (the
    root's first: the rows the tokens were drawn from), ok)``, the graph's own outputs; ``ok``: whether the root's
    logits were finite. None: drafted level by level (no graphs, processors a graph cannot keep, ...).

    The law is :func:`_draft_chain`'s: each token the argmax of its row at temperature 0, else an inverse-CDF draw
    from the row with a uniform from ``generator``, the chain's ``depth`` uniforms drawn before the replay (on a CPU
    from one generator state the same uniforms, so the same tokens: tested).

    ``given`` (LongTensor[a], a hybrid draft's looked-up tokens for an EAGLE-style head, :func:`~.lookup.draft_hybrid`):
    fed one at a time after the pending ones, each level reading the head's output for the one before, and the chain
    drawn after the last of them (the root's row is then the row over it, as :func:`~.lookup._extend_root` makes it).
    They travel in the graph's noise, ahead of the uniforms (float64 holds every token id exactly): one graph per ``a``.
    """
    probs = runner.graph_probs(probs_fn)
    if probs is None:
        return None
    a = 0 if given is None else int(given.numel())

    def make(d: int):
        return _chain_core(runner, d, probs, greedy, a), ((a + d,), torch.float64), a + d - 1

    def fill(u: torch.Tensor) -> None:
        if a:
            u[:a].copy_(given)
        if not greedy:
            u[a:].uniform_(generator=generator)

    key = ("chain", probs_fn.graph_key(), greedy) if not a else ("hybrid", a, probs_fn.graph_key(), greedy)
    noisy = a or not greedy
    return runner.captured_draft(pending, depth, key, make, fill if noisy else None, a + depth - 1)


def _chain_core(runner: ModelRunner, depth: int, probs: ProbsFn, greedy: bool, given: int = 0):
    """The function a chain's graph records (:func:`captured_chain`): the pending rows' forward, the ``given`` tokens'
    one-row forwards (the noise's first values), then ``depth`` draws and ``depth - 1`` one-row forwards, each
    attending to every row before it. It reads only the model, the slot's cache and the slot's copies of constants (a
    captured kernel outlives the request that captured it).
    """

    def core(ids, pos, mask, *extra, rows, last, noise):
        fed = noise[:given].long() if given else None  # the given tokens, ahead of the uniforms
        row, ok, r, p, hidden, cols = graph_root(runner, probs, ids, pos, mask, extra, rows, last, fed)
        noise = noise[given:]
        tokens, out = [], [row]  # the root's row (the last given token's)
        for d in range(depth):
            token = row.argmax(-1) if greedy else inverse_cdf_from(row, noise[d : d + 1, None])[:, 0]  # [1]
            tokens.append(token)
            if d + 1 == depth:
                break
            logits, hidden, r, p = chain_step(runner, cols, token, r, p, hidden)
            row = probs(logits)
            out.append(row)
        return torch.cat(tokens), torch.cat(out), ok

    return core


def graph_root(runner: ModelRunner, probs: ProbsFn, ids, pos, mask, extra, rows, last, given=None):
    """Inside a captured draft: the pending rows' forward as a bucket's
    (:meth:`~adaptive_spec.engine.runner.ModelRunner.root_stage`), then the ``given`` tokens (LongTensor[t]: a hybrid
    draft's looked-up run, a trunk) fed as a chain after it, the last of them the draft's root. ``(the root's row
    [1, V], whether the pending root's and the root's logits were finite, the root's cache row, its position, its
    final hidden state, the cache's columns)``.
    """
    logits, r, p, hidden = runner.root_stage(ids, pos, mask, extra, rows, last)
    cols = runner.cache_columns()
    ok = None if given is None else finite_flag(logits)  # the pending root's logits, checked with the last given's
    for i in range(0 if given is None else given.numel()):  # reading the output before it (an EAGLE head's feature)
        logits, hidden, r, p = chain_step(runner, cols, given[i : i + 1], r, p, hidden)
    row = probs(logits)
    ok = finite_flag(logits, row) if ok is None else ok & finite_flag(logits, row)
    return row, ok, r, p, hidden, cols


def chain_step(runner: ModelRunner, cols: torch.Tensor, token: torch.Tensor, r, p, hidden):
    """Inside a captured draft: one ``token`` [1] after the row at cache row ``r`` and position ``p``, attending to
    every row before it, its parent feature ``hidden`` (the row before's output). ``(logits, hidden, its cache row,
    its position)``.
    """
    r, p = r + 1, p + 1
    logits, hidden = runner.level_forward(token, r, p, (cols <= r)[None], hidden)
    return logits, hidden, r, p


class TreeInGraph:
    """Inside a captured tree draft (:func:`_slots_core`, :func:`~.eagle_tree._tree_core`): the pending rows' forward as
    a bucket's (:meth:`~adaptive_spec.engine.runner.ModelRunner.root_stage`), the root's row ``root`` [1, V] and its
    finite flag ``ok``, then :meth:`level` a level at a time, each level's nodes written after the ones fed before them.
    """

    def __init__(self, runner: ModelRunner, probs: ProbsFn, ids, pos, mask, extra, rows, last, given=None) -> None:
        # given: a trunk's tokens, fed as a chain after the pending ones, the last of them the root (graph_root)
        self.root, self.ok, self.r0, self.p0, h0, cols = graph_root(
            runner, probs, ids, pos, mask, extra, rows, last, given
        )
        self.rel = cols - self.r0  # a fed node's column: the root's row, then the fed nodes' in feed order
        self.before = cols < self.r0  # the context and the pending rows: every node's ancestors
        self.hidden = [h0]  # the fed nodes' outputs, in feed order: their children's features
        self.runner = runner

    def level(self, tokens: torch.Tensor, allowed: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """The logits [F, V'] of ``F`` new nodes (``tokens``, positions ``pos``), ``allowed`` [F, seen] their rows over
        the ``seen`` nodes fed so far (the root first, these F last): cache rows after the fed ones, the mask over the
        capacity, and each node's parent features (its deepest ancestor before this level).
        """
        F, seen, rel = tokens.numel(), allowed.shape[1], self.rel
        see = self.before | (((rel >= 0) & (rel < seen)) & allowed[:, rel.clamp(0, seen - 1)])  # [F, capacity]
        # each row's parent: its deepest ancestor before this level, the last of its earlier columns seen
        earlier = allowed[:, : seen - F] * torch.arange(1, seen - F + 1, device=allowed.device)
        parent = earlier.argmax(dim=1)
        at = self.r0 + (seen - F) + torch.arange(F, device=tokens.device)
        logits, h = self.runner.level_forward(tokens, at, pos, see, torch.cat(self.hidden)[parent])
        self.hidden.append(h)
        return logits


def drawn_in_graph(rows: torch.Tensor, k: int, exponentials: torch.Tensor | None) -> torch.Tensor:
    """``k`` children per row of ``rows`` [W, V] inside a captured draft, as
    :func:`~adaptive_spec.trees.draw.draw_tokens` draws them on an accelerator: the argmax for one child or the top
    ``k`` (``exponentials`` None: greedy), else the exponential race (``trees.draw._race``) on the ``exponentials``
    [W, V] drawn before the replay.
    """
    if exponentials is None:
        return rows.argmax(dim=-1, keepdim=True) if k == 1 else rows.topk(k, dim=-1).indices
    return (rows / exponentials).topk(k, dim=-1).indices


def captured_slots(
    runner: ModelRunner,
    pending: torch.Tensor,
    layout: SlotLayout,
    probs_fn: ProbsFn,
    generator: torch.Generator,
    greedy: bool,
) -> DraftOutcome | None:
    """A static tree (i.i.d., delayed, without replacement) after the ``pending`` tokens in one replay of its captured
    graph (:meth:`~adaptive_spec.engine.runner.ModelRunner.captured_draft`): the outcome, or None: drafted level by
    level (:func:`draft_slots`).

    The graph grows the tree by :func:`slots_grow`, each level's forward on the device
    (:meth:`~.runner.ModelRunner.level_forward`: the slots' cache rows after the root's, in slot order, their mask
    over the capacity from the layout's ancestor rows, their parents' features gathered from the fed slots'
    outputs), and draws as :func:`draft_slots` draws on an accelerator: the argmax or the top ``k`` where greedy, else
    the exponential race, its exponentials drawn before the replay, a level a call of the level-by-level drafter's
    shape from the same generator, so the same tree from one generator state (tested).
    """
    out = replay_slots(runner, pending, layout, probs_fn, generator, greedy)
    if out is None:
        return None
    tokens, valid, rows, ok = out
    # the graph's outputs are overwritten by its next replay: the tokens and flags, read after this step's verification
    # (the next step's pending tokens may view them), are copied; the rows are copied with the leaves' zero rows
    ancestors = layout.tensors(runner.device)[0]
    return slots_outcome(layout, ancestors, tokens.clone(), valid.clone(), rows, ok, pending.numel())


def replay_slots(
    runner: ModelRunner,
    pending: torch.Tensor,
    layout: SlotLayout,
    probs_fn: ProbsFn,
    generator: torch.Generator,
    greedy: bool,
    trunk: torch.Tensor | None = None,
    branch_threshold: float = 0.0,
) -> tuple[torch.Tensor, ...] | None:
    """:func:`captured_slots`'s replay: the graph's outputs ``(tokens, valid, rows, ok)`` (:func:`slots_grow`'s, and
    whether every row was finite), or None: not captured. ``trunk`` (LongTensor[t],
    :func:`~.delayed.captured_conf_delayed`): a trunk's tokens fed as a chain after the pending ones, the layout's root
    its last; they travel in the graph's noise, a row after the exponentials (float32 holds every token id below 2**24
    exactly: a larger vocabulary drafts level by level), one graph per trunk length.
    ``branch_threshold``: :func:`slots_grow`'s.
    """
    probs = runner.graph_probs(probs_fn)
    vocab, device, shape = probs_fn.vocab_size, runner.device, layout.shape
    t = 0 if trunk is None else int(trunk.numel())
    if probs is None or (t and vocab > 1 << 24):  # a trunk's ids in float32, exact below 2**24
        return None
    at, noisy = _slot_noise(layout, greedy)

    def make(d: int):  # noqa: ARG001 - only the shape's own depth: its cuts at a budget's end are other shapes
        tensors = runner.slot.constant(f"slot layout {shape} {vocab}", layout.tensors(device))
        core = _slots_core(runner, layout, tensors, probs, greedy, at, t, branch_threshold)
        return core, ((max(noisy, 1) + (1 if t else 0), vocab), torch.float32), t + layout.fed - 1

    def fill(noise: torch.Tensor) -> None:  # the race's exponentials, one call a level as the level-by-level drafter
        for d, start in enumerate(at):
            if start is not None:
                end = next((a for a in at[d + 1 :] if a is not None), noisy)
                noise[start:end].exponential_(generator=generator)
        if t:
            noise[-1, :t].copy_(trunk)

    key = ("slots", shape, vocab, probs_fn.graph_key(), greedy, t, branch_threshold)
    block = t + layout.fed - 1
    return runner.captured_draft(pending, shape.depth, key, make, fill if noisy or t else None, block, cuts=False)


def _slot_noise(layout: SlotLayout, greedy: bool) -> tuple[list[int | None], int]:
    """Where each level's exponentials start in a captured static tree's noise (None: a greedy level draws none), and
    how many rows of them in all: a level draws one row of ``V`` for each frontier row (its slots' own rows, or the
    one row its walkers spread from, repeated), as :func:`~adaptive_spec.trees.draw.draw_children` draws the race.
    """
    at, total, before = [], 0, 1  # the frontier rows of the first level: the root's
    for d, (first, end) in enumerate(layout.levels):
        width = end - first
        rows = width if layout.spread[d] else before
        if greedy and (not layout.walkers or width == 1):
            at.append(None)
        else:
            at.append(total)
            total += rows
        before = width
    return at, total


def _slots_core(
    runner: ModelRunner,
    layout: SlotLayout,
    tensors,
    probs: ProbsFn,
    greedy: bool,
    at: list[int | None],
    trunk: int = 0,
    branch_threshold: float = 0.0,
):
    """The function a static tree's graph records (:func:`captured_slots`; ``trunk``, ``branch_threshold``:
    :func:`replay_slots`').
    """
    ancestors, depths = tensors

    def core(ids, pos, mask, *extra, rows, last, noise):
        given = noise[-1, :trunk].long() if trunk else None
        tree = TreeInGraph(runner, probs, ids, pos, mask, extra, rows, last, given)

        def draw(frontier: torch.Tensor, k: int, greedy_level: bool, d: int) -> tuple[torch.Tensor, torch.Tensor]:
            e = None if greedy_level else noise[at[d] : at[d] + frontier.shape[0]]
            drawn = drawn_in_graph(frontier, k, e)
            return drawn, frontier.gather(-1, drawn) > 0

        def forward(first: int, end: int, tokens: torch.Tensor) -> torch.Tensor:
            return probs(tree.level(tokens, ancestors[first:end, :end], tree.p0 + depths[first:end]))

        tokens, valid, fed = slots_grow(layout, tree.root, draw, forward, greedy, None, branch_threshold)
        return tokens, valid, fed, tree.ok & rows_ok(fed)

    return core


def draft_slots(
    runner: ModelRunner,
    root: DraftRoot,
    layout: SlotLayout,
    probs_fn: ProbsFn,
    generator: torch.Generator,
    deterministic: bool,
    trunk: tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor]] | None = None,
    branch_threshold: float = 0.0,
) -> DraftOutcome:
    """A static tree drafted on the device into its slots (:mod:`adaptive_spec.trees.slots`): no host read.

    Each level draws from the rows of the slots its walkers stand on (or of every frontier slot, without
    replacement) and feeds every new slot under the shape's fixed mask. The tokens and validity flags stay on
    the device: the engine's one host read brings them back with the verifier's, and the tree's parents and
    child draws are merged then. Every row's finiteness is the outcome's ``ok``, read with them.

    ``trunk``: the first levels of a ``delayed`` layout, already drawn and fed (one slot each, in slot order), as
    ``(tokens, valid, rows)`` after the root's (:func:`~.delayed.draft_conf_delayed`); the levels after them are
    drafted. ``branch_threshold`` (walker laws, ``conf-delayed``'s paths that may stop): a node below the branching
    point has children only if the row its own token was drawn from has a top-1 of at least it (its parent's row, as
    the policy's ``feed``); the draws of a walker whose node has none are flagged invalid (with everything under
    them, :meth:`SlotLayout.merge`), so the tree is the policy's, though every slot is still fed.
    """
    p, base, device = root.pending, root.base, runner.device
    ancestors, depths = layout.tensors(device)
    pending_cols = torch.ones(layout.num_slots, p - 1, dtype=torch.bool, device=device)  # every node sees them

    def draw(frontier: torch.Tensor, k: int, greedy: bool, d: int) -> tuple[torch.Tensor, torch.Tensor]:  # noqa: ARG001
        return draw_children(frontier, k, generator, replace=False, greedy=greedy)

    def forward(first: int, end: int, tokens: torch.Tensor) -> torch.Tensor:
        mask = torch.cat([pending_cols[first:end], ancestors[first:end, :end]], dim=1)
        pos = depths[first:end] + (base + p - 1)
        return probs_fn(runner.block_forward(tokens, pos, mask, logits_to_keep=end - first))

    tokens, valid, rows = slots_grow(layout, root.probs[-1:], draw, forward, deterministic, trunk, branch_threshold)
    # The rows are softmaxes: any NaN or +inf in a level's logits makes its row NaN (the root's is checked as fed).
    return slots_outcome(layout, ancestors, tokens, valid, rows, root.ok & rows_ok(rows), p)


def slots_outcome(
    layout: SlotLayout,
    ancestors: torch.Tensor,
    tokens: torch.Tensor,
    valid: torch.Tensor,
    rows: torch.Tensor,
    ok: torch.Tensor,
    pending: int,
) -> DraftOutcome:
    """A static tree's outcome from :func:`slots_grow`'s tokens, validity and fed rows (the never-fed slots' rows
    zero, appended here).
    """
    n, fed = layout.num_slots, layout.fed
    probs = torch.cat([rows, _zero_rows(n - fed, rows.shape[1], rows.dtype, rows.device)])  # [N, V]; leaves: none
    tree = DraftTree.from_slots(layout, tokens, valid, probs)
    return DraftOutcome(tree, ancestors, pending, fed, ok=ok)


def slots_grow(
    layout: SlotLayout,
    root_row: torch.Tensor,
    draw,
    forward,
    deterministic: bool,
    trunk: tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor]] | None = None,
    branch_threshold: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A static tree's levels on the device (:func:`draft_slots`, :func:`captured_slots`): ``(tokens [N], valid
    [N], rows [F, V])`` in slot order, the root's token -1, the rows those of the ``F`` fed slots (the root's first).

    ``root_row`` [1, V]: the root's; ``draw(frontier, k, greedy, level)``: ``k`` children per frontier row,
    ``(tokens [W, k], valid [W, k])``; ``forward(first, end, tokens)``: the rows of slots ``first .. end - 1`` fed
    (their tokens), attending to their ancestors. ``trunk`` and ``branch_threshold``: :func:`draft_slots`'.
    """
    D, device = layout.shape.depth, root_row.device
    rows, tokens = [root_row], [torch.full((1,), -1, dtype=torch.long, device=device)]
    valid = [torch.ones(1, dtype=torch.bool, device=device)]
    if trunk is not None:
        tokens, valid, rows = tokens + trunk[0], valid + trunk[1], rows + trunk[2]
    fed_ok = None  # paths that may stop: whether each walker's node is fed (the branch node always is)
    for d, (first, end) in enumerate(layout.levels):
        if d < len(tokens) - 1:  # a trunk level, drawn and fed already
            continue
        frontier = rows[-1].expand(end - first, -1) if layout.spread[d] else rows[-1]
        # without replacement every frontier slot draws k distinct children; a lone walker takes the argmax at T = 0
        greedy = deterministic and (not layout.walkers or end - first == 1)
        drawn, ok = draw(frontier, layout.draws[d], greedy, d)
        ok = ok.reshape(-1)
        if branch_threshold:  # a node below the branching point has children if it is fed
            ok = ok if fed_ok is None else ok & fed_ok
            fed_ok = frontier.amax(-1).double() >= branch_threshold  # the new nodes' parents' rows: their feed
        tokens.append(drawn.reshape(-1))
        valid.append(ok)
        if d + 1 < D:  # feed the new level so that it can be expanded
            rows.append(forward(first, end, tokens[-1]))
    return torch.cat(tokens), torch.cat(valid), torch.cat(rows)  # every slot above the last level is fed


def _draft_chain(
    runner: ModelRunner,
    root: DraftRoot,
    shape: TreeShape,
    probs_fn: ProbsFn,
    generator: torch.Generator,
    deterministic: bool,
) -> DraftOutcome:
    """A chain drafted on the device: its shape is known, so the levels never wait for the host.

    Each level draws one token from the last row (the same draw as :func:`_walker_level`'s lone
    walker) and feeds it, as a device tensor, to the next forward. Nothing is read back: the tree's
    tokens stay on the device and the finiteness of every row is the outcome's ``ok``, both read by
    the engine with the verifier's one host read (before any drawn token is used on the host).
    """
    D, p, base, device = shape.depth, root.pending, root.base, runner.device
    positions = torch.arange(base + p - 1, base + p + D - 1, device=device)  # node d's position, d = 1 .. D
    rows, drawn = [root.probs[-1:]], []
    for d in range(D):
        token = draw_tokens(rows[-1], 1, generator, greedy=deterministic)[:, 0]  # [1]
        drawn.append(token)
        if d + 1 < D:  # node d + 1 attends to every row before it: no mask to build
            logits = runner.block_forward(token, positions[d + 1 : d + 2], None, logits_to_keep=1)
            rows.append(probs_fn(logits))
    return chain_outcome(root, shape, rows, drawn, device)


def chain_outcome(
    root: DraftRoot,
    shape: TreeShape,
    rows: list[torch.Tensor],
    drawn: list[torch.Tensor],
    device: torch.device,
    decisions: int = 0,
    depth: int | None = None,
) -> DraftOutcome:
    """The outcome of a chain drafted on the device: ``drawn`` its D tokens (each LongTensor[1]), ``rows`` the D
    fed rows (the root's first), all on the device; nothing read. ``depth``: D when it is not ``shape.depth`` (a
    policy chain's, whose shape is the policy's).
    """
    D, p = shape.depth if depth is None else depth, root.pending
    no_token, parents, depths, children, ancestors = chain_tensors(D, device)
    tokens = torch.cat([no_token, *drawn])  # [D + 1], on the device
    probs = torch.cat([*rows, _zero_rows(1, rows[0].shape[1], rows[0].dtype, device)])  # [D + 1, V]; the leaf: none
    # The rows are softmaxes: any NaN or +inf in a level's logits makes its row NaN (the root's is checked as fed).
    ok = root.ok & rows_ok(probs)
    nodes = range(D + 1)
    tree = DraftTree(tokens, [n - 1 for n in nodes], list(nodes), probs, [[n + 1] for n in range(D)] + [[]], shape)
    tree.keep_tensors(parents=parents, depths=depths, children=children)
    return DraftOutcome(tree, ancestors, p, D, policy_levels=decisions, ok=ok)


@functools.lru_cache(maxsize=64)
def _zero_rows(n: int, vocab: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A read-only block of ``n`` zero rows (the never-fed leaves' draft rows, concatenated after the fed ones), made
    once: no fill a step.
    """
    return torch.zeros(n, vocab, dtype=dtype, device=device)


@functools.lru_cache(maxsize=64)
def chain_tensors(depth: int, device: torch.device) -> tuple[torch.Tensor, ...]:
    """A chain's read-only tensors of depth ``depth`` on ``device``, made once: ``(the root's token -1 [1], parents
    [D + 1], depths [D + 1], children [D + 1, 1] (the last: none, D + 1), ancestors [D + 1, D + 1])``.
    """
    depths = torch.arange(depth + 1, device=device)
    ancestors = torch.ones(depth + 1, depth + 1, dtype=torch.bool, device=device).tril_()
    return depths[:1] - 1, depths - 1, depths, (depths + 1)[:, None], ancestors


def _root_only(pending: torch.Tensor | DraftRoot, shape: TreeShape, vocab: int, device: torch.device) -> DraftOutcome:
    """A depth-0 tree: the root alone (with the draft's row when the pending tokens were fed). Its token, parent,
    depth and ancestor tensors are a depth-0 chain's, made once per device: its target block copies nothing.
    """
    no_token, parents, depths, children, one = chain_tensors(0, device)
    fed = isinstance(pending, DraftRoot)  # the pending tokens were fed: node 0 has its row
    probs = pending.probs[-1:] if fed else torch.zeros(1, vocab, dtype=torch.float32, device=device)
    tree = DraftTree([-1], [-1], [0], probs, [[]], shape)
    tree.keep_tensors(tokens=no_token, parents=parents, depths=depths, children=children)
    return DraftOutcome(tree, one, pending.pending if fed else 0, 1 if fed else 0)
