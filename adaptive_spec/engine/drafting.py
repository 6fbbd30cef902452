"""Batched tree drafting with the draft model: one forward per depth level.

The tree is grown level by level. At depth d every node that will be expanded has just been
fed to the draft model (one forward over the whole level, under the tree attention mask),
so its next-token distribution is a row of that forward's output; children for the whole
level are then drawn with a few torch ops from the caller's generator:

* chain / trunk: one *walker* draws one token per level;
* i.i.d. rollouts (``iid``, the branches of ``delayed``): K walkers, each drawing one token
  per level from the row of the slot it stands on (inverse CDF, with replacement);
  walkers that draw the same token from the same node share one node once the tree is read,
  and the draw is kept with multiplicity in ``child_draws``;
* without replacement: every frontier slot draws ``widths[d]`` distinct children, the law of
  sequential draws without replacement (Plackett-Luce), tokens of probability zero excluded: by
  the exponential race (Gumbel-top-k, ``argsort(probs / Exp(1))``) on an accelerator, from inverse-CDF
  draws on a CPU (:func:`~adaptive_spec.trees.draw.draw_children`).

Static shapes are drafted into fixed slots (:mod:`adaptive_spec.trees.slots`): no level reads the host,
and the tree's structure is merged from the tokens after the engine's one read. Policies decide on the
host, one read per level, except: EAGLE-style trees without replacement, whose counts per level are known in
advance, decided on the device with one read per tree (:func:`draft_eagle_on_device`); with
i.i.d. children, on an accelerator, each level has its most frontier rows, padding after the fed ones
(:func:`draft_eagle_iid_on_device`, one read per tree, which ends at a *look* level chosen from the past
trees); policy chains
(``conf-chain``, ``cum-chain``, ``learned-chain``), on an accelerator, decided on the device and read once, at a
*look* level chosen from the past stops (:func:`draft_chain_on_device`); and ``conf-delayed`` trees, whose trunk
is read level by level on a CPU and once at its look on an accelerator, then the paths drafted into a static
shape's slots (:func:`draft_conf_delayed`; paths that may stop are flagged on the device). This is the
law of :func:`adaptive_spec.trees.sample_tree` (which draws rollout
by rollout, depth first): rows are a function of the prefix only, draws are independent given the rows,
and walkers are processed in rollout order at each level, so each node's ``child_draws`` has the same
order. Only the node numbering differs (here breadth first, by slot). Leaves (depth ``shape.depth``) are
never fed to the draft model.

At temperature 0 (``deterministic=True``) single-walker draws take the argmax and
without-replacement draws the top-w tokens (deterministic top-k, fine for greedy
verification, docs/algorithms.md §2), while i.i.d. rollouts are still sampled so that they differ.

The first draft forward of a step, over the *pending* context tokens (those not yet in the
draft cache, the root last), does not depend on the tree shape: :func:`draft_root` runs it on
its own (the engine does so before the planner chooses, when root features are wanted, since
its last row is the draft's root distribution) and :func:`draft_tree` continues from it.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np
import torch

from adaptive_spec.engine import draft_kernels
from adaptive_spec.engine.eagle import EagleRunner
from adaptive_spec.engine.logits import ProbsFn, finite_flag, rows_ok
from adaptive_spec.engine.runner import ModelRunner
from adaptive_spec.formats.nodes import PROB_FLOOR
from adaptive_spec.rng import TorchSampler, accelerator_path, inverse_cdf_from
from adaptive_spec.trees import DraftLaw, DraftTree, TreeShape
from adaptive_spec.trees.datastore import Datastore
from adaptive_spec.trees.draw import draw_children, draw_tokens
from adaptive_spec.trees.lookup import (
    NgramIndex,
    hybrid_tree,
    lookup_trie,
    trie_with_path,
    within_vocab,
)
from adaptive_spec.trees.policy import (
    ChainRule,
    ConfidenceChain,
    ConfidenceDelayed,
    CumulativeChain,
    DraftPolicy,
    EagleTree,
    LearnedChain,
    NodeView,
    PolicyContext,
    clip_widths,
)
from adaptive_spec.trees.slots import SlotLayout, layouts_to_device, slot_layout
from adaptive_spec.trees.tree import unpack_masks
from adaptive_spec.verifiers import kernels


@dataclass
class DraftOutcome:
    """A drafted tree and where its nodes sit in the draft model's cache.

    Attributes:
        tree: the draft tree (nodes numbered level by level).
        ancestors: BoolTensor[N, N] on the model's device, ``ancestor_matrix(tree.parents)``.
        pending_fed: number of pending context tokens fed before the tree (0 when the draft
            model was not run, i.e. a depth-0 tree).
        fed_nodes: tree nodes ``0 .. fed_nodes - 1`` have KV rows in the draft cache, at row
            ``cached + pending_fed - 1 + node`` (node 0 is the last pending token); for a
            policy-grown tree, the number of fed nodes, whose rows ``cache_rows`` gives.
        cache_rows: policy-grown trees: fed node -> offset of its row after the root (feed order).
        lookup_rows: nodes ``0 .. lookup_rows - 1`` have rows made by a lookup (one-hot, or a trie's
            uniform rows: the law their children were found under), not by the draft model; 0 for a
            model-drafted tree. Their children were looked up, not drawn from the draft.
        model_rows: of those nodes, the ones the draft model was run on -> its own row there
            (Tensor[V]), for features (:meth:`model_row`); the verifier reads the tree's rows.
        ok: 0-dim bool tensor, whether the draft's logits were finite, when that is not checked yet (a tree
            drafted without a host read: the engine checks it with the verifier's read); None once checked.
        cache_rows_tensor: ``cache_rows`` on the device, LongTensor[N] (-1: not fed), when the drafter made it
            there: the accepted path's draft rows are then gathered without a copy.
    """

    tree: DraftTree
    ancestors: torch.Tensor
    pending_fed: int
    fed_nodes: int
    cache_rows: dict[int, int] | None = None
    policy_levels: int = 0
    policy_decision_s: float = 0.0
    lookup_rows: int = 0
    model_rows: dict[int, torch.Tensor] = field(default_factory=dict)
    ok: torch.Tensor | None = None
    cache_rows_tensor: torch.Tensor | None = None

    def draft_row(self, node: int) -> int | None:
        """Offset of ``node``'s KV row after the root in the draft cache, or None if it was never fed.

        Static trees feed nodes ``0 .. fed_nodes - 1`` in order; a policy-grown tree feeds them
        in the order of ``cache_rows``.
        """
        if self.cache_rows is None:
            return node if node < self.fed_nodes else None
        return self.cache_rows.get(node)

    def model_row(self, node: int) -> torch.Tensor | None:
        """The draft model's own row over ``node`` (Tensor[V]), or None when the model gave none there.

        The tree's row, except at a node whose children were looked up: there the tree's row is
        the lookup's (what the verifier reads), and the model's row is the one it output when
        the node was fed to it, if that row was kept (:func:`draft_hybrid`'s ``keep_rows``).
        Features and logs of the draft's distribution read this, never a lookup's row.
        """
        if node < self.lookup_rows:
            return self.model_rows.get(node)
        return self.tree.draft_probs[node] if self.draft_row(node) is not None else None

    def drawn_from_model(self) -> list[bool]:
        """Per node, whether its token was drawn from the draft model's row at its parent (not: the root, looked up,
        or an unused slot).
        """
        used = self.tree.used
        return [i > 0 and parent >= self.lookup_rows and used[i] for i, parent in enumerate(self.tree.parents)]


@dataclass
class DraftRoot:
    """The first draft forward of a step: the pending tokens fed as a causal chain.

    Attributes:
        pending: number of pending tokens fed (the root is the last).
        base: the draft cache's committed length before the forward.
        probs: Tensor[keep, V], the processed rows of the last ``keep`` pending tokens; the last
            row is the draft's root distribution (over the first drafted token).
        ok: 0-dim bool tensor, whether the logits were finite (checked at the first host sync).
        hidden: Tensor[keep, H], the draft's last hidden states at those rows, when the runner
            keeps hidden states; else None.
    """

    pending: int
    base: int
    probs: torch.Tensor
    ok: torch.Tensor
    hidden: torch.Tensor | None = None


def draft_root(runner: ModelRunner, pending: torch.Tensor, probs_fn: ProbsFn, keep: int = 1) -> DraftRoot:
    """Feed the ``pending`` tokens (LongTensor[p], root last) to the draft; keep the last ``keep`` rows.

    The rows stay in the draft cache as block rows ``0 .. p - 1``; :func:`draft_tree` grows
    the tree after them, and the caller commits or rolls back.
    """
    p = int(pending.numel())
    if p < 1:
        raise ValueError("draft_root needs at least the root token")
    base = runner.cached
    causal = None if p == 1 else torch.ones(p, p, dtype=torch.bool, device=runner.device).tril_()  # None: no mask
    positions = torch.arange(base, base + p, device=runner.device)
    logits = runner.block_forward(pending, positions, causal, logits_to_keep=min(keep, p))  # [keep, V']
    probs = probs_fn(logits)
    return DraftRoot(p, base, probs, finite_flag(logits, probs), runner.hidden)


def check_finite(ok: torch.Tensor | bool, who: str) -> None:
    """Raise a ValueError when a forward pass returned NaN or inf logits (a host sync if ``ok`` is a tensor)."""
    if not bool(ok):
        raise ValueError(
            f"the {who} model returned NaN or inf logits; check the model weights and dtype "
            "(fp16 overflows are common: try dtype=torch.bfloat16 or float32)"
        )


def sample_categorical(probs: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """One draw per row of ``probs`` (Tensor[W, V]) by the inverse CDF (:func:`draw_tokens` with ``k = 1``).

    Same law as ``torch.multinomial(probs, 1)``, without its per-row setup cost and host sync.
    """
    return draw_tokens(probs, 1, generator)[:, 0]  # [W]


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
    the :class:`DraftRoot` of their forward, already run. The draft cache is left holding
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
            return _chain_outcome(DraftRoot(int(pending.numel()), base, rows[:1], ok), shape, [rows], [tokens], device)
    root = pending if isinstance(pending, DraftRoot) else draft_root(runner, pending, probs_fn)
    if shape.law is DraftLaw.CHAIN:
        return _draft_chain(runner, root, shape, probs_fn, generator, deterministic)
    return _draft_slots(runner, root, slot_layout(shape, V), probs_fn, generator, deterministic)


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

    ``given`` (LongTensor[a], a hybrid draft's looked-up tokens for an EAGLE-style head, :func:`draft_hybrid`): fed
    one at a time after the pending ones, each level reading the head's output for the one before, and the chain
    drawn after the last of them (the root's row is then the row over it, as :func:`_extend_root` makes it). They
    travel in the graph's noise, ahead of the uniforms (float64 holds every token id exactly): one graph per ``a``.
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
        row, ok, r, p, hidden, cols = _graph_root(runner, probs, ids, pos, mask, extra, rows, last, fed)
        noise = noise[given:]
        tokens, out = [], [row]  # the root's row (the last given token's)
        for d in range(depth):
            token = row.argmax(-1) if greedy else inverse_cdf_from(row, noise[d : d + 1, None])[:, 0]  # [1]
            tokens.append(token)
            if d + 1 == depth:
                break
            logits, hidden, r, p = _chain_step(runner, cols, token, r, p, hidden)
            row = probs(logits)
            out.append(row)
        return torch.cat(tokens), torch.cat(out), ok

    return core


def _graph_root(runner: ModelRunner, probs: ProbsFn, ids, pos, mask, extra, rows, last, given=None):
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
        logits, hidden, r, p = _chain_step(runner, cols, given[i : i + 1], r, p, hidden)
    row = probs(logits)
    ok = finite_flag(logits, row) if ok is None else ok & finite_flag(logits, row)
    return row, ok, r, p, hidden, cols


def _chain_step(runner: ModelRunner, cols: torch.Tensor, token: torch.Tensor, r, p, hidden):
    """Inside a captured draft: one ``token`` [1] after the row at cache row ``r`` and position ``p``, attending to
    every row before it, its parent feature ``hidden`` (the row before's output). ``(logits, hidden, its cache row,
    its position)``.
    """
    r, p = r + 1, p + 1
    logits, hidden = runner.level_forward(token, r, p, (cols <= r)[None], hidden)
    return logits, hidden, r, p


class _TreeInGraph:
    """Inside a captured tree draft (:func:`_slots_core`, :func:`_tree_core`): the pending rows' forward as a bucket's
    (:meth:`~adaptive_spec.engine.runner.ModelRunner.root_stage`), the root's row ``root`` [1, V] and its finite flag
    ``ok``, then :meth:`level` a level at a time, each level's nodes written after the ones fed before them.
    """

    def __init__(self, runner: ModelRunner, probs: ProbsFn, ids, pos, mask, extra, rows, last, given=None) -> None:
        # given: a trunk's tokens, fed as a chain after the pending ones, the last of them the root (_graph_root)
        self.root, self.ok, self.r0, self.p0, h0, cols = _graph_root(
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


def _drawn_in_graph(rows: torch.Tensor, k: int, exponentials: torch.Tensor | None) -> torch.Tensor:
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
    level (:func:`_draft_slots`).

    The graph grows the tree by :func:`slots_grow`, each level's forward on the device
    (:meth:`~.runner.ModelRunner.level_forward`: the slots' cache rows after the root's, in slot order, their mask
    over the capacity from the layout's ancestor rows, their parents' features gathered from the fed slots'
    outputs), and draws as :func:`_draft_slots` draws on an accelerator: the argmax or the top ``k`` where greedy, else
    the exponential race, its exponentials drawn before the replay, a level a call of the level-by-level drafter's
    shape from the same generator, so the same tree from one generator state (tested).
    """
    out = _replay_slots(runner, pending, layout, probs_fn, generator, greedy)
    if out is None:
        return None
    tokens, valid, rows, ok = out
    # the graph's outputs are overwritten by its next replay: the tokens and flags, read after this step's verification
    # (the next step's pending tokens may view them), are copied; the rows are copied with the leaves' zero rows
    ancestors = layout.tensors(runner.device)[0]
    return _slots_outcome(layout, ancestors, tokens.clone(), valid.clone(), rows, ok, pending.numel())


def _replay_slots(
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
    whether every row was finite), or None: not captured. ``trunk`` (LongTensor[t], :func:`captured_conf_delayed`): a
    trunk's tokens fed as a chain after the pending ones, the layout's root its last; they travel in the graph's noise,
    a row after the exponentials (float32 holds every token id below 2**24 exactly: a larger vocabulary drafts level by
    level), one graph per trunk length.
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
    :func:`_replay_slots`').
    """
    ancestors, depths = tensors

    def core(ids, pos, mask, *extra, rows, last, noise):
        given = noise[-1, :trunk].long() if trunk else None
        tree = _TreeInGraph(runner, probs, ids, pos, mask, extra, rows, last, given)

        def draw(frontier: torch.Tensor, k: int, greedy_level: bool, d: int) -> tuple[torch.Tensor, torch.Tensor]:
            e = None if greedy_level else noise[at[d] : at[d] + frontier.shape[0]]
            drawn = _drawn_in_graph(frontier, k, e)
            return drawn, frontier.gather(-1, drawn) > 0

        def forward(first: int, end: int, tokens: torch.Tensor) -> torch.Tensor:
            return probs(tree.level(tokens, ancestors[first:end, :end], tree.p0 + depths[first:end]))

        tokens, valid, fed = slots_grow(layout, tree.root, draw, forward, greedy, None, branch_threshold)
        return tokens, valid, fed, tree.ok & rows_ok(fed)

    return core


def _draft_slots(
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
    ``(tokens, valid, rows)`` after the root's (:func:`draft_conf_delayed`); the levels after them are drafted.
    ``branch_threshold`` (walker laws, ``conf-delayed``'s paths that may stop): a node below the branching point
    has children only if the row its own token was drawn from has a top-1 of at least it (its parent's row, as
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
    return _slots_outcome(layout, ancestors, tokens, valid, rows, root.ok & rows_ok(rows), p)


def _slots_outcome(
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
    """A static tree's levels on the device (:func:`_draft_slots`, :func:`captured_slots`): ``(tokens [N], valid
    [N], rows [F, V])`` in slot order, the root's token -1, the rows those of the ``F`` fed slots (the root's first).

    ``root_row`` [1, V]: the root's; ``draw(frontier, k, greedy, level)``: ``k`` children per frontier row,
    ``(tokens [W, k], valid [W, k])``; ``forward(first, end, tokens)``: the rows of slots ``first .. end - 1`` fed
    (their tokens), attending to their ancestors. ``trunk`` and ``branch_threshold``: :func:`_draft_slots`'.
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
    return _chain_outcome(root, shape, rows, drawn, device)


def _chain_outcome(
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
    no_token, parents, depths, children, ancestors = _chain_tensors(D, device)
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
def _chain_tensors(depth: int, device: torch.device) -> tuple[torch.Tensor, ...]:
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
    no_token, parents, depths, children, one = _chain_tensors(0, device)
    fed = isinstance(pending, DraftRoot)  # the pending tokens were fed: node 0 has its row
    probs = pending.probs[-1:] if fed else torch.zeros(1, vocab, dtype=torch.float32, device=device)
    tree = DraftTree([-1], [-1], [0], probs, [[]], shape)
    tree.keep_tensors(tokens=no_token, parents=parents, depths=depths, children=children)
    return DraftOutcome(tree, one, pending.pending if fed else 0, 1 if fed else 0)


class _Builder:
    """A policy-grown tree's nodes as they are drawn, on the host, with each node's ancestors as a bit mask."""

    def __init__(self) -> None:
        self.tokens, self.parents, self.depths = [-1], [-1], [0]
        self.child_draws: list[list[int]] = [[]]
        self.anc = [1]  # bit j of anc[i]: node j is node i or one of its ancestors

    def new_node(self, parent: int, token: int) -> int:
        self.tokens.append(token)
        self.parents.append(parent)
        self.depths.append(self.depths[parent] + 1)
        self.child_draws.append([])
        self.anc.append(self.anc[parent] | (1 << len(self.anc)))
        return len(self.tokens) - 1

    def mask_rows(self, rows: list[int], cols: list[int]) -> list[int]:
        """The ancestor matrix's entries (0/1) at ``rows`` x ``cols``, flattened row by row."""
        return [(self.anc[i] >> j) & 1 for i in rows for j in cols]

    def ancestor_matrix(self) -> np.ndarray:
        """The whole ancestor matrix, int64 [N, N] (0/1): the bit masks unpacked in bulk."""
        return unpack_masks(self.anc).astype(np.int64)


def lookup_outcome(
    ngrams: NgramIndex,
    shape: TreeShape,
    vocab_size: int,
    device: torch.device,
    root: DraftRoot | None,
    corpus: tuple[Datastore, int] | None = None,
    chain: DraftOutcome | None = None,
    width: int = 1,
    queued: bool = False,
) -> DraftOutcome:
    """A lookup step's chain or trie (:mod:`adaptive_spec.trees.lookup`): no draft forward but ``chain``'s.

    ``ngrams``: the committed context, indexed (:class:`~adaptive_spec.trees.lookup.NgramIndex`).
    ``root``: the step's first draft forward, when it was run for the root features (else None);
    its last row is the draft model's row over the root, kept as the outcome's ``model_rows``.
    ``corpus``: ``(datastore, K)``: K of the shape's paths are found in the datastore
    (:mod:`adaptive_spec.trees.datastore`), the others in the context; still a function of the context.
    ``chain``: the draft model's greedy chain (:func:`draft_lookup_model`), one more of the shape's paths: nodes
    ``1 .. D`` of the tree, its tokens left on the device (:func:`~adaptive_spec.trees.lookup.trie_with_path`), so
    they come back with the verifier's read and the draft's cache keeps the chain's rows as a chain plan's.
    ``width``: with ``chain``, the draft's top ``width`` tokens at the root, the first the chain's
    (``lookup:WxL+mAxD``): the others are nodes ``D + 1 ..``, one-token paths beside the chain, found on the device
    (a top-k of the draft's row at the root, a function of the context too; not fed to the draft). ``queued``: with
    ``chain``, the trie's copy is queued behind the chain's draft on CUDA, not waited for
    (:func:`~adaptive_spec.trees.lookup.trie_with_path`).
    """
    # one path (lookup:L) is the chain of the most recent longest match, several (lookup:WxL) its trie
    # (ids outside the LM head, possible in a prompt, are never drafted: the target gives them probability 0)
    k = corpus[1] if corpus is not None else 0
    found = ngrams.candidates(shape.paths - k - (width if chain is not None else 0), shape.depth)
    if corpus is not None:
        found += corpus[0].candidates(ngrams.context, k, shape.depth)
    found = within_vocab(found, vocab_size)
    if chain is not None:  # the chain's nodes keep their numbers (1 .. D), so its fed rows are a chain plan's
        path = chain.tree.tokens_tensor(device)[1:]
        leaves = _root_leaves(chain.tree.draft_probs[0], path[:1], width - 1) if width > 1 else None
        tree = trie_with_path(found, path, vocab_size, shape.paths, device, leaves, queued)
        n, fed = tree.num_nodes, chain.fed_nodes
        rows = {i: chain.tree.draft_probs[i] for i in range(fed)}  # the model's own rows, for features
        ancestors = tree.ancestors_tensor(device)
        return DraftOutcome(tree, ancestors, chain.pending_fed, fed, lookup_rows=n, model_rows=rows, ok=chain.ok)
    tree = lookup_trie(found, vocab_size, shape.paths, device)  # with its device copies, made in one copy
    ancestors = tree.ancestors_tensor(device)
    n = tree.num_nodes
    if root is None:  # the draft model was not run: its pending tokens wait for the next model step
        return DraftOutcome(tree, ancestors, pending_fed=0, fed_nodes=0, lookup_rows=n)
    # only the root is in the draft cache; the tree's row there is the lookup's, the model's is root.probs[-1]
    rows = {0: root.probs[-1]}
    return DraftOutcome(tree, ancestors, pending_fed=root.pending, fed_nodes=1, lookup_rows=n, model_rows=rows)


def _root_leaves(row: torch.Tensor, first: torch.Tensor, k: int) -> torch.Tensor:
    """The ``k`` best tokens of the draft's root ``row`` other than ``first`` (LongTensor[1], the chain's first token,
    its argmax): ``lookup:WxL+mAxD``'s one-token paths beside the chain, on the device, no read. Taking the top-k's
    tail instead could repeat ``first`` where a tie ranks it second (a wasted leaf); masking it never does.
    """
    return row.index_fill(0, first, -1.0).topk(k).indices


def draft_lookup_model(
    runner: ModelRunner,
    pending: torch.Tensor | DraftRoot,
    ngrams: NgramIndex,
    shape: TreeShape,
    depth: int,
    probs_fn: ProbsFn,
    generator: torch.Generator,
    corpus: tuple[Datastore, int] | None = None,
    width: int = 1,
) -> DraftOutcome:
    """A lookup trie with the draft model's greedy chain of ``depth`` tokens as one more path (``lookup:WxL+mD``),
    and its next ``width - 1`` best tokens at the root as one-token paths (``lookup:WxL+mAxD``, A = ``width``).

    The chain is drafted as a ``chain:D`` plan's at temperature 0 (one replay where chains are captured): each
    token the argmax of the draft's row, whatever the step's temperature. It is a function of the committed
    context like the looked-up paths, so the trie is one too and NSS and greedy verification stay exact
    (docs/algorithms.md §8). The draft's cache keeps the chain's rows; the accepted path's share of the chain
    (a prefix of it) is committed there as a chain plan's.
    """
    chain = draft_tree(runner, pending, TreeShape.chain(depth), probs_fn, generator, deterministic=True)
    queued = runner.slot is not None and runner.slot.early_pass  # the trie's copy behind the chain's replay
    kw = {"chain": chain, "width": width, "queued": queued}
    return lookup_outcome(ngrams, shape, probs_fn.vocab_size, runner.device, None, corpus, **kw)


def draft_hybrid(
    runner: ModelRunner,
    pending: torch.Tensor | DraftRoot,
    ngrams: NgramIndex,
    lookup_depth: int,
    model_depth: int,
    probs_fn: ProbsFn,
    generator: torch.Generator,
    deterministic: bool,
    keep_rows: bool = False,
) -> DraftOutcome:
    """A looked-up run extended by the model (:func:`adaptive_spec.trees.lookup.hybrid_tree`).

    Up to ``lookup_depth`` tokens are found in the context and fed to the draft after the pending
    tokens, as if committed; the model then drafts a chain of ``model_depth`` tokens from the last
    of them. Node ``i`` of the hybrid chain sits at block row ``p - 1 + i`` like a static tree's,
    so the engine commits it the same way. Without a match, it is the model's chain alone.

    ``keep_rows``: also keep the draft model's rows over the root and the looked-up nodes but the
    last (the outcome's ``model_rows``, for features); the tree's rows there stay one-hot.
    """
    found = next(iter(within_vocab([ngrams.match(lookup_depth).tokens], probs_fn.vocab_size)), [])
    if not found:
        return draft_tree(runner, pending, TreeShape.chain(model_depth), probs_fn, generator, deterministic)
    a = len(found)
    ids = torch.tensor(found, dtype=torch.long, device=runner.device)  # the step's one copy to the device
    chain = TreeShape.chain(model_depth)
    rows, tail = {}, None
    if isinstance(runner, EagleRunner) and not (keep_rows or isinstance(pending, DraftRoot)) and runner.captures_drafts:
        base = runner.cached  # the looked-up tokens fed one at a time, then the chain: one replay (captured_chain)
        captured = captured_chain(runner, pending, model_depth, probs_fn, generator, deterministic, given=ids)
        if captured is not None:
            tokens, tail_rows, ok = captured
            root = DraftRoot(int(pending.numel()) + a, base, tail_rows[:1], ok)
            tail = _chain_outcome(root, chain, [tail_rows], [tokens], runner.device)
    if tail is None and (keep_rows or isinstance(runner, EagleRunner) or isinstance(pending, DraftRoot)):
        root = _extend_root(runner, pending, ids, probs_fn, a + 1 if keep_rows else 1)
        tail = draft_tree(runner, root, chain, probs_fn, generator, deterministic)
        kept = root.probs.shape[0] - 1  # rows over the nodes before node a (whose row is the tail's root row)
        rows = {a - kept + i: root.probs[i] for i in range(kept)}
    elif tail is None:  # the looked-up tokens fed as pending ones, then the chain: one replay where chains are captured
        tail = draft_tree(runner, torch.cat([pending, ids]), chain, probs_fn, generator, deterministic)
    tree = hybrid_tree(found, tail.tree, ids)
    n = tree.num_nodes
    ancestors = torch.ones(n, n, dtype=torch.bool, device=runner.device).tril_()
    fed = a + tail.fed_nodes
    return DraftOutcome(tree, ancestors, tail.pending_fed - a, fed, lookup_rows=a, model_rows=rows, ok=tail.ok)


def _extend_root(
    runner: ModelRunner, pending: torch.Tensor | DraftRoot, ids: torch.Tensor, probs_fn: ProbsFn, keep: int = 1
) -> DraftRoot:
    """The pending tokens' forward with the looked-up ``ids`` (LongTensor[a]) fed after them (appended to an
    already-run forward if given).

    Its ``probs`` are the rows over the last ``keep`` fed tokens (at most ``a + 1``: the
    old root and the looked-up tokens), the last one being the row over ``ids[-1]``.

    An EAGLE-style head reads the target's features only for committed tokens, so it takes the
    looked-up tokens one at a time, each reading the head's own output for the one before.
    """
    device = runner.device
    one_by_one = isinstance(runner, EagleRunner)
    if not isinstance(pending, DraftRoot) and not one_by_one:
        return draft_root(runner, torch.cat([pending, ids]), probs_fn, keep)
    root = pending if isinstance(pending, DraftRoot) else draft_root(runner, pending, probs_fn)
    p, a = root.pending, ids.numel()
    positions = torch.arange(root.base + p, root.base + p + a, device=device)
    if one_by_one:
        parts = []
        for i in range(a):
            # one token attending to every earlier block row (a chain): no mask
            parts.append(runner.block_forward(ids[i : i + 1], positions[i : i + 1], None, logits_to_keep=1))
        logits = torch.cat(parts[-min(keep, a) :])  # [min(keep, a), V']
    else:
        mask = torch.ones(a, p + a, dtype=torch.bool, device=device).tril_(diagonal=p)  # causal after the block
        logits = runner.block_forward(ids, positions, mask, logits_to_keep=min(keep, a))
    probs = probs_fn(logits)
    ok = finite_flag(logits, probs) & root.ok
    if keep > a:  # the old root's row too
        probs = torch.cat([root.probs[-1:], probs])
    return DraftRoot(p + a, root.base, probs, ok, runner.hidden)


def draft_policy_tree(
    runner: ModelRunner,
    pending: torch.Tensor | DraftRoot,  # [p] pending tokens (root last), or their forward
    policy: DraftPolicy,
    probs_fn: ProbsFn,
    generator: torch.Generator,
    deterministic: bool,
    *,
    temperature: float = 1.0,
    features: Mapping[str, float] | None = None,
    on_device: bool | None = None,
    deferred: bool = False,
) -> DraftOutcome | DeferredTree:
    """Grow a tree with a drafting ``policy``: one draft forward per level.

    ``deferred``: the caller takes a :class:`DeferredTree` (an EAGLE-style tree without replacement grown in one
    replay, its read left until the target's pass is queued; the engine's step).

    A chain whose stop rule is device arithmetic (``conf-chain``, ``cum-chain``, ``learned-chain``) is decided on
    the device with at most one host read, on an accelerator (:func:`draft_chain_on_device`; ``on_device=True``
    takes that path on a CPU too, ``False`` the host path). An EAGLE-style policy is decided on the device, with
    one host read for the whole tree without replacement (:func:`draft_eagle_on_device`) and usually with i.i.d.
    children too, on an accelerator
    (:func:`draft_eagle_iid_on_device`; ``on_device=False`` forces the host path below, and
    the runner's ``device_policy`` turns it off for a run after a step had to redo its tree). A
    ``conf-delayed`` policy whose paths go on once branched reads its trunk, then drafts the paths into
    slots (:func:`draft_conf_delayed`; ``on_device=False`` forces the host path here too). Any other
    policy decides on the host, one read per level, as follows (so does every policy on a CPU, where a read costs
    nothing and the device paths' forwards past a stop would).

    The law is that of :func:`adaptive_spec.trees.sample_policy_tree`. Per level, one sync
    brings the fed frontier's row statistics (entropy, top-1) together with ``max_width``
    candidate children per node, drawn *before* the policy decides: the first ``k`` of
    ``max_width`` i.i.d. draws are ``k`` i.i.d. draws, and the first ``k`` of a Gumbel-top-k
    are ``k`` draws without replacement, so drawing them early does not change the law (the
    policy never sees them). Then the policy's widths pick the children, its ``feed`` picks
    the new nodes to run through the draft, and those nodes are fed in one forward. A node
    that is not fed is a leaf and costs no forward. Nodes are numbered in creation order;
    ``DraftOutcome.cache_rows`` says where the fed ones sit in the draft cache.

    At temperature 0 (``deterministic``) each node's first candidate is the argmax (its top-k
    without replacement), so single-child nodes extend greedily; the greedy verifier is
    lossless for any tree.
    """
    device_path = runner.device_policy and (on_device or (on_device is None and accelerator_path(runner.device)))
    tree_on_device = on_device is not False and runner.device_policy and eagle_on_device(policy, probs_fn.vocab_size)
    # the whole tree in one replay (i.i.d. children: where the device drafter would grow it, an accelerator's path)
    captured = tree_on_device and runner.captures_drafts
    captured = captured and (policy.without_replacement or accelerator_path(runner.device))
    if captured and not isinstance(pending, DraftRoot):
        state, mark = generator.get_state(), runner.block_mark()
        grow = captured_eagle_tree if policy.without_replacement else captured_eagle_iid_tree
        kw = {"defer": True} if deferred and policy.without_replacement else {}
        outcome = grow(runner, pending, policy, probs_fn, generator, deterministic, **kw)
        if isinstance(outcome, DeferredTree):  # a child of probability 0 is drawn again as below, after the pass

            def redraw(back: EagleTree) -> DraftOutcome:
                generator.set_state(state)
                runner.undo_block(mark)
                runner.device_policy = False
                kw = {"temperature": temperature, "features": features, "on_device": False}
                return draft_policy_tree(runner, pending, back, probs_fn, generator, deterministic, **kw)

            return dataclasses.replace(outcome, redraw=redraw)
        if isinstance(outcome, DraftOutcome):
            return outcome
        if outcome is not None:  # a drawn child of probability 0: the host path below, from the same generator state
            generator.set_state(state)
            runner.undo_block(mark)
            runner.device_policy = False
            on_device = False
            policy = outcome  # the policy itself, or an i.i.d. tree's cut at its look
    if device_path and chain_on_device(policy) and runner.captures_drafts and not isinstance(pending, DraftRoot):
        outcome = captured_policy_chain(runner, pending, policy, probs_fn, generator, deterministic, temperature)
        if outcome is not None:
            return outcome
    two_replays = device_path and runner.captures_drafts and not isinstance(pending, DraftRoot)
    if two_replays and on_device is not False and delayed_on_slots(policy, True):  # a trunk's, then the paths'
        outcome = captured_conf_delayed(runner, pending, policy, probs_fn, generator, deterministic)
        if outcome is not None:
            return outcome
    root = pending if isinstance(pending, DraftRoot) else draft_root(runner, pending, probs_fn)
    if device_path and chain_on_device(policy):
        return draft_chain_on_device(runner, root, policy, probs_fn, generator, deterministic, temperature)
    if on_device is not False and delayed_on_slots(policy, bool(device_path)):
        return draft_conf_delayed(runner, root, policy, probs_fn, generator, deterministic, bool(device_path))
    if on_device is None:
        on_device = runner.device_policy and eagle_on_device(policy, probs_fn.vocab_size)
        # i.i.d. children: the device pads its levels and writes every candidate; a CPU, where a read costs nothing,
        # grows the tree faster on the host
        on_device = on_device and (policy.without_replacement or accelerator_path(runner.device))
    if on_device:
        state, mark = generator.get_state(), runner.block_mark()
        grow = draft_eagle_on_device if policy.without_replacement else draft_eagle_iid_on_device
        try:
            outcome = grow(runner, root, policy, probs_fn, generator, deterministic)
        except draft_kernels.KernelFailedError:  # logged, the kernels off: the torch code drafts it again
            generator.set_state(state)
            runner.undo_block(mark)
            outcome = grow(runner, root, policy, probs_fn, generator, deterministic)
        if isinstance(outcome, DraftOutcome):
            return outcome
        # A drawn child had probability 0: the tree the host path grows differs from the one drafted. Draw it again
        # on the host from the same generator state: the draws agree up to there, so the tree is the host path's
        # (of the policy the device path drafted: an i.i.d. tree's cut at its look)
        policy = outcome
        generator.set_state(state)
        runner.undo_block(mark)
        runner.device_policy = False  # rows with zeros (a top-k or top-p processor): the rest of the run on the host
    device = runner.device
    p, base = root.pending, root.base
    g = _PolicyGrowth(policy, probs_fn.vocab_size, device, temperature, features, TorchSampler(generator))
    frontier, R, ok = [0], root.probs[-1:], root.ok
    rows = [R]  # per fed level: Tensor[F, V]
    pending_pos = None if g.chain else torch.ones(1, p - 1, dtype=torch.bool, device=device)
    slots = eagle_iid_slots(policy) if isinstance(policy, EagleTree) and not policy.without_replacement else None
    while frontier and g.budget > 0 and policy.depth > 0:
        if slots is not None and R.shape[0] < slots[g.levels]:  # drawn on the device drafter's rows (see there)
            R = torch.cat([R, R[:1].expand(slots[g.levels] - R.shape[0], -1)])
        cand, *stats = _level_candidates(R, g.K, policy.law is DraftLaw.DYNAMIC_WOR, generator, deterministic, ok)
        new = g.expand(frontier, *stats)
        if g.chain and new:
            g.chain_tokens.append(cand[0])  # a chain's new node is its one frontier row's one candidate
        if not new or g.budget <= 0:
            break
        frontier = g.feed(new)
        if not frontier:
            break
        F, fed = len(frontier), len(g.fed_order)
        if g.chain:  # its token is on the device, its position the next, and it sees every row before it: no copy
            ids = g.chain_tokens[-1]
            pos = torch.full((1,), base + p - 1 + g.b.depths[frontier[0]], dtype=torch.long, device=device)
            allowed = None  # one token attending to every row before it: no mask
        else:  # the fed nodes' tokens, positions and mask rows over the fed nodes (built on the host), in one copy
            host = [*(g.b.tokens[c] for c in frontier), *(base + p - 1 + g.b.depths[c] for c in frontier)]
            host += g.b.mask_rows(frontier, g.fed_order)
            ids, pos, mask = torch.tensor(host, device=device).split([F, F, F * fed])
            allowed = torch.cat([pending_pos.expand(F, -1), mask.view(F, fed).bool()], dim=1)
        logits = runner.block_forward(ids, pos, allowed, logits_to_keep=F)  # [F', V']
        R = probs_fn(logits)
        ok = finite_flag(logits, R)
        rows.append(R)
    return g.outcome(rows, p)


def chain_on_device(policy: DraftPolicy) -> bool:
    """Whether ``policy`` is a chain whose stop rule the device decides (:func:`draft_chain_on_device`): ``conf-chain``,
    ``cum-chain``, and ``learned-chain`` with an acceptance model that gives its layers (the installed one does).
    """
    if isinstance(policy, LearnedChain):
        return hasattr(policy.predictor, "device_layers")
    return type(policy) in (ConfidenceChain, CumulativeChain)


#: The look level of a policy chain drafted on the device before its runner has seen it stop, and how many past
#: stops choose it after that (:func:`draft_chain_on_device`).
FIRST_LOOK, LOOK_HISTORY = 2, 8


def draft_chain_on_device(
    runner: ModelRunner,
    root: DraftRoot,
    policy: ChainRule,
    probs_fn: ProbsFn,
    generator: torch.Generator,
    deterministic: bool,
    temperature: float = 1.0,
) -> DraftOutcome:
    """A policy chain (``conf-chain``, ``cum-chain``, ``learned-chain``) with its stop rule decided on the device: one
    host read at most.

    Each level draws the next token from the last row (the host path's lone candidate: the same draw from the same
    generator state) and decides on the device whether the policy feeds it, with the host path's arithmetic on the
    same values (:class:`_ChainRuleOnDevice`: the top-1 of the row it was drawn from against ``threshold``, its
    path's draft probability against ``min_path_prob``, or the acceptance model's network and rule). It is fed
    whatever the decision, so no level waits for the host. The host reads once, after node ``l``, the *look*:

    * a chain that stopped by then is cut at its stop: the host path's tree, node for node (the nodes fed after the
      stop cost forwards, not law);
    * a chain that has not is drafted to the policy's depth, without another read: every node of it was drawn from
      the draft's rows, so it is verified whole.

    That is the tree the host path grows with the policy :class:`~adaptive_spec.trees.policy.LookedChain` ``(policy,
    l)``, whose law the exact tests check for every verifier of policy chains. The look comes from the past steps of
    the same policy in the request (``runner.chain_look``; a request's runner starts without, so a seed gives the
    same tokens): the deepest of the last :data:`LOOK_HISTORY` stops, a chain that went past its look counting as
    a stop one deeper (a look past the stop costs the forwards in between; a look before it, the forwards to the
    depth, whose nodes may be accepted).
    """
    G, p, base, device = policy.depth, root.pending, root.base, runner.device
    stops, look = _look(runner, policy, G - 1)
    positions = torch.arange(base + p - 1, base + p + G - 1, device=device)  # node d's position, d = 1 .. G
    rows, drawn, fed = [root.probs[-1:]], [], []  # fed[d]: BoolTensor[1], whether the policy feeds node d + 1
    marks = []  # the draft cache before each level's forward
    rule = _ChainRuleOnDevice(policy, device, temperature)
    for d in range(G):
        drawn2d = draw_tokens(rows[-1], 1, generator, greedy=deterministic)  # [1, 1]
        token = drawn2d[:, 0]  # [1]
        drawn.append(token)
        if d + 1 == G:  # node G is a leaf whatever the rule
            break
        if d < look:  # nodes 1 .. look: the policy's decisions (past the look every node is fed)
            feeds = rule(d + 1, rows[-1], drawn2d)
            fed.append(feeds if d == 0 else fed[-1] & feeds)  # fed once every node before it was
        if d + 1 == look:  # the one read: how many of nodes 1 .. look the policy fed (a stop: fewer than all)
            n_fed = int(torch.cat(fed).sum().item())  # item: one op where tolist dispatches two
            if n_fed < look:  # stopped at node n_fed + 1: the host path's chain
                s = n_fed + 1
                stops.append(s)
                if s - 1 < len(marks):  # nodes fed from the stop on: their rows go
                    runner.undo_block(marks[s - 1])
                return _chain_outcome(root, policy.shape, rows[:s], drawn[:s], device, s, depth=s)
        if d < look:  # past the look nothing is undone
            marks.append(runner.block_mark())
        logits = runner.block_forward(token, positions[d + 1 : d + 2], None, logits_to_keep=1)
        rows.append(probs_fn(logits))
    if G > 1:
        stops.append(look + 1)  # the stop is deeper than the look (unknown: not read)
    return _chain_outcome(root, policy.shape, rows, drawn, device, G, depth=G)


def captured_policy_chain(
    runner: ModelRunner,
    pending: torch.Tensor,
    policy: ChainRule,
    probs_fn: ProbsFn,
    generator: torch.Generator,
    greedy: bool,
    temperature: float = 1.0,
) -> DraftOutcome | None:
    """A policy chain (``conf-chain``, ``cum-chain``, ``learned-chain``) drafted to its depth in one replay of the
    chain's graph (:func:`captured_chain`), then cut at the policy's own stop: one host read. None: drafted level by
    level (no graph for it).

    Every node's decision is made after the replay, on the device, from the rows and tokens it returns, by the
    arithmetic of the level-by-level drafter (:class:`_ChainRuleOnDevice`, over the whole chain at once); the one
    read is how many leading nodes the policy feeds, and the rows the replay fed past the stop are dropped from the
    draft cache. The look is the deepest (``depth - 1``): this is the host path's chain of the policy itself,
    node for node (``LookedChain(policy, depth - 1)`` is the policy), whose law the exact tests check. Its cost is the
    chain's forwards to the depth, a replay's worth; the generator gives the chain's ``depth`` uniforms each step, where
    it stops or not.
    """
    G, base = policy.depth, runner.cached
    captured = captured_chain(runner, pending, G, probs_fn, generator, greedy)
    if captured is None:
        return None
    tokens, rows, ok = captured
    root = DraftRoot(int(pending.numel()), base, rows[:1], ok)
    s = G  # the chain's depth: nodes 1 .. s - 1 fed, node s a leaf
    if G > 1:
        feeds = _ChainRuleOnDevice(policy, runner.device, temperature)(1, rows[: G - 1], tokens[: G - 1, None])
        s = int(feeds.cumprod(0).sum().item()) + 1  # the one read: a stop at the first node the policy does not feed
        stops, _ = _look(runner, policy, G - 1)
        stops.append(s)  # the stop itself, known (a level-by-level chain after this one looks that deep)
        if s < G:
            runner.cut_block(root.pending + s - 1)
    return _chain_outcome(root, policy.shape, [rows[:s]], [tokens[:s]], runner.device, s, depth=s)


def _look(
    runner: ModelRunner, policy: DraftPolicy, deepest: int, least: int = 1, first: int = FIRST_LOOK
) -> tuple[collections.deque, int]:
    """The policy's last stops in this request (``runner.chain_look``, appended to by the caller) and the look they
    choose: the deepest of them, ``first`` before any, within ``least .. deepest`` (at least ``least``).
    """
    stops = runner.chain_look.setdefault(str(policy), collections.deque(maxlen=LOOK_HISTORY))
    return stops, max(least, min(max(stops, default=first), deepest))


class _ChainRuleOnDevice:
    """A policy chain's feed rule on the device, node after node: the host path's arithmetic on the same values
    (float64 from the rows' float32, as its read brings them; :class:`~adaptive_spec.trees.policy.NodeView`).
    """

    def __init__(self, policy: DraftPolicy, device: torch.device, temperature: float) -> None:
        self.policy, self.temperature = policy, float(temperature)
        self.path = None  # the path's draft probability (float64 [1])
        if isinstance(policy, LearnedChain):
            self.net = _learned_net(policy.predictor.device_layers(device), policy.depth, self.temperature)
            self.accept, self.expected = None, None  # the path's predicted acceptance, the expected tokens so far

    def __call__(self, depth: int, row: torch.Tensor, token: torch.Tensor) -> torch.Tensor:
        """BoolTensor[k]: whether the policy feeds the ``k`` nodes at depths ``depth .. depth + k - 1`` of one chain
        (their tokens ``token`` [k, 1] drawn from the rows ``row`` [k, V]), each as if fed node by node after the ones
        before it: a level's one node (the level-by-level drafter's calls) or a whole captured chain's
        (:func:`captured_policy_chain`).
        """
        policy = self.policy
        if isinstance(policy, ConfidenceChain):
            return row.amax(-1).double() >= policy.threshold
        if isinstance(policy, CumulativeChain):
            self.path = _running(self.path, row.gather(-1, token)[:, 0].double(), product=True)
            return self.path >= policy.min_path_prob
        return self._learned(depth, row, token)

    def _learned(self, depth: int, row: torch.Tensor, token: torch.Tensor) -> torch.Tensor:
        """``learned-chain``: acceptance_row's features, the acceptance model's network, LearnedChain.feed's rule.

        The features' constant columns (the depth, the temperature) are folded into the first layer's bias, one
        row per depth (:func:`_learned_net`); the others go in as ``[q, top-1, entropy, path]`` with the logs taken
        where the features are logs.
        """
        net, k = self.net, row.shape[0]
        ent = torch.special.entr(row).sum(-1, keepdim=True)
        x = torch.cat([row.gather(-1, token), row.amax(-1, keepdim=True), ent], dim=1).double()  # q, top-1
        self.path = _running(self.path, x[:, :1], product=True)  # [k, 1]
        x = torch.cat([x, self.path], dim=1)
        h = torch.where(net.logs, x.clamp_min(PROB_FLOOR).log(), x)  # [k, 4]: log q, top-1, entropy, log path
        first = net.first[depth] if k == 1 else torch.cat(net.first[depth : depth + k])
        h = torch.addmm(first, h, net.weights[0])
        for W, b in zip(net.weights[1:], net.biases, strict=True):
            h = torch.addmm(b, h.clamp_min_(0.0), W)
        a, b = torch.sigmoid(h).unbind(1)  # [k] each
        self.accept = _running(self.accept, a, product=True)
        self.expected = _running(1.0 if self.expected is None else self.expected, self.accept, product=False)
        rho = float(self.policy.cost_ratio)  # feed: accept · b · (1 + ρ · depth) > expected · ρ, i.e.
        if k == 1:  # E − a·b·k/ρ < 0
            return torch.addcmul(self.expected, self.accept, b, value=-(1.0 + rho * depth) / rho) < 0.0
        scale = torch.arange(depth, depth + k, dtype=a.dtype, device=a.device).mul_(rho).add_(1.0).div_(-rho)
        return torch.addcmul(self.expected, self.accept * scale, b) < 0.0


def _running(before: torch.Tensor | float | None, x: torch.Tensor, product: bool) -> torch.Tensor:
    """The running product (else sum) of ``x`` [k, ...] along its first dim, continuing from ``before`` (a tensor
    whose last entry it continues, a number, or None: from ``x``'s first), each entry after the one before it, as a
    node-by-node loop takes them.
    """
    if x.shape[0] == 1:  # one node: the level-by-level drafter's call
        if before is None:
            return x
        last = before[-1:] if isinstance(before, torch.Tensor) and before.shape[0] > 1 else before
        return last * x if product else last + x
    if before is not None:
        first = before[-1:] if isinstance(before, torch.Tensor) else torch.full_like(x[:1], before)
        return _running(None, torch.cat([first, x]), product)[1:]
    return x.cumprod(0) if product else x.cumsum(0)


@dataclass(frozen=True)
class _LearnedNet:
    """An acceptance model's layers for :meth:`_ChainRuleOnDevice._learned` (float64, on the device)."""

    first: list[torch.Tensor]  # per depth 0 .. D: the first layer's bias with the depth and temperature columns in
    weights: list[torch.Tensor]  # per layer, W transposed ([in, out]); the first's rows for the 4 other features
    biases: list[torch.Tensor]  # the other layers' biases
    logs: torch.Tensor  # bool [1, 4]: which of q, top-1, entropy, path go in as logs
    layers: list  # the model's device layers, kept alive with their id as the cache's key


_LEARNED_NETS: dict[tuple[int, float], _LearnedNet] = {}


def _learned_net(layers: list[tuple[torch.Tensor, torch.Tensor]], depth: int, temperature: float) -> _LearnedNet:
    """The acceptance model's ``layers`` (:meth:`AcceptanceModel.device_layers`) arranged for chains of ``depth`` or
    less at ``temperature``, made once (a deeper chain makes them again): the columns of the features ``depth`` and
    ``temperature`` (ACCEPTANCE_FEATURES' first and last) times their values, added to the first layer's bias.
    """
    key = id(layers), temperature
    if key not in _LEARNED_NETS or len(_LEARNED_NETS[key].first) <= depth:
        if len(_LEARNED_NETS) > 64:
            _LEARNED_NETS.clear()
        (W0, b0), rest = layers[0], layers[1:]
        depths = torch.arange(depth + 1, dtype=W0.dtype, device=W0.device)
        first = (b0 + temperature * W0[:, -1]) + depths[:, None] * W0[:, 0]  # [D + 1, H]
        logs = (torch.arange(4, device=W0.device) % 3 == 0)[None]  # [[True, False, False, True]], no copy
        _LEARNED_NETS[key] = _LearnedNet(
            list(first[:, None].unbind()),
            [W0[:, 1:-1].t().contiguous(), *(W.t().contiguous() for W, _ in rest)],
            [b for _, b in rest],
            logs,
            layers,
        )
    return _LEARNED_NETS[key]


def delayed_on_slots(policy: DraftPolicy, device_path: bool = False) -> bool:
    """Whether :func:`draft_conf_delayed` grows ``policy``'s trees: a :class:`ConfidenceDelayed` with a budget that
    never cuts its paths, whose paths, once branched, go on unconditionally (``branch_threshold`` 0), or may stop
    (a ``branch_threshold``) on the device's path (``device_path``: an accelerator's, where the paths' stops are
    flags instead of reads; a CPU grows those on the host, where a read costs nothing and a slot past a stop
    costs its forward).
    """
    return (
        isinstance(policy, ConfidenceDelayed)
        and (policy.branch_threshold == 0.0 or device_path)
        and policy.paths > 1
        and policy.budget >= policy.depth * policy.paths
    )


def draft_conf_delayed(
    runner: ModelRunner,
    root: DraftRoot,
    policy: ConfidenceDelayed,
    probs_fn: ProbsFn,
    generator: torch.Generator,
    deterministic: bool,
    looked: bool = False,
) -> DraftOutcome:
    """A confident trunk read level by level, then the paths drafted into slots with no read.

    Along the trunk a fed node gets one child while its row's top-1 is at least the threshold: one host read per
    trunk node (its top-1 and the finite flag), the child drawn and fed as a chain's. The first node where it
    drops, at depth ``t < D``, gets ``paths`` i.i.d. draws, and from there (``branch_threshold`` 0, a budget of
    ``depth · paths``) each node gets as many draws as paths stand on it, to depth ``D``: the policy's law from
    there on is the static ``delayed(t, paths, D − t)`` shape's (``iid`` at ``t = 0``), drafted into its slots
    (:func:`_draft_slots`, the trunk as its first levels) with no host read. A trunk that stays confident to
    depth ``D`` is a chain. One read per trunk node instead of one read and one copy per level.

    ``looked`` (an accelerator: :func:`draft_policy_tree`): the trunk is decided on the device, its nodes drawn and
    fed without waiting, and read once, after ``l`` decisions (the *look*, from the past steps of the policy as a
    policy chain's, :func:`draft_chain_on_device`): a trunk that stopped by then branches where it stopped, one that
    did not branches at depth ``l``. That is the tree of
    :class:`~adaptive_spec.trees.policy.LookedDelayed` ``(policy, l)``, whose law the exact tests check.

    Paths that may stop (a ``branch_threshold``, the device's path only: :func:`delayed_on_slots`): a path node
    is fed only if the row its token was drawn from has a top-1 of at least the threshold, decided on the device
    level by level in the same slots (:func:`_draft_slots`), a stopped path's later draws flagged invalid: the
    policy's tree, with no read for the paths.
    """
    D, K, device = policy.depth, policy.paths, runner.device
    p, base = root.pending, root.base
    R, ok = root.probs[-1:], root.ok
    tokens, valid, rows = [], [], []
    _delayed_layouts(D, K, probs_fn.vocab_size, device)  # every trunk length's slots on the device, in one copy
    if looked:
        stops, look = _look(runner, policy, D - 1)
        going, marks = [], []  # per trunk decision: every decision so far confident (BoolTensor[1]); before each feed
        for j in range(look):  # decision j: trunk node j's row confident -> its one child, node j + 1
            confident = R.amax(-1).double() >= policy.threshold
            going.append(confident if j == 0 else going[-1] & confident)
            drawn, drawn_ok = draw_children(R, 1, generator, replace=False, greedy=deterministic)  # [1, 1]
            tokens.append(drawn[0])
            valid.append(drawn_ok[0])
            if j + 1 < D:  # fed, to be decided next (a node at depth D is a leaf)
                marks.append(runner.block_mark())
                pos = torch.full((1,), base + p + j, dtype=torch.long, device=device)
                logits = runner.block_forward(drawn[0], pos, None, logits_to_keep=1)
                R = probs_fn(logits)
                ok = ok & finite_flag(logits, R)
                rows.append(R)
        t, good = torch.stack([torch.cat(going).sum().double(), ok.double()]).tolist()  # the trunk's one read
        check_finite(good, "draft")
        t = int(t)  # the trunk branches at depth t: where it stopped, or at the look
        stops.append(t if t < look else look + 1)
        if t < len(marks):  # trunk nodes fed after the branch node: their rows go
            runner.undo_block(marks[t])
        tokens, valid, rows = tokens[:t], valid[:t], rows[:t]
    while not looked and len(tokens) < D:
        top1, good = torch.stack([R.max().double(), ok.double()]).tolist()  # the trunk node's one read
        check_finite(good, "draft")
        if top1 < policy.threshold:
            break
        drawn, drawn_ok = draw_children(R, 1, generator, replace=False, greedy=deterministic)  # [1, 1]
        tokens.append(drawn[0])
        valid.append(drawn_ok[0])
        if len(tokens) < D:  # fed, to be read next: one token attending to every row before it
            pos = torch.full((1,), base + p - 1 + len(tokens), dtype=torch.long, device=device)
            logits = runner.block_forward(drawn[0], pos, None, logits_to_keep=1)
            R = probs_fn(logits)
            ok = finite_flag(logits, R)
            rows.append(R)
    t = len(tokens)
    shape = TreeShape.delayed(t, K, D - t)
    if t == D:  # confident to the end: a chain
        return _chain_outcome(root, shape, [root.probs[-1:], *rows], tokens, device, decisions=t)
    layout = slot_layout(shape, probs_fn.vocab_size)
    trunk = tokens, valid, rows
    out = _draft_slots(runner, root, layout, probs_fn, generator, deterministic, trunk, policy.branch_threshold)
    out.policy_levels = t + 1  # the trunk's decisions: the rest is the static shape's
    return out


def captured_conf_delayed(
    runner: ModelRunner,
    pending: torch.Tensor,
    policy: ConfidenceDelayed,
    probs_fn: ProbsFn,
    generator: torch.Generator,
    greedy: bool,
) -> DraftOutcome | None:
    """A ``conf-delayed`` tree in two replays and one read: :func:`draft_conf_delayed`'s tree on an accelerator
    (``looked``), or None: drafted there (no graph for it).

    The trunk's graph (:func:`_trunk_core`) feeds the pending tokens and drafts the trunk to the look (the same look,
    from the same past steps), each node drawn as the level-by-level drafter draws it (the argmax at temperature 0,
    else the exponential race, a level a call) and every decision made on the device; the one read is the trunk's
    length ``t`` where it stopped (or the look) and the finite flag. The paths' graph then feeds the pending tokens
    and the ``t`` trunk tokens again as a chain (:func:`_replay_slots`, the tokens in its noise) and drafts the paths
    from the branch node as the static ``delayed(0, paths, depth - t)`` shape's slots, ``branch_threshold`` flagged
    on the device: the slots of ``delayed(t, paths, depth - t)`` after its trunk, in the same order, with the same
    draws. The second replay rewrites the first's rows with the same values, so the cache holds what the
    level-by-level drafter leaves.
    """
    D, K, vocab = policy.depth, policy.paths, probs_fn.vocab_size
    probs = runner.graph_probs(probs_fn)
    if probs is None or D < 2:
        return None
    stops, look = _look(runner, policy, D - 1)
    n, mark, state = int(pending.numel()), runner.block_mark(), generator.get_state()

    def make(d: int):
        return _trunk_core(runner, d, probs, greedy, policy.threshold), ((d, vocab), torch.float32), d

    def fill(noise: torch.Tensor) -> None:  # the race's exponentials, one call a level as the level-by-level drafter
        for j in range(look):
            noise[j : j + 1].exponential_(generator=generator)

    key = ("trunk", policy.threshold, probs_fn.graph_key(), greedy)
    out = runner.captured_draft(pending, look, key, make, None if greedy else fill, look)
    if out is None:
        return None
    tokens, valid, rows, count, ok = out
    t, good = torch.stack([count.double(), ok.double()]).tolist()  # the trunk's one read
    check_finite(good, "draft")
    t = int(t)  # the trunk branches at depth t: where it stopped, or at the look
    trunk = tokens[:t].clone()  # the next replay of the trunk's graph overwrites its outputs
    runner.undo_block(mark)
    paths = slot_layout(TreeShape.delayed(0, K, D - t), vocab)
    out = _replay_slots(runner, pending, paths, probs_fn, generator, greedy, trunk, policy.branch_threshold)
    if out is None:  # the paths' capture failed (logged): the whole tree drafted again, level by level
        generator.set_state(state)
        return None
    stops.append(t if t < look else look + 1)
    p_tokens, p_valid, p_rows, p_ok = out
    layout = slot_layout(TreeShape.delayed(t, K, D - t), vocab)
    ancestors, _ = layout.tensors(runner.device)
    all_tokens = torch.cat([p_tokens[:1], trunk, p_tokens[1:]])
    all_valid = torch.cat([p_valid[:1], valid[:t], p_valid[1:]])
    all_rows = torch.cat([rows[:t], p_rows])  # the root's and the trunk's but the branch node's, then the paths'
    outcome = _slots_outcome(layout, ancestors, all_tokens, all_valid, all_rows, p_ok & rows_ok(rows[:t]), n)
    outcome.policy_levels = t + 1  # the trunk's decisions: the rest is the static shape's
    return outcome


def _trunk_core(runner: ModelRunner, look: int, probs: ProbsFn, greedy: bool, threshold: float):
    """The function a ``conf-delayed`` trunk's graph records (:func:`captured_conf_delayed`): the pending rows'
    forward, then ``look`` decisions, each the row's top-1 against ``threshold`` and its node drawn and fed.
    Returns ``(tokens [look], valid [look], rows [look + 1, V] (the root's first), how many leading decisions were
    confident (0-dim), ok)``.
    """

    def core(ids, pos, mask, *extra, rows, last, noise):
        row, ok, r, p, hidden, cols = _graph_root(runner, probs, ids, pos, mask, extra, rows, last)
        out, tokens, valid, going = [row], [], [], []
        for j in range(look):
            confident = row.amax(-1).double() >= threshold
            going.append(confident if j == 0 else going[-1] & confident)
            drawn = _drawn_in_graph(row, 1, None if greedy else noise[j : j + 1])  # [1, 1]
            tokens.append(drawn[0])
            valid.append(row.gather(-1, drawn)[0] > 0)
            logits, hidden, r, p = _chain_step(runner, cols, drawn[0], r, p, hidden)
            row = probs(logits)
            ok = ok & finite_flag(logits, row)
            out.append(row)
        count = torch.cat(going).long().sum()
        return torch.cat(tokens), torch.cat(valid), torch.cat(out), count, ok

    return core


@functools.lru_cache(maxsize=64)
def _delayed_layouts(depth: int, paths: int, vocab: int, device: torch.device) -> None:
    """The slots of ``delayed(t, paths, d − t)`` for every trunk length ``t < d`` and every depth ``d <= depth`` (the
    policy's cuts near a request's end), put on ``device`` in one copy the first time a ``conf-delayed`` policy of
    that depth and width drafts there (the deepest first: a cut's slots are then slices of its, no copy).
    """
    shapes = [TreeShape.delayed(t, paths, d - t) for d in range(depth, 0, -1) for t in range(d)]
    layouts_to_device([slot_layout(shape, vocab) for shape in shapes], device)


def eagle_on_device(policy: DraftPolicy, vocab: int) -> bool:
    """Whether the device grows ``policy``'s trees: EAGLE-style, no wider than the vocabulary
    (:func:`draft_eagle_on_device` without replacement, :func:`draft_eagle_iid_on_device` with i.i.d. children).
    """
    return isinstance(policy, EagleTree) and policy.depth > 0 and policy.width <= vocab


def eagle_iid_slots(policy: EagleTree) -> list[int]:
    """Per level of an EAGLE-style tree with i.i.d. children, the most frontier nodes it can have: the rows its
    children are drawn from on the device (:func:`draft_eagle_iid_on_device`), and on the host too (the host path
    pads its rows to as many, so that both draw the same uniforms from one generator state).
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
    policy and device, with its depth cuts', :func:`_plan_with_cuts`).
    """
    return _plan_with_cuts(_EAGLE_PLANS, policy, device, _eagle_host, lambda _, h, part, d: _eagle_device(*h, part, d))


def _plan_with_cuts(cache: dict, policy: EagleTree, device: torch.device, host, build):
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

    The host path (:func:`draft_policy_tree`) feeds, per level, the ``top_k`` new nodes of highest path
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
    (the slot's ``early_pass`` on too): the tree before its read, a :class:`DeferredTree` whose ``finish`` gives one
    of the first two.

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
        tree = _TreeInGraph(runner, probs, ids, pos, mask, extra, rows, last)

        def forward(depth: int, tokens: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
            return tree.level(tokens, allowed, (tree.p0 + depth).expand(tokens.numel()))

        def draw(rows_: torch.Tensor, depth: int) -> torch.Tensor:
            start = offsets[depth - 1]
            return _drawn_in_graph(rows_, width, None if greedy else noise[start : start + rows_.shape[0]])

        g = eagle_grow(plan, tree.root, tree.ok, probs, forward, draw)
        return g.tokens, g.parents, g.fed, g.rows, g.ancestors, g.ok, g.bad

    return core


class QueuedRead:
    """A device tensor's values brought to the host behind the work queued so far, without waiting for what is
    queued after: on CUDA a copy into pinned memory and an event, so that the work queued next (the target's pass)
    runs while the host waits for the copy and reads it (:meth:`tolist`); elsewhere the values are read then.
    The pinned memory comes from torch's caching host allocator, which keeps a block from reuse until its copy ends.
    """

    def __init__(self, values: torch.Tensor) -> None:
        self._values, self._event = values, None
        if values.device.type == "cuda":
            self._values = torch.empty(values.shape, dtype=values.dtype, pin_memory=True)
            self._values.copy_(values, non_blocking=True)
            self._event = torch.cuda.Event()
            self._event.record(torch.cuda.current_stream(values.device))  # the copy's stream (its device's)

    def tolist(self) -> list:
        """The values, as ``Tensor.tolist`` gives them (waiting for the copy only, on CUDA)."""
        if self._event is not None:
            self._event.synchronize()
        return self._values.tolist()


@dataclass(frozen=True)
class DeferredTree:
    """A tree grown on the device whose one host read waits until the target's pass over it is queued
    (:func:`captured_eagle_tree` with ``defer``; the engine's step). The pass needs only the tensors here, so on a GPU
    the read and the host's work on the tree overlap the pass instead of leaving the GPU idle before it.

    ``finish()`` reads it: the :class:`DraftOutcome`, or the policy when a drawn child had probability 0, which
    ``redraw(policy)`` then draws on the host (:func:`draft_policy_tree` sets it). :meth:`read` does both.
    """

    tokens: torch.Tensor  # [N] the nodes' tokens (the root's -1), on the device
    depths: torch.Tensor  # [N] their depths
    ancestors: torch.Tensor  # [N, N] bool
    num_nodes: int
    finish: Callable[[], DraftOutcome | EagleTree]
    redraw: Callable[[EagleTree], DraftOutcome] | None = None

    def read(self) -> tuple[DraftOutcome, bool]:
        """``(the outcome, whether it was drawn again on the host)``: then the target's pass was over another tree."""
        out = self.finish()
        if isinstance(out, DraftOutcome):
            return out, False
        return self.redraw(out), True


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
    read, queued earlier (:class:`DeferredTree`), else made here.
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
    """The plan of ``policy`` on ``device`` (made once, with its depth cuts', :func:`_plan_with_cuts`)."""
    return _plan_with_cuts(_IID_PLANS, policy, device, _iid_host, lambda c, h, part, d: _iid_device(c, *h, part, d))


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

    The host path (:func:`draft_policy_tree`) gives each fed node ``width`` i.i.d. draws within the budget (spent
    in frontier order), merges a node's draws by token into its children (in the order of first appearance) and
    feeds the ``top_k`` new nodes of highest path probability (ties: the first made), in the order made. How many
    distinct children the draws give is not known in advance, so each level here has its most frontier rows
    (:func:`eagle_iid_slots`): the first are the fed nodes, the others padding rows that are fed to the draft too
    (attending to the root; their rows are never read) and whose draws are invalid. Node numbers, budget, merges
    and the choice of the fed nodes are computed on the device with the host path's arithmetic (float64 path
    probabilities, a stable sort), by the torch code (:class:`_IidTorch`) or, where the fused kernels run, a launch
    a level (:class:`_IidFused`); the host path draws on as many rows (it pads its rows likewise), so from one
    generator state both grow the same tree.

    The levels whose nodes the same policy without replacement feeds are fed here for sure (duplicates only save
    budget); after them, whether any node is fed depends on the merges, which the host does not wait for. The tree is
    grown to level ``l``, the *look*, and read once: it is the host path's tree of ``policy.truncated(l)``. The look
    comes from the past trees of the same policy in the request (``runner.chain_look``, as a policy chain's,
    :func:`_look`): the deepest of the last :data:`LOOK_HISTORY` trees, a tree cut at its look (nodes were fed there)
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
    stops, look = _look(runner, policy, policy.depth, least=plan.certain + 1, first=plan.certain + 1)
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
    (:meth:`~.runner.ModelRunner.level_forward`, through :class:`_TreeInGraph`), and the draws as
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
    stops, look = _look(runner, policy, policy.depth, least=full.certain + 1, first=full.certain + 1)
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
        tree = _TreeInGraph(runner, probs, ids, pos, mask, extra, rows, last)
        grow = _IidTorch(plan, policy, tree.root.device, 0)  # the pending rows: every node sees them (the tree's own)
        R, fed_rows, level_logits, start = tree.root, [tree.root], [], 0
        for d in range(1, depth + 1):
            f = plan.slots[d - 1]
            if race:
                cand = _drawn_in_graph(R, 1, noise[start : start + f])
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


def _level_candidates(
    R: torch.Tensor, K: int, without_replacement: bool, generator: torch.Generator, greedy: bool, ok: torch.Tensor
) -> tuple[torch.Tensor, list[float], list[float], list[float], list[float]]:
    """``K`` candidate children per frontier row (LongTensor[F, K] on the device, and as host values), their draft
    probabilities, and the rows' entropy and top-1.

    One host sync for the level (it also checks that the rows were finite).
    """
    F = R.shape[0]
    cand = draw_tokens(R, K, generator, replace=not without_replacement, greedy=greedy)  # [F, K]
    cand_q = R.gather(-1, cand)  # [F, K]
    ent = torch.special.entr(R).sum(-1, keepdim=True)  # [F, 1]: -sum p log p, with 0 log 0 = 0
    top1 = R.max(dim=-1, keepdim=True).values  # [F, 1]
    # the level's one host sync, a row per frontier node: cat promotes the values and the flag to float64
    host = torch.cat([cand.double(), cand_q, ent, top1, ok.expand(F, 1)], dim=1).tolist()  # [F][2K + 3]
    check_finite(host[0][-1], "draft")
    return (
        cand,
        [v for row in host for v in row[:K]],
        [v for row in host for v in row[K : 2 * K]],
        [row[2 * K] for row in host],
        [row[2 * K + 1] for row in host],
    )


class _PolicyGrowth:
    """A policy-grown tree in progress: its nodes, their views, the budget and the feed order."""

    def __init__(
        self,
        policy: DraftPolicy,
        vocab: int,
        device: torch.device,
        temperature: float,
        features: Mapping[str, float] | None,
        sampler: TorchSampler,
    ) -> None:
        self.policy, self.vocab, self.device, self.sampler = policy, vocab, device, sampler
        self.temperature, self.features = temperature, features
        self.b = _Builder()
        self.views: dict[int, NodeView] = {}
        self.cache_rows = {0: 0}  # fed node -> offset after the root in the draft cache (feed order)
        self.fed_order = [0]
        self.budget = policy.budget
        self.K = 1 if policy.law is DraftLaw.DYNAMIC_CHAIN else max(1, min(policy.max_width, vocab))
        self.chain = policy.law is DraftLaw.DYNAMIC_CHAIN  # one node per level: its inputs are built on the device
        self.chain_tokens: list[torch.Tensor] = []  # a chain's nodes' tokens after the root, on the device
        self.levels, self.decision_s = 0, 0.0

    def context(self) -> PolicyContext:
        return PolicyContext(self.budget, self.temperature, self.features)

    def expand(
        self, frontier: list[int], c_tok: list[float], c_q: list[float], f_ent: list[float], f_top: list[float]
    ) -> list[int]:
        """The policy's widths for the fed frontier, then the children they pick from the candidates; the new nodes."""
        t0 = time.perf_counter()
        fv = []
        for i, n in enumerate(frontier):
            v = self.views.get(n)
            if v is None:  # the root
                v = self.views[n] = NodeView(0, -1, -1, 0, 1.0, 1.0, f_ent[i], f_top[i])
            v.entropy, v.top1 = f_ent[i], f_top[i]
            fv.append(v)
        if isinstance(self.policy, ChainRule):  # one child per fed node: no call needed
            widths = [1] * len(fv)
        else:
            widths = clip_widths(self.policy, fv, self.policy.widths(fv, self.context(), self.sampler), self.budget)
        self.decision_s += time.perf_counter() - t0
        self.levels += 1
        new: list[int] = []
        for i, (v, k) in enumerate(zip(fv, widths, strict=True)):
            if k > 0:
                self.budget -= k
                new += self._children(v, c_tok[i * self.K : i * self.K + k], c_q[i * self.K :], f_ent[i], f_top[i])
        return new

    def _children(self, v: NodeView, toks: list[float], qs: list[float], ent: float, top1: float) -> list[int]:
        """Node ``v``'s drawn children (merged by token, in draw order) with their views."""
        b, first, index, q_of = self.b, len(self.b.tokens), {}, {}
        for j, tok in enumerate(map(int, toks)):
            if qs[j] <= 0.0:  # zero-probability tokens are never drawn (they sort last in a top-k)
                break
            child = index.get(tok)
            if child is None:
                child = index[tok] = b.new_node(v.node, tok)
                q_of[child] = qs[j]
            b.child_draws[v.node].append(child)
        draws = b.child_draws[v.node]
        for c in range(first, len(b.tokens)):
            self.views[c] = NodeView(
                c,
                v.node,
                b.tokens[c],
                v.depth + 1,
                q_of[c],
                v.path_prob * q_of[c],
                ent,
                top1,
                multiplicity=draws.count(c),
                parent_draws=len(draws),
                branched=v.branched or len(draws) > 1,
                parent_memo=v.memo,
            )
        return list(range(first, len(b.tokens)))

    def feed(self, new: list[int]) -> list[int]:
        """The policy's feed decisions on the new nodes: those to run through the draft (recorded in feed order)."""
        t0 = time.perf_counter()
        nv = [self.views[c] for c in new]
        feed = self.policy.feed(nv, self.context(), self.sampler)
        if len(feed) != len(nv):
            raise ValueError(f"{type(self.policy).__name__}.feed returned {len(feed)} values for {len(nv)} nodes")
        frontier = [v.node for v, f in zip(nv, feed, strict=True) if f and v.depth < self.policy.depth]
        self.decision_s += time.perf_counter() - t0
        for c in frontier:
            self.cache_rows[c] = len(self.fed_order)
            self.fed_order.append(c)
        return frontier

    def outcome(self, rows: list[torch.Tensor], pending: int) -> DraftOutcome:
        b, n, fed = self.b, len(self.b.tokens), len(self.fed_order)  # rows: one per fed node, in feed order
        if self.chain:  # fed in node order: the rows, then the leaves' zeros
            probs = torch.cat([*rows[:fed], rows[0].new_zeros(n - fed, self.vocab)])
        else:
            probs = torch.zeros(n, self.vocab, dtype=rows[0].dtype, device=self.device)
        tree = DraftTree(b.tokens, b.parents, b.depths, probs, b.child_draws, self.policy.shape)
        if self.chain:  # nodes 0 .. n - 1 in a line, fed in that order: a chain's cached tensors, no copy
            no_token, parents_t, depths_t, children, ancestors = _chain_tensors(n - 1, self.device)
            tokens_t = torch.cat([no_token, *self.chain_tokens])
            tree.keep_tensors(children=children)
        else:
            # the fed rows' places, the tokens, parents and depths (for the target's block and the verifiers), the
            # ancestor matrix and the children table (traversal's levels on an accelerator), in one copy
            # (and i.i.d. draws' table: SpecInfer's candidates on an accelerator)
            kids = tree.children_rows()
            draws = tree.draws_rows() if self.policy.law is DraftLaw.DYNAMIC_IID else []
            lists = np.array([*self.fed_order, *b.tokens, *b.parents, *b.depths], dtype=np.int64)
            tables = np.array([c for row in kids + draws for c in row], dtype=np.int64)
            host = np.concatenate([lists, b.ancestor_matrix().reshape(-1), tables])
            most = len(draws[0]) if draws else 0
            fed_t, tokens_t, parents_t, depths_t, anc, kids_t, draws_t = torch.tensor(host, device=self.device).split(
                [fed, n, n, n, n * n, n * len(kids[0]), n * most]
            )
            probs[fed_t] = torch.cat(rows[:fed])
            ancestors = anc.view(n, n).bool()
            tree.keep_tensors(children=kids_t.view(n, -1))
            if most:
                tree.keep_tensors(draws=draws_t.view(n, most))
        tree.keep_tensors(tokens=tokens_t, parents=parents_t, depths=depths_t, ancestors=ancestors)
        return DraftOutcome(tree, ancestors, pending, fed, self.cache_rows, self.levels, self.decision_s)
