"""``conf-delayed`` trees: a confident trunk, read level by level on a CPU and once at its look on an
accelerator, then the paths after the branch point drafted into a static shape's slots (:func:`draft_conf_delayed`),
or both stages in two captured replays (:func:`captured_conf_delayed`).
"""

from __future__ import annotations

import functools

import torch

from adaptive_spec.engine.drafting.base import DraftOutcome, DraftRoot, check_finite
from adaptive_spec.engine.drafting.chains import look_level
from adaptive_spec.engine.drafting.static import (
    chain_outcome,
    chain_step,
    draft_slots,
    drawn_in_graph,
    graph_root,
    replay_slots,
    slots_outcome,
)
from adaptive_spec.engine.logits import ProbsFn, finite_flag, rows_ok
from adaptive_spec.engine.runner import ModelRunner
from adaptive_spec.trees import TreeShape
from adaptive_spec.trees.draw import draw_children
from adaptive_spec.trees.policy import (
    ConfidenceDelayed,
    DraftPolicy,
)
from adaptive_spec.trees.slots import layouts_to_device, slot_layout


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
    (:func:`~.static.draft_slots`, the trunk as its first levels) with no host read. A trunk that stays confident to
    depth ``D`` is a chain. One read per trunk node instead of one read and one copy per level.

    ``looked`` (an accelerator: :func:`~.policy.draft_policy_tree`): the trunk is decided on the device, its nodes drawn
    and fed without waiting, and read once, after ``l`` decisions (the *look*, from the past steps of the policy as a
    policy chain's, :func:`~.chains.draft_chain_on_device`): a trunk that stopped by then branches where it stopped, one
    that did not branches at depth ``l``. That is the tree of
    :class:`~adaptive_spec.trees.policy.LookedDelayed` ``(policy, l)``, whose law the exact tests check.

    Paths that may stop (a ``branch_threshold``, the device's path only: :func:`delayed_on_slots`): a path node
    is fed only if the row its token was drawn from has a top-1 of at least the threshold, decided on the device
    level by level in the same slots (:func:`~.static.draft_slots`), a stopped path's later draws flagged invalid: the
    policy's tree, with no read for the paths.
    """
    D, K, device = policy.depth, policy.paths, runner.device
    _delayed_layouts(D, K, probs_fn.vocab_size, device)  # every trunk length's slots on the device, in one copy
    grown = _Trunk(runner, root, policy, probs_fn, generator, deterministic)
    trunk = grown.looked() if looked else grown.read()
    tokens, _, rows = trunk
    t = len(tokens)
    shape = TreeShape.delayed(t, K, D - t)
    if t == D:  # confident to the end: a chain
        return chain_outcome(root, shape, [root.probs[-1:], *rows], tokens, device, decisions=t)
    layout = slot_layout(shape, probs_fn.vocab_size)
    out = draft_slots(runner, root, layout, probs_fn, generator, deterministic, trunk, policy.branch_threshold)
    out.policy_levels = t + 1  # the trunk's decisions: the rest is the static shape's
    return out


class _Trunk:
    """:func:`draft_conf_delayed`'s trunk as it grows: its tokens, whether each was drawn validly, and the fed nodes'
    rows, each a list over the trunk's nodes; :meth:`looked` or :meth:`read` grows it.
    """

    def __init__(
        self,
        runner: ModelRunner,
        root: DraftRoot,
        policy: ConfidenceDelayed,
        probs_fn: ProbsFn,
        generator: torch.Generator,
        deterministic: bool,
    ) -> None:
        self.runner, self.root, self.policy, self.probs_fn = runner, root, policy, probs_fn
        self.generator, self.deterministic = generator, deterministic
        self.tokens: list[torch.Tensor] = []
        self.valid: list[torch.Tensor] = []
        self.rows: list[torch.Tensor] = []

    def looked(self) -> tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor]]:
        """Decided on the device and read once, at its look: ``(tokens, valid, rows)``, cut where it branches."""
        runner, D = self.runner, self.policy.depth
        R, ok = self.root.probs[-1:], self.root.ok
        stops, look = look_level(runner, self.policy, D - 1)
        going, marks = [], []  # per trunk decision: every decision so far confident (BoolTensor[1]); before each feed
        for j in range(look):  # decision j: trunk node j's row confident -> its one child, node j + 1
            confident = R.amax(-1).double() >= self.policy.threshold
            going.append(confident if j == 0 else going[-1] & confident)
            if j + 1 < D:  # its child fed, to be decided next (a node at depth D is a leaf)
                marks.append(runner.block_mark())
            R, fed_ok = self._child(R, j, j + 1 < D)
            ok = ok if fed_ok is None else ok & fed_ok
        t, good = torch.stack([torch.cat(going).sum().double(), ok.double()]).tolist()  # the trunk's one read
        check_finite(good, "draft")
        t = int(t)  # the trunk branches at depth t: where it stopped, or at the look
        stops.append(t if t < look else look + 1)
        if t < len(marks):  # trunk nodes fed after the branch node: their rows go
            runner.undo_block(marks[t])
        return self.tokens[:t], self.valid[:t], self.rows[:t]

    def read(self) -> tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor]]:
        """Read level by level, one host read a node: ``(tokens, valid, rows)``, as :meth:`looked`'s."""
        D = self.policy.depth
        R, ok = self.root.probs[-1:], self.root.ok
        while len(self.tokens) < D:
            top1, good = torch.stack([R.max().double(), ok.double()]).tolist()  # the trunk node's one read
            check_finite(good, "draft")
            if top1 < self.policy.threshold:
                break
            n = len(self.tokens)  # its child, node n + 1, fed to be read next unless it is a leaf
            R, ok = self._child(R, n, n + 1 < D)
        return self.tokens, self.valid, self.rows

    def _child(self, R: torch.Tensor, n: int, feed: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Trunk node ``n``'s one child, drawn from its row ``R``; with ``feed``, fed (one token attending to every
        row before it). ``(its row, whether its logits were finite)`` when fed, else ``(R, None)``.
        """
        drawn, drawn_ok = draw_children(R, 1, self.generator, replace=False, greedy=self.deterministic)  # [1, 1]
        self.tokens.append(drawn[0])
        self.valid.append(drawn_ok[0])
        if not feed:
            return R, None
        pos = torch.full((1,), self.root.base + self.root.pending + n, dtype=torch.long, device=self.runner.device)
        logits = self.runner.block_forward(drawn[0], pos, None, logits_to_keep=1)
        row = self.probs_fn(logits)
        self.rows.append(row)
        return row, finite_flag(logits, row)


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
    and the ``t`` trunk tokens again as a chain (:func:`~.static.replay_slots`, the tokens in its noise) and drafts the
    paths from the branch node as the static ``delayed(0, paths, depth - t)`` shape's slots, ``branch_threshold``
    flagged on the device: the slots of ``delayed(t, paths, depth - t)`` after its trunk, in the same order, with the
    same draws. The second replay rewrites the first's rows with the same values, so the cache holds what the
    level-by-level drafter leaves.
    """
    D, K, vocab = policy.depth, policy.paths, probs_fn.vocab_size
    probs = runner.graph_probs(probs_fn)
    if probs is None or D < 2:
        return None
    stops, look = look_level(runner, policy, D - 1)
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
    out = replay_slots(runner, pending, paths, probs_fn, generator, greedy, trunk, policy.branch_threshold)
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
    outcome = slots_outcome(layout, ancestors, all_tokens, all_valid, all_rows, p_ok & rows_ok(rows[:t]), n)
    outcome.policy_levels = t + 1  # the trunk's decisions: the rest is the static shape's
    return outcome


def _trunk_core(runner: ModelRunner, look: int, probs: ProbsFn, greedy: bool, threshold: float):
    """The function a ``conf-delayed`` trunk's graph records (:func:`captured_conf_delayed`): the pending rows'
    forward, then ``look`` decisions, each the row's top-1 against ``threshold`` and its node drawn and fed.
    Returns ``(tokens [look], valid [look], rows [look + 1, V] (the root's first), how many leading decisions were
    confident (0-dim), ok)``.
    """

    def core(ids, pos, mask, *extra, rows, last, noise):
        row, ok, r, p, hidden, cols = graph_root(runner, probs, ids, pos, mask, extra, rows, last)
        out, tokens, valid, going = [row], [], [], []
        for j in range(look):
            confident = row.amax(-1).double() >= threshold
            going.append(confident if j == 0 else going[-1] & confident)
            drawn = drawn_in_graph(row, 1, None if greedy else noise[j : j + 1])  # [1, 1]
            tokens.append(drawn[0])
            valid.append(row.gather(-1, drawn)[0] > 0)
            logits, hidden, r, p = chain_step(runner, cols, drawn[0], r, p, hidden)
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
