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

A *hybrid* draft is a looked-up run extended by the model (:func:`hybrid_tree`): the chain's first
nodes have one-hot rows (their children were looked up), the rest the draft model's rows (their
children were drawn from them). Still a chain whose every child was drawn from (or is a
deterministic function of the prefix under) its row, so every chain verifier is exact for it.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from adaptive_spec.trees.shapes import TreeShape
from adaptive_spec.trees.tree import DraftTree

__all__ = ["hybrid_tree", "lookup_tree", "ngram_lookup", "ngram_match"]


def ngram_lookup(context: Sequence[int], max_tokens: int, max_ngram: int = 3, min_ngram: int = 1) -> list[int]:
    """Up to ``max_tokens`` tokens that followed the most recent earlier occurrence of the context's last n-gram.

    Tries ``n = max_ngram .. min_ngram`` and returns the continuation of the first ``n`` that matches
    (an empty list when none does). The match may overlap the end of the context, but the
    continuation never reaches past it.
    """
    return ngram_match(context, max_tokens, max_ngram, min_ngram)[0]


def ngram_match(
    context: Sequence[int], max_tokens: int, max_ngram: int = 3, min_ngram: int = 1
) -> tuple[list[int], int]:
    """``(continuation, n)``: :func:`ngram_lookup`'s tokens and the length of the n-gram that matched (0: none)."""
    if max_tokens <= 0 or len(context) < min_ngram + 1:
        return [], 0
    arr = np.asarray(context, dtype=np.int64)
    L = arr.shape[0]
    for n in range(min(max_ngram, L - 1), min_ngram - 1, -1):
        tail = arr[L - n :]
        windows = np.lib.stride_tricks.sliding_window_view(arr[: L - 1], n)  # starts 0 .. L - 1 - n
        hits = np.flatnonzero((windows == tail).all(axis=1))
        if hits.size:
            start = int(hits[-1]) + n  # the most recent match
            return arr[start : start + max_tokens].tolist(), n
    return [], 0


def lookup_tree(tokens: Sequence[int], vocab_size: int, device: torch.device | str | None = None) -> DraftTree:
    """The chain drafting ``tokens`` with one-hot draft rows (law ``CHAIN``; no tokens: the root alone)."""
    n = len(tokens)
    probs = torch.zeros(n + 1, vocab_size, dtype=torch.float32, device=device)
    if n:
        probs[torch.arange(n, device=device), torch.as_tensor(list(tokens), device=device)] = 1.0
    return DraftTree(
        tokens=[-1, *map(int, tokens)],
        parents=[-1, *range(n)],
        depths=list(range(n + 1)),
        draft_probs=probs,
        child_draws=[[i + 1] for i in range(n)] + [[]],
        shape=TreeShape.chain(n),
    )


def hybrid_tree(found: Sequence[int], tail: DraftTree) -> DraftTree:
    """The chain ``root -> found -> tail's drafted tokens``: one-hot rows over ``found``, then ``tail``'s rows.

    ``tail`` is a chain drafted by the model from the last looked-up token (its root); law ``CHAIN``.
    """
    a = len(found)
    n = a + tail.num_nodes  # the root, the looked-up tokens, then tail's root (= found[-1]) onwards
    rows = torch.zeros(a, tail.draft_probs.shape[1], dtype=tail.draft_probs.dtype, device=tail.draft_probs.device)
    if a:
        rows[torch.arange(a, device=rows.device), torch.as_tensor(list(found), device=rows.device)] = 1.0
    return DraftTree(
        tokens=[-1, *map(int, found), *tail.tokens[1:]],
        parents=[-1, *range(n - 1)],
        depths=list(range(n)),
        draft_probs=torch.cat([rows, tail.draft_probs]),
        child_draws=[[i + 1] for i in range(n - 1)] + [[]],
        shape=TreeShape.chain(n - 1),
    )
