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
verification, reference §2), while i.i.d. rollouts are still sampled so that they differ.

The first draft forward of a step, over the *pending* context tokens (those not yet in the
draft cache, the root last), does not depend on the tree shape: :func:`draft_root` runs it on
its own (the engine does so before the planner chooses, when root features are wanted, since
its last row is the draft's root distribution) and :func:`draft_tree` continues from it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from adaptive_spec.engine.kv_cache import ModelRunner
from adaptive_spec.engine.sampling import ProbsFn
from adaptive_spec.trees import DraftLaw, DraftTree, TreeShape


@dataclass
class DraftOutcome:
    """A drafted tree and where its nodes sit in the draft model's cache.

    Attributes:
        tree: the draft tree (nodes numbered level by level).
        ancestors: BoolTensor[N, N] on the model's device, ``ancestor_matrix(tree.parents)``.
        pending_fed: number of pending context tokens fed before the tree (0 when the draft
            model was not run, i.e. a depth-0 tree).
        fed_nodes: tree nodes ``0 .. fed_nodes - 1`` have KV rows in the draft cache, at row
            ``cached + pending_fed - 1 + node`` (node 0 is the last pending token).
    """

    tree: DraftTree
    ancestors: torch.Tensor
    pending_fed: int
    fed_nodes: int


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
    return DraftRoot(p, base, probs_fn(logits), finite_flag(logits), causal, runner.hidden)


def finite_flag(logits: torch.Tensor) -> torch.Tensor:
    """0-dim bool tensor: are all ``logits`` finite? One reduction, no host sync."""
    return torch.isfinite(logits.sum(dtype=torch.float32))


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
            ok = finite_flag(logits)
            rows.append(probs_fn(logits))

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
