"""The labeller's forest: every maximal draft tree of one root context, drawn level by level.

Trees are drawn as *maximal* trees per family and cut down to every action of the family, which
keeps each action's drafting law exact:

* ``chain:L``: the first L tokens of one chain;
* ``iid:KxL`` / ``delayed:TxKxB``: the trunk, then the first K of Kmax i.i.d. rollouts, each cut to
  B tokens (rollouts are i.i.d. and ordered; a rollout's prefix is a shorter rollout);
* ``wor:w1x..``: the first w_d children of each node (a prefix of a Gumbel-top-k draw is a
  Gumbel-top-w draw, Plackett-Luce);
* a chain drafting policy (any :class:`~adaptive_spec.trees.policy.ChainRule`): the policy is
  run along the drawn chain, on the same draft-side facts the engine's drafter gives it, and the
  chain is cut after the first node it does not feed (:func:`policy_chain_length`).

All maximal trees of all samples of one context form one forest under one root (the last
committed token): the draft model grows it level by level (one forward per depth for the whole
forest), drawing with the engine's own rule (:func:`~adaptive_spec.trees.draw.draw_children`).
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from dataclasses import dataclass, field

import torch

from adaptive_spec.engine.drafting import check_finite
from adaptive_spec.engine.logits import ProbsFn, finite_flag
from adaptive_spec.engine.runner import ModelRunner
from adaptive_spec.planner.plan import Plan
from adaptive_spec.trees import DraftLaw, DraftTree, TreeShape
from adaptive_spec.trees.draw import draw_children
from adaptive_spec.trees.policy import ChainRule, NodeView, PolicyContext, row_stats

__all__ = ["FamilyTree", "Forest", "cut_tree", "family_specs", "grow_forest", "policy_chain_length"]


@dataclass
class FamilyTree:
    """One maximal tree of the forest; node ids are forest ids (0 = the shared root).

    ``law``: :attr:`DraftLaw.CHAIN`, :attr:`DraftLaw.IID` / :attr:`DraftLaw.DELAYED` (i.i.d.
    rollouts, after a trunk for ``DELAYED``) or :attr:`DraftLaw.WITHOUT_REPLACEMENT`.
    """

    law: DraftLaw
    trunk: int = 0  # rollouts: trunk length T
    paths: int = 1  # rollouts: Kmax
    length: int = 0  # chain: L; rollouts: branch length Bmax
    widths: tuple[int, ...] = ()  # without replacement: max widths per depth
    trunk_nodes: list[int] = field(default_factory=list)
    walkers: list[list[int]] = field(default_factory=list)  # rollout: node ids along each rollout
    kids: dict[int, list[int]] = field(default_factory=lambda: defaultdict(list))  # draw order, distinct

    @property
    def rollouts(self) -> bool:
        return self.law in (DraftLaw.IID, DraftLaw.DELAYED)

    @property
    def depth(self) -> int:
        if self.law is DraftLaw.CHAIN:
            return self.length
        if self.rollouts:
            return self.trunk + self.length
        return len(self.widths)

    def family_of(self, shape: TreeShape) -> bool:
        """Whether a plan of ``shape`` (a chain policy's included) is cut from this family's trees."""
        if shape.law in (DraftLaw.CHAIN, DraftLaw.DYNAMIC_CHAIN):
            return self.law is DraftLaw.CHAIN
        if shape.law is DraftLaw.WITHOUT_REPLACEMENT:
            return self.law is DraftLaw.WITHOUT_REPLACEMENT
        trunk = shape.trunk if shape.law is DraftLaw.DELAYED else 0
        return self.rollouts and self.trunk == trunk


def family_specs(plans: list[Plan]) -> list[FamilyTree]:
    """The maximal trees (one per family) from which every plan's tree is cut."""
    chain_len, rollouts, wor = 0, {}, []
    for plan in plans:
        if plan.policy is not None:
            if not isinstance(plan.policy, ChainRule):
                raise ValueError(f"cannot label {plan}: the labeller takes static shapes and chain policies only")
            chain_len = max(chain_len, plan.policy.depth)
            continue
        s = plan.shape
        if s.law is DraftLaw.CHAIN:
            chain_len = max(chain_len, s.depth)
        elif s.law is DraftLaw.WITHOUT_REPLACEMENT:
            size = max(len(wor), len(s.widths))
            pad = lambda w, size=size: list(w) + [0] * (size - len(w))  # noqa: E731
            wor = [max(a, b) for a, b in zip(pad(wor), pad(s.widths), strict=True)]
        else:
            trunk = s.trunk if s.law is DraftLaw.DELAYED else 0
            k, b = rollouts.get(trunk, (0, 0))
            rollouts[trunk] = (max(k, s.paths), max(b, s.branch_len))
    specs = []
    if chain_len:
        specs.append(FamilyTree(DraftLaw.CHAIN, length=chain_len))
    for trunk in sorted(rollouts):
        k, b = rollouts[trunk]
        specs.append(FamilyTree(DraftLaw.DELAYED if trunk else DraftLaw.IID, trunk=trunk, paths=k, length=b))
    if wor:
        specs.append(FamilyTree(DraftLaw.WITHOUT_REPLACEMENT, widths=tuple(wor)))
    return specs


def _fresh(spec: FamilyTree) -> FamilyTree:
    return FamilyTree(spec.law, spec.trunk, spec.paths, spec.length, spec.widths)


class Forest:
    """Tokens, parents and depths of all maximal trees of one root, grown level by level."""

    def __init__(self, specs: list[FamilyTree], samples: int) -> None:
        self.trees = [_fresh(spec) for _ in range(samples) for spec in specs]
        self.samples = samples
        self.tokens, self.parents, self.depths = [-1], [-1], [0]
        self.owner = [-1]  # tree index of each node (-1: the shared root)
        self.ancestors: torch.Tensor | None = None  # BoolTensor[n, n], set by grow_forest

    def add(self, tree_idx: int, parent: int, token: int) -> int:
        tree = self.trees[tree_idx]
        for c in tree.kids[parent]:  # merge within one tree (same parent, same token)
            if self.tokens[c] == token:
                return c
        self.tokens.append(token)
        self.parents.append(parent)
        self.depths.append(self.depths[parent] + 1)
        self.owner.append(tree_idx)
        node = len(self.tokens) - 1
        tree.kids[parent].append(node)
        return node

    @property
    def max_depth(self) -> int:
        return max(t.depth for t in self.trees)


def grow_forest(
    forest: Forest,
    draft: ModelRunner,
    root_row: torch.Tensor,
    context_length: int,
    probs_fn: ProbsFn,
    generator: torch.Generator,
    greedy: bool,
) -> dict[int, torch.Tensor]:
    """Draw every maximal tree, one draft forward per depth; returns the draft row of each expanded node.

    The draft cache holds the context minus its last token; the block is [root, forest nodes...].
    Draws follow the engine's drafting laws (:mod:`adaptive_spec.engine.drafting`): at temperature 0 single
    walkers (chains, trunks) take the argmax and without-replacement nodes their top-w tokens,
    while i.i.d. rollouts are sampled.
    """
    device = root_row.device
    rows: dict[int, torch.Tensor] = {0: root_row}
    cap = 1 + sum(_max_nodes(t) for t in forest.trees)
    anc = torch.zeros(cap, cap, dtype=torch.bool, device=device)
    anc[0, 0] = True
    for d in range(forest.max_depth):
        requests: list[_Draw] = []
        for ti, tree in enumerate(forest.trees):
            if d >= tree.depth:
                continue
            end = tree.trunk_nodes[-1] if tree.trunk_nodes else 0
            if tree.law is DraftLaw.CHAIN or (tree.rollouts and d < tree.trunk):
                requests.append(_Draw(ti, end, 1, single=True))  # the chain or the trunk: one walker
            elif tree.rollouts:
                if d == tree.trunk:
                    tree.walkers = [[end] for _ in range(tree.paths)]
                requests.extend(_Draw(ti, w[-1], 1, walker=wi) for wi, w in enumerate(tree.walkers))
            else:
                requests.extend(_Draw(ti, n, tree.widths[d], single=True) for n in _level(tree, d))
        new_nodes = _draw_level(forest, requests, rows, probs_fn.vocab_size, generator, greedy)
        if not new_nodes:
            break
        # Ancestor rows of the new nodes, then feed those that will be expanded.
        ids = torch.tensor(new_nodes, device=device)
        par = torch.tensor([forest.parents[n] for n in new_nodes], device=device)
        anc[ids] = anc[par]
        anc[ids, ids] = True
        # Every new node is fed (as in the engine), so that the draft cache's block order is the
        # forest's node order; only the deepest level is never fed.
        expand = new_nodes
        if d + 1 < forest.max_depth:
            e = torch.tensor(expand, device=device)
            m = len(forest.tokens)
            logits = draft.block_forward(
                torch.tensor([forest.tokens[n] for n in expand], device=device),
                torch.full((len(expand),), context_length - 1 + d + 1, device=device),
                anc[e, :m],
                logits_to_keep=len(expand),
            )
            check_finite(finite_flag(logits), "draft")
            probs = probs_fn(logits)
            for i, n in enumerate(expand):
                rows[n] = probs[i]
    forest.ancestors = anc[: len(forest.tokens), : len(forest.tokens)]
    return rows


def _max_nodes(tree: FamilyTree) -> int:
    if tree.law is DraftLaw.CHAIN:
        return tree.length
    if tree.rollouts:
        return tree.trunk + tree.paths * tree.length
    total, level = 0, 1
    for w in tree.widths:
        level *= w
        total += level
    return total


def _level(tree: FamilyTree, depth: int) -> list[int]:
    """Nodes of a without-replacement tree at ``depth`` (>= 1), in draw order."""
    level = [0]
    for _ in range(depth):
        level = [c for n in level for c in tree.kids.get(n, [])]
    return level


@dataclass(frozen=True)
class _Draw:
    """One node's draws at a level: ``k`` children of ``parent`` in tree ``tree``.

    ``single``: a lone walker (chain, trunk) or a without-replacement node, which take the
    argmax (top-``k``) at temperature 0; ``walker``: the i.i.d. rollout that draws (sampled at
    every temperature).
    """

    tree: int
    parent: int
    k: int
    single: bool = False
    walker: int | None = None


def _draw_level(
    forest: Forest,
    requests: list[_Draw],
    rows: dict[int, torch.Tensor],
    vocab: int,
    generator: torch.Generator,
    greedy: bool,
) -> list[int]:
    """Draw every request's children with the engine's drafting laws (:func:`draw_children`); the new nodes."""
    if not requests:
        return []
    R = torch.stack([rows[r.parent] for r in requests])  # [W, V]
    greedy_rows = torch.tensor([r.single for r in requests], device=R.device) if greedy else False
    kmax = min(max(r.k for r in requests), vocab)
    top, valid = draw_children(R, kmax, generator, greedy=greedy_rows)
    idx, ok = top.tolist(), valid.tolist()
    before = len(forest.tokens)
    for i, r in enumerate(requests):
        tree = forest.trees[r.tree]
        if r.walker is not None:
            tree.walkers[r.walker].append(forest.add(r.tree, r.parent, idx[i][0]))
        elif tree.law is DraftLaw.WITHOUT_REPLACEMENT:  # the top-w of the race: w distinct tokens of nonzero mass
            for j in range(min(r.k, vocab)):
                if ok[i][j]:
                    forest.add(r.tree, r.parent, idx[i][j])
        else:
            tree.trunk_nodes.append(forest.add(r.tree, r.parent, idx[i][0]))
    return list(range(before, len(forest.tokens)))


def cut_tree(forest: Forest, tree: FamilyTree, shape: TreeShape, rows: dict[int, torch.Tensor], vocab: int):
    """The draft tree of ``shape`` cut from a maximal tree: (DraftTree, forest ids of its nodes)."""
    edges: list[tuple[int, int]] = []  # (parent, child) draws in drafting order, forest ids
    if shape.law is DraftLaw.CHAIN:
        path = [0, *tree.trunk_nodes[: shape.depth]]
        edges = list(itertools.pairwise(path))
    elif shape.law is DraftLaw.WITHOUT_REPLACEMENT:
        level = [0]
        for w in shape.widths:
            nxt = []
            for n in level:
                kids = tree.kids.get(n, [])[:w]
                edges.extend((n, c) for c in kids)
                nxt.extend(kids)
            level = nxt
    else:
        trunk = shape.trunk if shape.law is DraftLaw.DELAYED else 0
        path = [0, *tree.trunk_nodes[:trunk]]
        edges = list(itertools.pairwise(path))
        for walker in tree.walkers[: shape.paths]:
            seq = walker[: shape.branch_len + 1]  # walker[0] is the branching node
            edges.extend(itertools.pairwise(seq))
    ids = sorted({0, *(c for _, c in edges)})  # forest ids grow with depth: parents come first
    local = {g: i for i, g in enumerate(ids)}
    child_draws: list[list[int]] = [[] for _ in ids]
    for parent, child in edges:
        child_draws[local[parent]].append(local[child])
    zero = torch.zeros(vocab, dtype=rows[0].dtype, device=rows[0].device)
    has_kids = {local[p] for p, _ in edges}
    probs = torch.stack([rows[g] if i in has_kids else zero for i, g in enumerate(ids)])
    dtree = DraftTree(
        [forest.tokens[g] if g else -1 for g in ids],
        [-1] + [local[forest.parents[g]] for g in ids[1:]],
        [forest.depths[g] for g in ids],
        probs,
        child_draws,
        shape,
    )
    return dtree, ids


def policy_chain_length(
    policy: ChainRule,
    forest: Forest,
    chain: list[int],
    rows: dict[int, torch.Tensor],
    temperature: float,
    stats: dict[int, tuple[float, float]] | None = None,
) -> int:
    """How many tokens of a drawn chain a chain policy keeps.

    The policy sees each drawn node as the engine's drafter shows it (depth, the token's draft
    probability, the entropy and top-1 of the row it was drawn from, the path probability, the
    parent's memo) and the chain ends after the first node it does not feed, or at its depth.
    The chain's tokens are the policy's own draws: a dynamic chain draws each child from the
    fed node's row exactly as a static chain does, so a prefix of the drawn chain has its law.

    Args:
        policy: the chain policy.
        forest: the forest holding the chain.
        chain: forest ids of the drawn chain's nodes, by depth (at least ``policy.depth`` long).
        rows: draft rows of the forest's expanded nodes (0 = the root).
        temperature: the step's temperature, as the policy sees it.
        stats: a cache of ``(entropy, top-1)`` per forest id, shared across policies.
    """
    stats = {} if stats is None else stats
    parent, parent_memo, path = 0, None, 1.0
    for depth, node in enumerate(chain[: policy.depth], start=1):
        if parent not in stats:
            stats[parent] = row_stats(rows[parent])
        ent, top1 = stats[parent]
        q = float(rows[parent][forest.tokens[node]])
        path *= q
        view = NodeView(depth, depth - 1, forest.tokens[node], depth, q, path, ent, top1, parent_memo=parent_memo)
        # the node budget left after `depth` draws, as the engine's drafter passes it
        fed = policy.feed([view], PolicyContext(policy.depth - depth, temperature), None)[0]
        if not fed or depth == policy.depth:
            return depth
        parent, parent_memo = node, view.memo
    return min(policy.depth, len(chain))
