"""Trees grown by a drafting policy (:mod:`adaptive_spec.trees.policy`): :func:`draft_policy_tree` takes the
device path a policy has (:mod:`.chains`, :mod:`.delayed`, :mod:`.eagle_tree`, :mod:`.eagle_iid`), else grows the
tree on the host, one read a level (:class:`_PolicyGrowth`), as every policy does on a CPU, where a read costs
nothing.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping

import numpy as np
import torch

from adaptive_spec.engine import draft_kernels
from adaptive_spec.engine.drafting.base import DeferredTree, DraftOutcome, DraftRoot, check_finite, draft_root
from adaptive_spec.engine.drafting.chains import captured_policy_chain, chain_on_device, draft_chain_on_device
from adaptive_spec.engine.drafting.delayed import captured_conf_delayed, delayed_on_slots, draft_conf_delayed
from adaptive_spec.engine.drafting.eagle_iid import captured_eagle_iid_tree, draft_eagle_iid_on_device
from adaptive_spec.engine.drafting.eagle_tree import (
    captured_eagle_tree,
    draft_eagle_on_device,
    eagle_iid_slots,
    eagle_on_device,
)
from adaptive_spec.engine.drafting.static import chain_tensors
from adaptive_spec.engine.logits import ProbsFn, finite_flag
from adaptive_spec.engine.runner import ModelRunner
from adaptive_spec.rng import TorchSampler, accelerator_path
from adaptive_spec.trees import DraftLaw, DraftTree
from adaptive_spec.trees.draw import draw_tokens
from adaptive_spec.trees.policy import (
    ChainRule,
    DraftPolicy,
    EagleTree,
    NodeView,
    PolicyContext,
    clip_widths,
)
from adaptive_spec.trees.tree import unpack_masks


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

    ``deferred``: the caller takes a :class:`~.base.DeferredTree` (an EAGLE-style tree without replacement grown in one
    replay, its read left until the target's pass is queued; the engine's step).

    A chain whose stop rule is device arithmetic (``conf-chain``, ``cum-chain``, ``learned-chain``) is decided on
    the device with at most one host read, on an accelerator (:func:`~.chains.draft_chain_on_device`; ``on_device=True``
    takes that path on a CPU too, ``False`` the host path). An EAGLE-style policy is decided on the device, with
    one host read for the whole tree without replacement (:func:`~.eagle_tree.draft_eagle_on_device`) and usually with
    i.i.d. children too, on an accelerator
    (:func:`~.eagle_iid.draft_eagle_iid_on_device`; ``on_device=False`` forces the host path below, and
    the runner's ``device_policy`` turns it off for a run after a step had to redo its tree). A
    ``conf-delayed`` policy whose paths go on once branched reads its trunk, then drafts the paths into
    slots (:func:`~.delayed.draft_conf_delayed`; ``on_device=False`` forces the host path here too). Any other
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
    args = (probs_fn, generator, deterministic)
    if runner.captures_drafts and not isinstance(pending, DraftRoot):  # the whole tree in one replay
        kw = {"temperature": temperature, "features": features, "deferred": deferred}
        outcome = _in_one_replay(runner, pending, policy, *args, on_device, bool(device_path), **kw)
        if isinstance(outcome, (DraftOutcome, DeferredTree)):
            return outcome
        if outcome is not None:  # a drawn child of probability 0: the host path below, from the same generator state
            policy, on_device = outcome, False  # the policy itself, or an i.i.d. tree's cut at its look
    root = pending if isinstance(pending, DraftRoot) else draft_root(runner, pending, probs_fn)
    if device_path and chain_on_device(policy):
        return draft_chain_on_device(runner, root, policy, *args, temperature)
    if on_device is not False and delayed_on_slots(policy, bool(device_path)):
        return draft_conf_delayed(runner, root, policy, *args, bool(device_path))
    outcome = _eagle_level_by_level(runner, root, policy, *args, on_device)
    if isinstance(outcome, DraftOutcome):
        return outcome
    return _grow_on_host(runner, root, outcome, *args, temperature, features)


def _in_one_replay(
    runner: ModelRunner,
    pending: torch.Tensor,
    policy: DraftPolicy,
    probs_fn: ProbsFn,
    generator: torch.Generator,
    deterministic: bool,
    on_device: bool | None,
    device_path: bool,
    *,
    temperature: float,
    features: Mapping[str, float] | None,
    deferred: bool,
) -> DraftOutcome | DeferredTree | EagleTree | None:
    """:func:`draft_policy_tree`'s paths that draft the whole tree in one captured replay (the runner captures drafts,
    the pending tokens not fed yet): an EAGLE-style tree (i.i.d. children: where the device drafter would grow it, an
    accelerator's path), a policy chain, a ``conf-delayed`` tree (a trunk's replay, then the paths'). The outcome;
    the policy to grow on the host when a drawn child had probability 0 (an i.i.d. tree's cut at its look), the
    generator and the draft's block put back; None when no replay drafts it.
    """
    args = (probs_fn, generator, deterministic)
    tree_on_device = on_device is not False and runner.device_policy and eagle_on_device(policy, probs_fn.vocab_size)
    if tree_on_device and (policy.without_replacement or accelerator_path(runner.device)):
        state, mark = generator.get_state(), runner.block_mark()
        grow = captured_eagle_tree if policy.without_replacement else captured_eagle_iid_tree
        defer = {"defer": True} if deferred and policy.without_replacement else {}
        outcome = grow(runner, pending, policy, *args, **defer)
        if isinstance(outcome, DeferredTree):  # a child of probability 0 is drawn again on the host, after the pass

            def redraw(back: EagleTree) -> DraftOutcome:
                generator.set_state(state)
                runner.undo_block(mark)
                runner.device_policy = False
                kw = {"temperature": temperature, "features": features, "on_device": False}
                return draft_policy_tree(runner, pending, back, *args, **kw)

            return dataclasses.replace(outcome, redraw=redraw)
        if outcome is not None and not isinstance(outcome, DraftOutcome):  # the host path's, from the same state
            generator.set_state(state)
            runner.undo_block(mark)
            runner.device_policy = False
        return outcome
    if device_path and chain_on_device(policy):
        return captured_policy_chain(runner, pending, policy, *args, temperature)
    if device_path and on_device is not False and delayed_on_slots(policy, True):
        return captured_conf_delayed(runner, pending, policy, *args)
    return None


def _eagle_level_by_level(
    runner: ModelRunner,
    root: DraftRoot,
    policy: DraftPolicy,
    probs_fn: ProbsFn,
    generator: torch.Generator,
    deterministic: bool,
    on_device: bool | None,
) -> DraftOutcome | DraftPolicy:
    """An EAGLE-style tree grown on the device a forward a level, with one host read
    (:func:`~.eagle_tree.draft_eagle_on_device`, :func:`~.eagle_iid.draft_eagle_iid_on_device`), where
    :func:`draft_policy_tree` takes that path: the outcome, else the policy to grow on the host (another policy; or a
    drawn child had probability 0, and then the generator and the draft's block are put back and the policy is the one
    the device drafted: an i.i.d. tree's cut at its look).
    """
    if on_device is None:
        on_device = runner.device_policy and eagle_on_device(policy, probs_fn.vocab_size)
        # i.i.d. children: the device pads its levels and writes every candidate; a CPU, where a read costs nothing,
        # grows the tree faster on the host
        on_device = on_device and (policy.without_replacement or accelerator_path(runner.device))
    if not on_device:
        return policy
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
    # A drawn child had probability 0: the tree the host path grows differs from the one drafted. Draw it again on the
    # host from the same generator state: the draws agree up to there, so the tree is the host path's
    generator.set_state(state)
    runner.undo_block(mark)
    runner.device_policy = False  # rows with zeros (a top-k or top-p processor): the rest of the run on the host
    return outcome


def _grow_on_host(
    runner: ModelRunner,
    root: DraftRoot,
    policy: DraftPolicy,
    probs_fn: ProbsFn,
    generator: torch.Generator,
    deterministic: bool,
    temperature: float,
    features: Mapping[str, float] | None,
) -> DraftOutcome:
    """:func:`draft_policy_tree`'s host path: the policy decides a level at a time, one host read a level."""
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
            no_token, parents_t, depths_t, children, ancestors = chain_tensors(n - 1, self.device)
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
