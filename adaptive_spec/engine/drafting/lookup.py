"""Trees looked up in the committed context or a datastore (:mod:`adaptive_spec.trees.lookup`): alone
(:func:`lookup_outcome`, no draft forward), with the draft's greedy path beside the trie
(:func:`draft_lookup_model`), or as a hybrid's looked-up trunk that the draft continues (:func:`draft_hybrid`).
"""

from __future__ import annotations

import torch

from adaptive_spec.engine.drafting.base import DraftOutcome, DraftRoot, draft_root
from adaptive_spec.engine.drafting.static import captured_chain, chain_outcome, draft_tree
from adaptive_spec.engine.eagle import EagleRunner
from adaptive_spec.engine.logits import ProbsFn, finite_flag
from adaptive_spec.engine.runner import ModelRunner
from adaptive_spec.trees import TreeShape
from adaptive_spec.trees.datastore import Datastore
from adaptive_spec.trees.lookup import (
    NgramIndex,
    hybrid_tree,
    lookup_trie,
    trie_with_path,
    within_vocab,
)


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
            tail = chain_outcome(root, chain, [tail_rows], [tokens], runner.device)
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
