"""Drafting from the context: n-gram lookup (prompt lookup decoding).

The draft of a lookup step is found, not sampled: the last ``n`` tokens of the context (prompt and
generated text) are searched for earlier in the context, and the tokens that followed the most
recent match are proposed (transformers' ``prompt_lookup_num_tokens``, vLLM's n-gram proposer,
llama.cpp's lookup decoding). The longest ``n`` from ``max_ngram`` down to ``min_ngram`` that
matches wins.

As a drafting law it is a chain whose rows are one-hot: node ``i``'s row puts probability 1 on
its child, a deterministic function of the prefix. Every chain verifier is exact for it (the
proofs hold for any draft row the child was drawn from); at temperature 0 the greedy verifier
applies as for any tree. :func:`lookup_tree` builds that :class:`DraftTree`.

A *multi-candidate* lookup proposes several distinct continuations at once (:func:`ngram_candidates`:
the most recent matches of the longest n-gram first, then older and shorter ones), merged into a
trie by :func:`lookup_trie` (law ``DETERMINISTIC``: distinct children that are a function of the
context). Its rows carry no draw, so only verifiers that ignore them are exact for it: NSS (draw
the target's token, follow it while it is a child; optimal for deterministic candidates) and
greedy at temperature 0.

A *hybrid* draft is a looked-up run extended by the model (:func:`hybrid_tree`): the chain's first
nodes have one-hot rows (their children were looked up), the rest the draft model's rows (their
children were drawn from them). Still a chain whose every child was drawn from (or is a
deterministic function of the prefix under) its row, so every chain verifier is exact for it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from adaptive_spec.trees.shapes import DraftLaw, TreeShape
from adaptive_spec.trees.tree import DraftTree, ancestor_masks, unpack_masks

__all__ = [
    "MAX_NGRAM",
    "LookupMatch",
    "NgramIndex",
    "hybrid_tree",
    "lookup_match",
    "lookup_tree",
    "lookup_trie",
    "ngram_candidates",
    "ngram_lookup",
    "ngram_match",
    "within_vocab",
]


MAX_NGRAM = 3  # the longest n-gram matched (the default max_ngram below)


def ngram_lookup(context: Sequence[int], max_tokens: int, max_ngram: int = MAX_NGRAM, min_ngram: int = 1) -> list[int]:
    """Up to ``max_tokens`` tokens that followed the most recent earlier occurrence of the context's last n-gram.

    Tries ``n = max_ngram .. min_ngram`` and returns the continuation of the first ``n`` that matches
    (an empty list when none does). The match may overlap the end of the context, but the
    continuation never reaches past it.
    """
    return ngram_match(context, max_tokens, max_ngram, min_ngram)[0]


def ngram_match(
    context: Sequence[int], max_tokens: int, max_ngram: int = MAX_NGRAM, min_ngram: int = 1
) -> tuple[list[int], int]:
    """``(continuation, n)``: :func:`ngram_lookup`'s tokens and the length of the n-gram that matched (0: none)."""
    found = lookup_match(context, max_tokens, max_ngram, min_ngram)
    return found.tokens, found.ngram


@dataclass(frozen=True)
class LookupMatch:
    """What a lookup in the context finds (:func:`lookup_match`).

    Attributes:
        tokens: the continuation of the most recent match of the longest n-gram (empty: none).
        ngram: the length of that n-gram (0: no match).
        matches: how many earlier occurrences that n-gram has.
        match_length: how far back the most recent occurrence agrees with the end of the context
            (at least ``ngram``; capped at :data:`MAX_MATCH_LENGTH`): SAM-Decoding's match length.
    """

    tokens: list[int]
    ngram: int
    matches: int = 0
    match_length: int = 0


MAX_MATCH_LENGTH = 32


def lookup_match(
    context: Sequence[int], max_tokens: int, max_ngram: int = MAX_NGRAM, min_ngram: int = 1
) -> LookupMatch:
    """The continuation :func:`ngram_lookup` proposes, with the n-gram, its number of matches and the match length."""
    return NgramIndex(list(map(int, context)), max_ngram).match(max_tokens, max_ngram, min_ngram)


def ngram_candidates(
    context: Sequence[int], paths: int, max_tokens: int, max_ngram: int = MAX_NGRAM, min_ngram: int = 1
) -> list[list[int]]:
    """Up to ``paths`` distinct continuations of up to ``max_tokens`` tokens that followed the context's last n-gram.

    Matches of the longest ``n`` come first, the most recent first, then those of shorter n-grams;
    a continuation that is a prefix of one already kept (or equal to it) adds nothing and is
    skipped, and one that extends kept ones replaces them, taking its own place at the end of the
    list. So :func:`ngram_lookup`'s continuation is the first candidate unless a later match's
    continuation extends it (it was cut short by the end of the context): then that extension
    replaces it further down, and the first candidate is another match's; e.g. after
    ``[1, 1, 0, 1, 2, 1, 1, 1, 1]`` with 3 tokens, ``ngram_lookup`` finds ``[1]`` and the
    candidates are ``[[0, 1, 2], [1, 1, 1], [2, 1, 1]]``.

    One call indexes the whole context; a context searched at every step keeps an :class:`NgramIndex`.
    """
    return NgramIndex(list(map(int, context)), max_ngram).candidates(paths, max_tokens, max_ngram, min_ngram)


class NgramIndex:
    """Where each n-gram (``n = 1 .. max_ngram``) of a growing context starts, so that a lookup visits its matches
    and never scans the context (:meth:`candidates`, :meth:`match`: :func:`ngram_candidates` and
    :func:`lookup_match` on the context as it is now).

    ``context``: the list searched, held by reference, not copied. A lookup first indexes the tokens appended
    since the last one (a few dictionary inserts a token): the engine keeps one over a request's committed
    context (``EngineState.ngrams``), which only grows. Between two lookups the context may grow, have its last
    token replaced, or get shorter (then it is indexed again from the start); a context cut and grown back
    past its old length between two lookups is not seen: make a new index.
    """

    def __init__(self, context: list[int], max_ngram: int = MAX_NGRAM) -> None:
        self.context = context
        self.max_ngram = max_ngram
        self._reset()

    def _reset(self) -> None:
        # _starts[n - 1][gram]: the ascending starts of ``gram`` (n tokens) that end before the context's last token
        self._starts: list[dict[tuple[int, ...], list[int]]] = [{} for _ in range(self.max_ngram)]
        self._indexed = 0  # the context's length when last indexed

    def _sync(self) -> list[int]:
        """Index the tokens appended since the last lookup; the context."""
        ctx, done = self.context, self._indexed
        length = len(ctx)
        if length < done:
            self._reset()
            done = 0
        if length > done:  # (an n-gram indexed ends before the context's last token: replacing that token is seen)
            for n, starts in enumerate(self._starts, 1):
                for s in range(max(0, done - n), length - n):  # starts s with s + n <= length - 1: a token follows
                    starts.setdefault(tuple(ctx[s : s + n]), []).append(s)
            self._indexed = length
        return ctx

    def _hits(self, max_ngram: int | None, min_ngram: int):
        """``(n, starts)`` for ``n`` from the longest down to ``min_ngram``: the earlier starts of the context's last
        n-gram, ascending (empty when it has none). The context is indexed (:meth:`_sync`).
        """
        ctx = self.context  # indexed by the caller
        top = self.max_ngram if max_ngram is None else max_ngram
        if top > self.max_ngram:
            raise ValueError(f"this index holds n-grams up to {self.max_ngram} tokens, not {top}")
        length = len(ctx)
        for n in range(min(top, length - 1), min_ngram - 1, -1):
            yield n, self._starts[n - 1].get(tuple(ctx[length - n :]), ())

    def candidates(
        self, paths: int, max_tokens: int, max_ngram: int | None = None, min_ngram: int = 1
    ) -> list[list[int]]:
        """:func:`ngram_candidates` of the context now (``max_ngram``: at most the index's, its by default)."""
        ctx = self._sync()
        if max_tokens <= 0 or paths <= 0 or len(ctx) < min_ngram + 1:
            return []
        out: list[list[int]] = []
        for n, starts in self._hits(max_ngram, min_ngram):
            for hit in reversed(starts):  # the most recent first
                start = hit + n
                cand = ctx[start : start + max_tokens]
                if not any(kept[: len(cand)] == cand for kept in out):
                    out = [kept for kept in out if cand[: len(kept)] != kept]  # cand extends them
                    out.append(cand)
                    if len(out) == paths:
                        return out
        return out

    def match(self, max_tokens: int, max_ngram: int | None = None, min_ngram: int = 1) -> LookupMatch:
        """:func:`lookup_match` of the context now (``max_ngram``: at most the index's, its by default)."""
        ctx = self._sync()
        if max_tokens <= 0 or len(ctx) < min_ngram + 1:
            return LookupMatch([], 0)
        end = len(ctx)
        for n, starts in self._hits(max_ngram, min_ngram):
            if starts:
                hit = starts[-1]  # the most recent match
                back = min(hit, MAX_MATCH_LENGTH - n)  # extend the match leftwards
                agree = 0
                while agree < back and ctx[hit - 1 - agree] == ctx[end - n - 1 - agree]:
                    agree += 1
                return LookupMatch(ctx[hit + n : hit + n + max_tokens], n, len(starts), n + agree)
        return LookupMatch([], 0)


def within_vocab(candidates: Sequence[Sequence[int]], vocab_size: int) -> list[list[int]]:
    """Each candidate cut before its first id outside ``[0, vocab_size)`` (empty ones dropped, duplicates merged).

    A prompt may hold ids that the target's input embeddings know but its LM head does not (an
    embedding table larger than the head): the target gives them probability 0, so a draft
    never proposes them, and a draft row (``vocab_size`` wide) has no column for them.
    """
    out: list[list[int]] = []
    for cand in candidates:
        cut = list(cand)
        for i, tok in enumerate(cut):
            if not 0 <= tok < vocab_size:
                cut = cut[:i]
                break
        if cut and cut not in out:
            out.append(cut)
    return out


def lookup_trie(
    candidates: Sequence[Sequence[int]], vocab_size: int, paths: int, device: torch.device | str | None = None
) -> DraftTree:
    """The trie of ``candidates`` (law ``DETERMINISTIC``, shape ``TreeShape.lookup(paths, depth)``).

    Shared prefixes are merged; a node's children keep the order in which the candidates first
    reach them. Each expanded node's row spreads its mass evenly over its children (the
    candidates' empirical law; no verifier of this law reads it). One candidate or none: a chain.
    """
    depth = max((len(c) for c in candidates), default=0)
    shape = TreeShape.lookup(paths, depth)
    if len(candidates) <= 1:
        return lookup_tree(candidates[0] if candidates else [], vocab_size, device)
    tokens, parents, depths, child_draws = _trie_structure(candidates)
    return _on_device(tokens, parents, depths, child_draws, vocab_size, shape, device)


def _trie_structure(candidates: Sequence[Sequence[int]]) -> tuple[list[int], list[int], list[int], list[list[int]]]:
    """``(tokens, parents, depths, child_draws)`` of the trie of ``candidates`` (:func:`lookup_trie`'s numbering)."""
    tokens, parents, depths, child_draws = [-1], [-1], [0], [[]]
    index: dict[tuple[int, int], int] = {}  # (parent, token) -> node
    for cand in candidates:
        node = 0
        for tok in map(int, cand):
            child = index.get((node, tok))
            if child is None:
                child = index[(node, tok)] = len(tokens)
                tokens.append(tok)
                parents.append(node)
                depths.append(depths[node] + 1)
                child_draws.append([])
                child_draws[node].append(child)
            node = child
    return tokens, parents, depths, child_draws


def trie_with_path(
    candidates: Sequence[Sequence[int]],
    path: torch.Tensor,
    vocab_size: int,
    paths: int,
    device: torch.device | str,
    leaves: torch.Tensor | None = None,
    queued: bool = False,
) -> DraftTree:
    """The trie of ``candidates`` with a path drafted apart, ``path`` (LongTensor[D] on ``device``, not read).
    ``queued``: on CUDA the structure's copy is queued behind the work before it (the path's draft) instead of
    waiting for that work (:func:`_on_device`).

    Nodes ``1 .. D`` are the path's (node ``i`` its ``i``-th token, the root's first child), then ``leaves``'
    (LongTensor[B] on ``device``, not read: more children of the root, one token each: ``lookup:WxL+mAxD``'s other
    B = A - 1 top tokens of the draft), then the trie's nodes as :func:`lookup_trie` numbers them after the root.
    The path and the leaves are not merged into the trie, since their tokens stay on the device: a trie child
    holding the same token as one of them is its sibling, and the walks of NSS and greedy verification take such
    siblings as one node (:func:`adaptive_spec.verifiers.walk.follow_choices`), so the tree verifies as the merged
    trie would. The structure and the trie's tokens go over in one copy; the tokens are read with the verifier's
    read. Law ``DETERMINISTIC`` (paths that are functions of the context: the draft model's greedy chain and its
    top tokens at the root, ``lookup:WxL+mD``, ``lookup:WxL+mAxD``).
    """
    b = 0 if leaves is None else int(leaves.numel())
    d = int(path.numel())
    tokens, parents, depths = [-1, *([0] * d)], [-1, *range(d)], list(range(d + 1))
    child_draws = [[1], *([[i + 2] for i in range(d - 1)]), []]  # the path's first token is the root's first child
    if b:  # the leaves: nodes d + 1 .. d + b, children of the root after the path's first node
        tokens, parents, depths = tokens + [0] * b, parents + [0] * b, depths + [1] * b
        child_draws[0] += [d + 1 + i for i in range(b)]
        child_draws += [[] for _ in range(b)]
        path = torch.cat([path, leaves])
        d += b
    trie_tokens, trie_parents, trie_depths, trie_draws = _trie_structure(candidates)  # trie node j > 0: node j + d
    tokens += trie_tokens[1:]
    parents += [par + d if par > 0 else 0 for par in trie_parents[1:]]
    depths += trie_depths[1:]
    child_draws[0] += [c + d for c in trie_draws[0]]
    child_draws += [[c + d for c in kids] for kids in trie_draws[1:]]
    shape = TreeShape(DraftLaw.DETERMINISTIC, trunk=0, paths=paths, branch_len=max(depths))
    return _on_device(tokens, parents, depths, child_draws, vocab_size, shape, device, path=path, queued=queued)


def lookup_tree(tokens: Sequence[int], vocab_size: int, device: torch.device | str | None = None) -> DraftTree:
    """The chain drafting ``tokens`` with one-hot draft rows (law ``CHAIN``; no tokens: the root alone)."""
    n = len(tokens)
    toks = [-1, *map(int, tokens)]
    child_draws = [[i + 1] for i in range(n)] + [[]]
    return _on_device(toks, [-1, *range(n)], list(range(n + 1)), child_draws, vocab_size, TreeShape.chain(n), device)


def _on_device(
    tokens: list[int],
    parents: list[int],
    depths: list[int],
    child_draws: list[list[int]],
    vocab_size: int,
    shape: TreeShape,
    device: torch.device | str | None,
    path: torch.Tensor | None = None,
    queued: bool = False,
) -> DraftTree:
    """A looked-up tree whose device copies (tokens, parents, depths, ancestor matrix, the rows' nonzero entries:
    each row even over its children) go over in one copy; the tree keeps them, so nothing copies them again.

    ``path``: nodes ``1 .. D``'s tokens, already on the device (:func:`trie_with_path`; ``tokens`` holds
    placeholders there): the tree's tokens stay on the device and come back with the verifier's read.
    ``queued``: on CUDA the copy goes from pinned memory without blocking, queued behind the work before it (a
    copy from pageable memory waits for that work to finish: the path's draft replay, while the host could be
    queueing the target's pass); elsewhere, or without it, a plain copy.
    """
    n = len(tokens)
    src = [node for node, kids in enumerate(child_draws) for _ in kids]  # the rows' nonzero entries: (src, dst, w)
    dst = [c for kids in child_draws for c in kids]
    m = len(src)
    host = np.empty(3 * n + 3 * m + n * n)  # float64: ids < 2**53 are exact
    host[: 3 * n + 2 * m] = [*tokens, *parents, *depths, *src, *dst]
    host[3 * n + 2 * m : 3 * n + 3 * m] = [1.0 / len(child_draws[i]) for i in src]
    host[3 * n + 3 * m :] = unpack_masks(ancestor_masks(parents)).ravel()
    flat = torch.from_numpy(host)
    if queued and torch.device(device).type == "cuda":  # the one copy, behind the draft's replay
        flat = flat.pin_memory().to(device, non_blocking=True)
    else:  # the one copy (none on a CPU)
        flat = flat.to(device)
    ints = flat[: 3 * n + 2 * m].long()
    t, par, dep = ints[: 3 * n].view(3, n)
    if path is not None:
        t = torch.cat([t[:1], path.to(torch.long), t[1 + path.numel() :]])
    probs = torch.zeros(n, vocab_size, dtype=torch.float32, device=flat.device)
    if m:
        probs[ints[3 * n : 3 * n + m], t[ints[3 * n + m :]]] = flat[3 * n + 2 * m : 3 * n + 3 * m].float()
    ancestors = flat[3 * n + 3 * m :].view(n, n).bool()
    tree = DraftTree(tokens if path is None else t, parents, depths, probs, child_draws, shape)
    tree.keep_tensors(tokens=t, parents=par, depths=dep, ancestors=ancestors)
    return tree


def hybrid_tree(found: Sequence[int], tail: DraftTree, found_ids: torch.Tensor | None = None) -> DraftTree:
    """The chain ``root -> found -> tail's drafted tokens``: one-hot rows over ``found``, then ``tail``'s rows.

    ``tail`` is a chain drafted by the model from the last looked-up token (its root); law ``CHAIN``.
    ``found_ids``: ``found`` already on the rows' device (LongTensor[a]); with a tail drawn there, the hybrid's
    tokens stay there too (nothing is read or copied).
    """
    a = len(found)
    n = a + tail.num_nodes  # the root, the looked-up tokens, then tail's root (= found[-1]) onwards
    device = tail.draft_probs.device
    ids = found_ids if found_ids is not None else torch.as_tensor(list(found), dtype=torch.long, device=device)
    rows = torch.zeros(a, tail.draft_probs.shape[1], dtype=tail.draft_probs.dtype, device=device)
    if a:
        rows[torch.arange(a, device=device), ids] = 1.0
    if tail.tokens_on_host:
        tokens: list[int] | torch.Tensor = [-1, *map(int, found), *tail.tokens[1:]]
    else:  # drawn on the device: keep them there (the tail's root row holds -1)
        tail_t = tail.tokens_tensor(device)
        tokens = torch.cat([tail_t[:1], ids, tail_t[1:]])
    tree = DraftTree(
        tokens=tokens,
        parents=[-1, *range(n - 1)],
        depths=list(range(n)),
        draft_probs=torch.cat([rows, tail.draft_probs]),
        child_draws=[[i + 1] for i in range(n - 1)] + [[]],
        shape=TreeShape.chain(n - 1),
    )
    depths = torch.arange(n, device=device)
    tree.keep_tensors(parents=depths - 1, depths=depths, children=(depths + 1)[:, None])  # the last: none (n)
    return tree
