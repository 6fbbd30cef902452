"""Drawing draft trees: the one child-drawing rule, and the reference drawers.

:func:`draw_children` is how every drafter draws a node's children from the draft rows: the
engine's static and policy drafters (:mod:`adaptive_spec.engine.drafting`), the labeller's
forest (:mod:`adaptive_spec.records.forest`) and the reference drawers below. The drafting laws
(docs/algorithms.md §8) are written there once.

``sample_tree`` and ``sample_policy_tree`` are the reference path for tests and research: they
call ``draft_probs_fn(prefix)`` once per expanded node and draw one token at a time through a
:class:`~adaptive_spec.rng.Sampler`, so that the exact tests can enumerate every draw:
they take :func:`draw_children`'s one-draw-at-a-time path (given a
:class:`~adaptive_spec.rng.Sampler` instead of a ``torch.Generator``), the batched drafters its
batched path (inverse CDF, or the exponential race on an accelerator), and ``tests/trees/test_draw_children.py``
checks that they have one law.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch

from adaptive_spec.rng import Sampler, accelerator_path, as_sampler, inverse_cdf, search_cdf
from adaptive_spec.trees.policy import DraftPolicy, NodeView, PolicyContext, clip_widths, row_stats
from adaptive_spec.trees.shapes import DraftLaw, TreeShape
from adaptive_spec.trees.tree import DraftTree

DraftProbsFn = Callable[[tuple[int, ...]], torch.Tensor]


def draw_children(
    rows: torch.Tensor,
    k: int,
    generator: torch.Generator,
    *,
    replace: bool = False,
    greedy: bool | torch.Tensor = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``k`` children per row of ``rows`` (Tensor[W, V]), drawn on the rows' device: ``(tokens [W, k], valid [W, k])``.

    * ``replace=True``, or ``k = 1``: ``k`` independent categorical draws per row by the inverse CDF (a float64
      cumulative sum of the row, ``k`` uniforms, a binary search): one uniform per draw. A single draw per row
      (``k = 1``) on an accelerator is the exponential race's first token instead (``argmax(rows / Exp(1))``, the
      law of the categorical draw): four kernels where the inverse CDF launches seven.
    * ``replace=False`` with ``k > 1``: ``k`` draws without replacement, in draw order (Plackett-Luce). On an
      accelerator by the exponential race (Gumbel-top-k): the first ``k`` of ``argsort(rows / Exp(1))``, a few
      kernels whatever ``k``; on a CPU as the first ``k`` distinct tokens of i.i.d. inverse-CDF draws, with
      successive draws (each drawn token's weight zeroed before the next) for a row still short of ``k``
      (:func:`_first_distinct`; the race's ``V`` exponentials per row cost a CPU far more: 1.5 ms per SmolLM2 row).
      Both have the law of sequential draws without replacement.

    ``greedy`` (a bool, or BoolTensor[W] per row) is temperature 0's rule: those rows take their
    argmax first (without replacement their top-``k`` tokens, with replacement their first draw).
    Greedy verification is lossless for any tree. ``valid`` is False where the drawn token has
    probability 0 (reached only when fewer than ``k`` tokens remain without replacement); those draws do
    not happen. No host sync.

    ``generator`` may also be a :class:`~adaptive_spec.rng.Sampler` (the reference drawers pass
    one): the same law is then drawn one token at a time by ``sampler.categorical`` (without
    replacement, each drawn token's weight zeroed before the next draw), so that the exact tests
    can enumerate every draw.
    """
    return _draw(rows, k, generator, replace, greedy, with_valid=True)


def draw_tokens(
    rows: torch.Tensor,
    k: int,
    generator: torch.Generator,
    *,
    replace: bool = False,
    greedy: bool | torch.Tensor = False,
) -> torch.Tensor:
    """:func:`draw_children`'s tokens alone (LongTensor[W, k]): the same draws, without the ops of ``valid`` (a
    few kernel launches per call on a GPU), for callers that do not read it.
    """
    return _draw(rows, k, generator, replace, greedy, with_valid=False)[0]


def _draw(
    rows: torch.Tensor, k: int, generator, replace: bool, greedy: bool | torch.Tensor, with_valid: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    if not isinstance(generator, torch.Generator):
        return _one_at_a_time(rows, k, generator, replace, greedy)
    all_greedy = not isinstance(greedy, torch.Tensor) and bool(greedy)
    if replace or k == 1:
        if all_greedy and k == 1:  # a lone greedy draw: the argmax, no randomness
            tokens = rows.argmax(dim=-1, keepdim=True)
        elif k == 1 and greedy is False and accelerator_path(rows.device):  # one draw: the race, in 4 kernels
            tokens = _race(rows, 1, generator, False)[0]
        else:
            tokens = inverse_cdf(rows, k, generator)  # [W, k]
            if isinstance(greedy, torch.Tensor):
                tokens[:, 0] = torch.where(greedy, rows.argmax(dim=-1), tokens[:, 0])
            elif greedy:
                tokens[:, 0] = rows.argmax(dim=-1)
        return tokens, (rows.gather(-1, tokens) > 0 if with_valid else None)
    if all_greedy:  # the top k, in order: no randomness
        tokens = rows.topk(k, dim=-1).indices
        return tokens, (rows.gather(-1, tokens) > 0 if with_valid else None)
    if accelerator_path(rows.device):
        tokens, valid = _race(rows, k, generator, with_valid)
    else:
        tokens, valid = _first_distinct(rows, k, generator, with_valid)
    if isinstance(greedy, torch.Tensor):  # those rows take their top k
        top = rows.topk(k, dim=-1).indices
        tokens = torch.where(greedy[:, None], top, tokens)
        if with_valid:
            valid = torch.where(greedy[:, None], rows.gather(-1, top) > 0, valid)
    return tokens, valid


def _race(
    rows: torch.Tensor, k: int, generator: torch.Generator, with_valid: bool = True
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``k`` draws without replacement per row, the exponential race: the first ``k`` of ``argsort(rows / Exp(1))``."""
    tokens = (rows / torch.empty_like(rows).exponential_(generator=generator)).topk(k, dim=-1).indices  # draw order
    return tokens, (rows.gather(-1, tokens) > 0 if with_valid else None)


#: Draws with replacement per token wanted that :func:`_first_distinct` takes at once, before successive draws for the
#: rows still short of ``k`` distinct tokens (about 3 % of an EAGLE-style tree's rows at T = 1 with 16 draws for 4).
DISTINCT_DRAWS = 4


def _first_distinct(
    rows: torch.Tensor, k: int, generator: torch.Generator, with_valid: bool = True
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``k`` draws without replacement per row, a CPU's way: ``(tokens [W, k], valid [W, k])`` (``valid`` None unless
    ``with_valid``).

    The first ``k`` distinct tokens of i.i.d. draws have the law of successive draws without replacement (given
    the tokens found so far, the next new one is drawn from the weights of the others): ``DISTINCT_DRAWS · k``
    inverse-CDF draws per row from one cumulative sum and one search, their first ``k`` distinct values read on the
    host (a CPU's tensors: no sync), and a row still short draws the rest by successive inverse-CDF draws, each
    drawn token's weight zeroed before the next (fresh uniforms: the law does not remember the repeats). A round
    with no weight left draws nothing (``valid`` False). Half the ops of ``k`` rounds of successive draws (counted
    in a 48-node tree's steps, short rows included), and one pass over the vocabulary where they took ``k``.
    """
    drawn = inverse_cdf(rows, DISTINCT_DRAWS * k, generator).tolist()
    out = [list(dict.fromkeys(row))[:k] for row in drawn]
    short = [i for i, row in enumerate(out) if len(row) < k]
    if short:  # fewer than k distinct tokens drawn: successive draws from the weights of the others
        weights = rows[short].to(torch.float64, copy=True)
        for j, i in enumerate(short):
            weights[j, out[i]] = 0.0
        rounds = k - min(len(out[i]) for i in short)
        u = torch.rand(len(short), rounds, dtype=torch.float64, device=rows.device, generator=generator)
        more, left = [], []
        for j in range(rounds):
            t = search_cdf(weights.cumsum(-1), u[:, j : j + 1])
            left.append(weights.gather(-1, t) > 0)  # weight left to draw from (else the row's last token, not drawn)
            weights.scatter_(-1, t, 0.0)
            more.append(t)
        extra = torch.cat(more, dim=1).tolist()
        ok = torch.cat(left, dim=1).tolist()
        fine = [[True] * k for _ in out]
        for j, i in enumerate(short):
            d = len(out[i])
            out[i] += extra[j][: k - d]
            fine[i][d:] = ok[j][: k - d]
    tokens = torch.tensor(out, dtype=torch.long, device=rows.device)
    if not with_valid:
        return tokens, None
    valid = rows.gather(-1, tokens) > 0  # a row of weight 0 drew its last token
    return tokens, (valid & torch.tensor(fine, device=rows.device) if short else valid)


def _one_at_a_time(
    rows: torch.Tensor, k: int, sampler: Sampler, replace: bool, greedy: bool | torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`draw_children`'s law by sequential categorical draws through ``sampler``."""
    k = int(k)
    tokens = torch.zeros(rows.shape[0], k, dtype=torch.long, device=rows.device)
    valid = torch.zeros(rows.shape[0], k, dtype=torch.bool, device=rows.device)
    for w in range(rows.shape[0]):
        weights = rows[w] if replace else rows[w].clone()
        greedy_row = bool(greedy[w]) if isinstance(greedy, torch.Tensor) else bool(greedy)
        for j in range(k):
            if not bool(weights.sum() > 0):  # fewer tokens in the support than k
                break
            token = int(weights.argmax()) if greedy_row and (j == 0 or not replace) else sampler.categorical(weights)
            tokens[w, j], valid[w, j] = token, True
            if not replace:
                weights[token] = 0
    return tokens, valid


class _Builder:
    """Accumulates nodes while a tree is drafted."""

    def __init__(self, draft_probs_fn: DraftProbsFn, sampler: Sampler) -> None:
        self.fn = draft_probs_fn
        self.sampler = sampler
        self.tokens = [-1]
        self.parents = [-1]
        self.depths = [0]
        self.child_draws: list[list[int]] = [[]]
        self.prefixes: list[tuple[int, ...]] = [()]
        self.index: dict[tuple[int, ...], int] = {(): 0}
        self.rows: dict[int, torch.Tensor] = {}
        self.vocab: int | None = None

    def row(self, node: int) -> torch.Tensor:
        """The draft distribution at ``node`` (computed once per node)."""
        r = self.rows.get(node)
        if r is None:
            r = _check_row(self.fn(self.prefixes[node]), self.prefixes[node], self.vocab)
            self.vocab = r.shape[0]
            self.rows[node] = r
        return r

    def draw(self, parent: int, k: int = 1, replace: bool = True) -> list[int]:
        """``k`` children of ``parent`` drawn from its row (:func:`draw_children`); merged by token, in draw order."""
        tokens, valid = draw_children(self.row(parent)[None], k, self.sampler, replace=replace)
        return [self.add(parent, t) for t, ok in zip(tokens[0].tolist(), valid[0].tolist(), strict=True) if ok]

    def add(self, parent: int, token: int) -> int:
        """The child of ``parent`` with ``token`` (new unless already drawn), its draw recorded."""
        key = self.prefixes[parent] + (token,)
        idx = self.index.get(key)
        if idx is None:
            idx = len(self.tokens)
            self.tokens.append(token)
            self.parents.append(parent)
            self.depths.append(self.depths[parent] + 1)
            self.child_draws.append([])
            self.prefixes.append(key)
            self.index[key] = idx
        self.child_draws[parent].append(idx)
        return idx

    def rollout(self, start: int, length: int) -> int:
        node = start
        for _ in range(length):
            node = self.draw(node)[0]
        return node

    def finish(self, shape: TreeShape) -> DraftTree:
        ref = self.row(0)
        probs = torch.zeros(len(self.tokens), ref.shape[0], dtype=ref.dtype, device=ref.device)
        for i, r in self.rows.items():
            probs[i] = r
        return DraftTree(self.tokens, self.parents, self.depths, probs, self.child_draws, shape)


def sample_tree(shape: TreeShape, draft_probs_fn: DraftProbsFn, generator: torch.Generator | Sampler) -> DraftTree:
    """Draw a draft tree of ``shape``.

    Args:
        shape: the tree shape (and so the drafting law).
        draft_probs_fn: ``prefix -> Tensor[V]``, the draft's next-token distribution after
            the root context extended by ``prefix``.
        generator: the caller's ``torch.Generator`` (or a :class:`~adaptive_spec.rng.Sampler`).

    Returns:
        The tree, with ``draft_probs`` filled for every expanded node.
    """
    if shape.law.dynamic:
        raise ValueError(f"sample_tree: {shape} is drawn by a drafting policy; use sample_policy_tree")
    if shape.law is DraftLaw.DETERMINISTIC:
        raise ValueError(f"sample_tree: {shape} is looked up in the context, not drawn; use trees.lookup.lookup_trie")
    b = _Builder(draft_probs_fn, as_sampler(generator))
    b.row(0)
    if shape.law is DraftLaw.WITHOUT_REPLACEMENT:
        _expand_without_replacement(b, 0, shape.widths)
    else:
        branch = b.rollout(0, shape.trunk)
        if shape.law is not DraftLaw.CHAIN:
            for _ in range(shape.paths):
                b.rollout(branch, shape.branch_len)
    return b.finish(shape)


def _expand_without_replacement(b: _Builder, node: int, widths: tuple[int, ...]) -> None:
    if not widths:
        return
    for child in b.draw(node, widths[0], replace=False):
        _expand_without_replacement(b, child, widths[1:])


def _policy_children(b: _Builder, v: NodeView, k: int, distinct: bool, views: dict[int, NodeView]) -> list[int]:
    """Draw ``k`` children of ``v`` (distinct, or i.i.d. and merged by token); add their views; the new nodes."""
    row = b.row(v.node)
    first = len(b.tokens)
    b.draw(v.node, k, replace=not distinct)
    draws = b.child_draws[v.node]
    row_list = row.double()
    for c in range(first, len(b.tokens)):
        q = float(row_list[b.tokens[c]])
        views[c] = NodeView(
            c,
            v.node,
            b.tokens[c],
            v.depth + 1,
            q,
            v.path_prob * q,
            v.entropy,
            v.top1,
            multiplicity=draws.count(c),
            parent_draws=len(draws),
            branched=v.branched or len(draws) > 1,
            parent_memo=v.memo,
        )
    return list(range(first, len(b.tokens)))


def _check_row(row: torch.Tensor, prefix: tuple[int, ...], vocab: int | None) -> torch.Tensor:
    if not isinstance(row, torch.Tensor) or row.dim() != 1:
        raise ValueError(f"draft_probs_fn{prefix} must return a 1-D tensor over the vocabulary")
    if vocab is not None and row.shape[0] != vocab:
        raise ValueError(f"draft_probs_fn{prefix} returned {row.shape[0]} entries, expected {vocab}")
    if not bool(torch.isfinite(row).all()) or bool((row < 0).any()):
        raise ValueError(f"draft_probs_fn{prefix} returned NaN, inf or negative probabilities")
    total = float(row.sum())
    if abs(total - 1.0) > 1e-4:
        raise ValueError(f"draft_probs_fn{prefix} returned probabilities that sum to {total}, not 1")
    return row


def sample_policy_tree(
    policy: DraftPolicy,
    draft_probs_fn: DraftProbsFn,
    generator: torch.Generator | Sampler,
    *,
    temperature: float = 1.0,
    features: Mapping[str, float] | None = None,
) -> DraftTree:
    """Grow a draft tree with a drafting ``policy``, level by level (reference drafter).

    Per level: the policy's :meth:`~DraftPolicy.widths` for the fed frontier (whose rows are
    known), then every node's children are drawn from its row (i.i.d. or without
    replacement, by ``policy.law``), then :meth:`~DraftPolicy.feed` for the new nodes. The
    engine's batched drafter follows the same law.

    Args:
        policy: the drafting policy.
        draft_probs_fn: ``prefix -> Tensor[V]``, the draft's next-token distribution.
        generator: the caller's ``torch.Generator`` (or a :class:`~adaptive_spec.rng.Sampler`);
            the draws and any random decision of the policy come from it.
        temperature / features: passed to the policy in its :class:`PolicyContext`.
    """
    sampler = as_sampler(generator)
    b = _Builder(draft_probs_fn, sampler)
    ent, top1 = row_stats(b.row(0))
    views = {0: NodeView(0, -1, -1, 0, 1.0, 1.0, ent, top1, entropy=ent, top1=top1)}
    frontier = [0] if policy.depth > 0 else []
    budget = policy.budget

    def context() -> PolicyContext:
        return PolicyContext(budget, temperature, features)

    while frontier and budget > 0:
        fv = [views[n] for n in frontier]
        widths = clip_widths(policy, fv, policy.widths(fv, context(), sampler), budget)
        new: list[int] = []
        for v, k in zip(fv, widths, strict=True):
            if k == 0:
                continue
            budget -= k
            new += _policy_children(b, v, k, policy.law is DraftLaw.DYNAMIC_WOR, views)
        if not new or budget <= 0:
            break
        nv = [views[c] for c in new]
        feed = policy.feed(nv, context(), sampler)
        if len(feed) != len(nv):
            raise ValueError(f"{type(policy).__name__}.feed returned {len(feed)} values for {len(nv)} nodes")
        frontier = []
        for v, f in zip(nv, feed, strict=True):
            if f and v.depth < policy.depth:
                v.entropy, v.top1 = row_stats(b.row(v.node))
                frontier.append(v.node)
    return b.finish(policy.shape)
