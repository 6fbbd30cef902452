"""Batched tree drafting with the draft model: one forward per depth level.

The tree is grown level by level. At depth d every node that will be expanded has just been
fed to the draft model (one forward over the whole level, under the tree attention mask),
so its next-token distribution is a row of that forward's output; children for the whole
level are then drawn with a few torch ops from the caller's generator:

* chain / trunk: one *walker* draws one token per level;
* i.i.d. rollouts (``iid``, the branches of ``delayed``): K walkers, each drawing one token
  per level from the row of the node it stands on (exponential race, with replacement);
  walkers that draw the same token from the same node merge into one node, and the draw is
  kept with multiplicity in ``child_draws``;
* without replacement: every frontier node draws ``widths[d]`` distinct children by the
  exponential race (Gumbel-top-k): ``argsort(probs / Exp(1))`` has the law of sequential
  draws without replacement (Plackett-Luce), tokens of probability zero excluded.

This is the law of :func:`adaptive_spec.trees.sample_tree` (which draws rollout by rollout,
depth first): rows are a function of the prefix only, draws are independent given the rows,
and walkers are processed in rollout order at each level, so each node's ``child_draws`` has
the same order. Only the node numbering differs (here breadth first). Leaves (depth
``shape.depth``) are never fed to the draft model.

At temperature 0 (``deterministic=True``) single-walker draws take the argmax and
without-replacement draws the top-w tokens (deterministic top-k, fine for greedy
verification, docs/algorithms.md §2), while i.i.d. rollouts are still sampled so that they differ.

The first draft forward of a step, over the *pending* context tokens (those not yet in the
draft cache, the root last), does not depend on the tree shape: :func:`draft_root` runs it on
its own (the engine does so before the planner chooses, when root features are wanted, since
its last row is the draft's root distribution) and :func:`draft_tree` continues from it.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass

import torch

from adaptive_spec.engine.logits import ProbsFn
from adaptive_spec.engine.runner import ModelRunner
from adaptive_spec.rng import TorchSampler
from adaptive_spec.trees import DraftLaw, DraftTree, TreeShape
from adaptive_spec.trees.policy import ChainRule, DraftPolicy, NodeView, PolicyContext, clip_widths


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
    """

    tree: DraftTree
    ancestors: torch.Tensor
    pending_fed: int
    fed_nodes: int
    cache_rows: dict[int, int] | None = None
    policy_levels: int = 0
    policy_decision_s: float = 0.0

    def draft_row(self, node: int) -> int | None:
        """Offset of ``node``'s KV row after the root in the draft cache, or None if it was never fed.

        Static trees feed nodes ``0 .. fed_nodes - 1`` in order; a policy-grown tree feeds them
        in the order of ``cache_rows``.
        """
        if self.cache_rows is None:
            return node if node < self.fed_nodes else None
        return self.cache_rows.get(node)


@dataclass
class DraftRoot:
    """The first draft forward of a step: the pending tokens fed as a causal chain.

    Attributes:
        pending: number of pending tokens fed (the root is the last).
        base: the draft cache's committed length before the forward.
        probs: Tensor[keep, V], the processed rows of the last ``keep`` pending tokens; the last
            row is the draft's root distribution (over the first drafted token).
        ok: 0-dim bool tensor, whether the logits were finite (checked at the first host sync).
        causal: BoolTensor[p, p], the causal mask the pending tokens were fed under.
        hidden: Tensor[keep, H], the draft's last hidden states at those rows, when the runner
            keeps hidden states; else None.
    """

    pending: int
    base: int
    probs: torch.Tensor
    ok: torch.Tensor
    causal: torch.Tensor
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
    causal = torch.ones(p, p, dtype=torch.bool, device=runner.device).tril_()  # [p, p]
    positions = torch.arange(base, base + p, device=runner.device)
    logits = runner.block_forward(pending, positions, causal, logits_to_keep=min(keep, p))  # [keep, V']
    probs = probs_fn(logits)
    return DraftRoot(p, base, probs, finite_flag(logits, probs), causal, runner.hidden)


def finite_flag(logits: torch.Tensor, probs: torch.Tensor | None = None) -> torch.Tensor:
    """0-dim bool tensor: are all ``logits`` (and the ``probs`` made from them) finite? No host sync.

    The probabilities are checked after processing too: a row can overflow in the processors
    (a tiny temperature) although the raw logits are finite.
    """
    ok = torch.isfinite(logits.sum(dtype=torch.float32))
    if probs is not None:
        ok = ok & torch.isfinite(probs.sum(dtype=torch.float32))
    return ok


def check_finite(ok: torch.Tensor | bool, who: str) -> None:
    """Raise a ValueError when a forward pass returned NaN or inf logits (a host sync if ``ok`` is a tensor)."""
    if not bool(ok):
        raise ValueError(
            f"the {who} model returned NaN or inf logits; check the model weights and dtype "
            "(fp16 overflows are common: try dtype=torch.bfloat16 or float32)"
        )


def sample_categorical(probs: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """One draw per row of ``probs`` (Tensor[W, V]) by the exponential race ``argmax(probs / Exp(1))``.

    Same law as ``torch.multinomial(probs, 1)``, without its per-row setup cost and host sync.
    """
    return (probs / torch.empty_like(probs).exponential_(generator=generator)).argmax(dim=-1)  # [W]


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
    V = probs_fn.vocab_size
    device = runner.device
    D = shape.depth
    tokens, parents, depths = [-1], [-1], [0]
    child_draws: list[list[int]] = [[]]
    if D == 0:
        if isinstance(pending, DraftRoot):  # the pending tokens were fed: node 0 has its row
            tree = DraftTree(tokens, parents, depths, pending.probs[-1:], child_draws, shape)
            return DraftOutcome(tree, torch.ones(1, 1, dtype=torch.bool, device=device), pending.pending, 1)
        probs = torch.zeros(1, V, dtype=torch.float32, device=device)
        tree = DraftTree(tokens, parents, depths, probs, child_draws, shape)
        return DraftOutcome(tree, torch.ones(1, 1, dtype=torch.bool, device=device), 0, 0)

    root = pending if isinstance(pending, DraftRoot) else draft_root(runner, pending, probs_fn)
    p, base = root.pending, root.base
    # Block ancestor matrix: block index b < p is a pending token, tree node i sits at p - 1 + i.
    size = p - 1 + shape.max_nodes
    anc = torch.zeros(size, size, dtype=torch.bool, device=device)  # [block, block]
    anc[:p, :p] = root.causal
    ok = root.ok  # checked at the level's host sync, before any drawn token is used
    rows = [root.probs[-1:]]  # per level: Tensor[nodes at that depth, V]
    level_first = 0  # node id of the first node at the current depth
    iid_like = shape.law in (DraftLaw.IID, DraftLaw.DELAYED)
    walkers = [0]  # chain / i.i.d. laws: node each walker stands on

    for d in range(D):
        R = rows[-1]  # [nodes at depth d, V]
        new_first = len(tokens)
        if shape.law is DraftLaw.WITHOUT_REPLACEMENT:
            k = min(shape.widths[d], V)
            keys = R if deterministic else R / torch.empty_like(R).exponential_(generator=generator)
            idx = keys.topk(k, dim=-1).indices  # [F, k], in draw order
            valid = R.gather(-1, idx) > 0  # zero-probability tokens are never drawn
            flat = torch.cat([idx.flatten(), valid.flatten().long(), ok.long()[None]]).tolist()  # one host sync
            check_finite(flat[-1], "draft")
            n_draws = idx.numel()
            for f in range(R.shape[0]):
                node = level_first + f
                for j in range(k):
                    if flat[n_draws + f * k + j]:
                        child_draws[node].append(_new_node(tokens, parents, depths, child_draws, node, flat[f * k + j]))
        else:
            if iid_like and d == shape.trunk:
                walkers = walkers * shape.paths  # the rollouts start at the trunk's end
            sel = R[torch.tensor([w - level_first for w in walkers], device=device)]  # [W, V]
            # [W] draws, i.i.d. with replacement (the argmax for a lone walker at T=0)
            single = deterministic and len(walkers) == 1
            drawn = sel.argmax(dim=-1) if single else sample_categorical(sel, generator)
            drawn = torch.cat([drawn, ok.long()[None]]).tolist()  # one host sync
            check_finite(drawn.pop(), "draft")
            index: dict[tuple[int, int], int] = {}
            for w, tok in enumerate(drawn):
                node = walkers[w]
                child = index.get((node, tok))
                if child is None:
                    child = _new_node(tokens, parents, depths, child_draws, node, tok)
                    index[(node, tok)] = child
                child_draws[node].append(child)
                walkers[w] = child
        new_last = len(tokens)
        # Ancestor rows of the new nodes: their parent's row plus themselves.
        b_new = torch.arange(p - 1 + new_first, p - 1 + new_last, device=device)
        b_par = torch.tensor(parents[new_first:new_last], device=device) + (p - 1)
        anc[b_new] = anc[b_par]
        anc[b_new, b_new] = True
        level_first = new_first
        if d + 1 < D:  # feed the new level so that it can be expanded
            ids = torch.tensor(tokens[new_first:new_last], device=device)
            pos = torch.full((new_last - new_first,), base + p - 1 + d + 1, device=device)
            m = p - 1 + new_last
            logits = runner.block_forward(ids, pos, anc[b_new, :m], logits_to_keep=new_last - new_first)
            rows.append(probs_fn(logits))
            ok = finite_flag(logits, rows[-1])

    n = len(tokens)
    fed = n - sum(1 for x in depths if x == D)
    probs = torch.cat([*rows, torch.zeros(n - fed, V, dtype=rows[0].dtype, device=device)])  # [N, V]
    tree = DraftTree(tokens, parents, depths, probs, child_draws, shape)
    return DraftOutcome(tree, anc[p - 1 : p - 1 + n, p - 1 : p - 1 + n], p, fed)


def _new_node(
    tokens: list[int], parents: list[int], depths: list[int], child_draws: list[list[int]], parent: int, token: int
) -> int:
    tokens.append(token)
    parents.append(parent)
    depths.append(depths[parent] + 1)
    child_draws.append([])
    return len(tokens) - 1


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
) -> DraftOutcome:
    """Grow a tree with a drafting ``policy``: one draft forward per level, one host sync per level.

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
    V = probs_fn.vocab_size
    device = runner.device
    law = policy.law
    root = pending if isinstance(pending, DraftRoot) else draft_root(runner, pending, probs_fn)
    p, base = root.pending, root.base
    n_max = policy.shape.max_nodes
    anc = torch.zeros(n_max, n_max, dtype=torch.bool, device=device)  # [node, node] ancestor matrix
    anc[0, 0] = True
    tokens, parents, depths = [-1], [-1], [0]
    child_draws: list[list[int]] = [[]]
    views: dict[int, NodeView] = {}
    cache_rows = {0: 0}  # fed node -> offset after the root in the draft cache (feed order)
    fed_order = [0]
    rows = [root.probs[-1:]]  # per fed level: Tensor[F, V]
    frontier, R, ok = [0], root.probs[-1:], root.ok
    sampler = TorchSampler(generator)
    budget = policy.budget
    K = 1 if law is DraftLaw.DYNAMIC_CHAIN else max(1, min(policy.max_width, V))
    pending_pos = torch.ones(1, p - 1, dtype=torch.bool, device=device)
    levels, decision_s = 0, 0.0
    chain_rule = isinstance(policy, ChainRule)  # widths are always 1: no call needed

    while frontier and budget > 0 and policy.depth > 0:
        F = len(frontier)
        if law is DraftLaw.DYNAMIC_WOR:
            keys = R if deterministic else R / torch.empty_like(R).exponential_(generator=generator)
            cand = keys.topk(K, dim=-1).indices  # [F, K], in draw order
        else:
            race = R[:, None, :] / torch.empty(F, K, V, dtype=R.dtype, device=device).exponential_(generator=generator)
            cand = race.argmax(dim=-1)  # [F, K] i.i.d. draws
            if deterministic:
                cand[:, 0] = R.argmax(dim=-1)
        cand_q = R.gather(-1, cand)  # [F, K]
        logr = torch.where(R > 0, R.log(), torch.zeros_like(R))
        ent = -(R * logr).sum(-1)  # [F]
        top1 = R.max(dim=-1).values  # [F]
        host = torch.cat(
            [cand.flatten().double(), cand_q.flatten().double(), ent.double(), top1.double(), ok.double()[None]]
        ).tolist()  # the level's one host sync
        check_finite(host[-1], "draft")
        n_c = F * K
        c_tok, c_q = host[:n_c], host[n_c : 2 * n_c]
        f_ent, f_top = host[2 * n_c : 2 * n_c + F], host[2 * n_c + F : 2 * n_c + 2 * F]
        t_decide = time.perf_counter()
        fv = []
        for i, n in enumerate(frontier):
            v = views.get(n)
            if v is None:  # the root
                v = views[n] = NodeView(0, -1, -1, 0, 1.0, 1.0, f_ent[i], f_top[i])
            v.entropy, v.top1 = f_ent[i], f_top[i]
            fv.append(v)
        if chain_rule:  # one child per fed node: the frontier is fed only below the depth, within the budget
            widths = [1] * len(fv)
        else:
            ctx = PolicyContext(budget, temperature, features)
            widths = clip_widths(policy, fv, policy.widths(fv, ctx, sampler), budget)
        decision_s += time.perf_counter() - t_decide
        levels += 1
        new: list[int] = []
        for i, (v, k) in enumerate(zip(fv, widths, strict=True)):
            if k == 0:
                continue
            budget -= k
            first, index, q_of = len(tokens), {}, {}
            for j in range(k):
                tok, q = int(c_tok[i * K + j]), c_q[i * K + j]
                if q <= 0.0:  # zero-probability tokens are never drawn (they sort last in a top-k)
                    break
                child = index.get(tok)
                if child is None:
                    child = _new_node(tokens, parents, depths, child_draws, v.node, tok)
                    index[tok], q_of[child] = child, q
                child_draws[v.node].append(child)
            draws = child_draws[v.node]
            for c in range(first, len(tokens)):
                views[c] = NodeView(
                    c, v.node, tokens[c], v.depth + 1, q_of[c], v.path_prob * q_of[c], f_ent[i], f_top[i],
                    multiplicity=draws.count(c), parent_draws=len(draws), branched=v.branched or len(draws) > 1,
                    parent_memo=v.memo,
                )  # fmt: skip
                new.append(c)
        if not new:
            break
        new_t = torch.tensor(new, device=device)
        anc[new_t] = anc[torch.tensor([parents[c] for c in new], device=device)]
        anc[new_t, new_t] = True
        if budget <= 0:
            break
        t_decide = time.perf_counter()
        nv = [views[c] for c in new]
        feed = policy.feed(nv, PolicyContext(budget, temperature, features), sampler)
        if len(feed) != len(nv):
            raise ValueError(f"{type(policy).__name__}.feed returned {len(feed)} values for {len(nv)} nodes")
        frontier = [v.node for v, f in zip(nv, feed, strict=True) if f and v.depth < policy.depth]
        decision_s += time.perf_counter() - t_decide
        if not frontier:
            break
        for c in frontier:
            cache_rows[c] = len(fed_order)
            fed_order.append(c)
        fr_t = torch.tensor(frontier, device=device)
        allowed = torch.cat(
            [pending_pos.expand(len(frontier), -1), anc[fr_t][:, torch.tensor(fed_order, device=device)]], dim=1
        )  # [F', p - 1 + fed]
        ids = torch.tensor([tokens[c] for c in frontier], device=device)
        pos = torch.tensor([base + p - 1 + depths[c] for c in frontier], device=device)
        logits = runner.block_forward(ids, pos, allowed, logits_to_keep=len(frontier))
        R = probs_fn(logits)
        ok = finite_flag(logits, R)
        rows.append(R)

    n = len(tokens)
    probs = torch.zeros(n, V, dtype=rows[0].dtype, device=device)
    probs[torch.tensor(fed_order, device=device)] = torch.cat(rows)[: len(fed_order)]
    tree = DraftTree(tokens, parents, depths, probs, child_draws, policy.shape)
    return DraftOutcome(tree, anc[:n, :n], p, len(fed_order), cache_rows, levels, decision_s)
