"""Drafting from a corpus: continuations of the context's last n-gram in text the target wrote (REST).

A :class:`Datastore` is a fixed array of token ids (texts separated by :data:`SEPARATOR`) with an
index of its n-grams. Given a context, :meth:`Datastore.candidates` finds the earlier occurrences
of the context's last ``n`` tokens in the corpus (the longest ``n`` from ``max_ngram`` down to
``min_ngram`` that occurs), reads the ``max_tokens`` that followed each, and picks ``paths``
distinct continuations that cover the most of what followed: greedily, each next one adds the
most hits of the prefixes it does not share with those already picked (the trie of the picked
continuations then holds as many of the hits' prefixes, weighted by their counts, as ``paths``
continuations can). He et al. 2024, *REST: Retrieval-Based Speculative Decoding*, draft from such
a datastore; here its text is the target's own greedy answers to self-written requests
(:mod:`adaptive_spec.zoo.selfdistill`), never a benchmark's or the demo's.

Like a lookup in the context (:mod:`adaptive_spec.trees.lookup`), the draft is found, not
sampled: the continuations are a deterministic function of the context (the corpus is fixed),
so their trie has law ``DETERMINISTIC`` and NSS, or greedy at temperature 0, verifies it exactly.
A plan ``lookup:WxL+K/nss`` merges ``W`` continuations found in the context with ``K`` found here.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

__all__ = ["SEPARATOR", "Datastore"]

SEPARATOR = -1  # between two texts of the corpus: no n-gram and no continuation crosses it
_MAX_HITS = 512  # occurrences read per lookup (evenly spaced over all of them: a function of the context)
_P = np.uint64(0x9E3779B97F4A7C15)  # the n-gram hash's multiplier (odd; a collision is checked away)


class Datastore:
    """A corpus of token ids and its n-gram index; :meth:`candidates` drafts from it.

    Args:
        tokens: the corpus, texts separated by :data:`SEPARATOR` (ids ``>= 0`` otherwise).
        vocab_size: the size of the vocabulary the ids belong to (checked against the target's on use).
        max_ngram, min_ngram: the longest and shortest n-gram of the context matched (longest first).
        info: free-form provenance kept with the file (what text, which model, how many texts).

    Raises:
        ValueError: an id outside ``[0, vocab_size)`` (other than the separator), or bad n-gram bounds.
    """

    def __init__(
        self,
        tokens: Sequence[int] | np.ndarray,
        vocab_size: int,
        *,
        max_ngram: int = 4,
        min_ngram: int = 1,
        info: dict | None = None,
    ) -> None:
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"datastore: want 1 <= min_ngram <= max_ngram, got {min_ngram} and {max_ngram}")
        arr = np.asarray(tokens, dtype=np.int64).reshape(-1)
        bad = (arr != SEPARATOR) & ((arr < 0) | (arr >= vocab_size))
        if bad.any():
            raise ValueError(
                f"datastore: id {int(arr[bad][0])} is outside the vocabulary of {vocab_size} ids; "
                "was it built with another tokenizer?"
            )
        self.tokens = np.concatenate([arr, np.full(1, SEPARATOR, np.int64)])  # a last separator ends every text
        self.vocab_size = int(vocab_size)
        self.max_ngram, self.min_ngram = int(max_ngram), int(min_ngram)
        self.info = dict(info or {})
        self._index = {n: self._build(n) for n in range(self.min_ngram, self.max_ngram + 1)}

    # ----------------------------------------------------------------- building and files
    @classmethod
    def from_texts(cls, texts: Iterable[Sequence[int]], vocab_size: int, **kw) -> Datastore:
        """A datastore of token-id ``texts`` (each a list of ids), separated."""
        parts: list[int] = []
        for text in texts:
            parts.extend(int(t) for t in text)
            parts.append(SEPARATOR)
        return cls(parts, vocab_size, **kw)

    def save(self, path: str | Path) -> None:
        """Write the corpus and its settings to ``path`` (``.npz``; the index is rebuilt on load)."""
        from adaptive_spec.files import atomic_write

        small = self.vocab_size < 2**16 - 1  # ids and the separator (as 65535) in 16 bits
        data = np.where(self.tokens == SEPARATOR, 2**16 - 1, self.tokens).astype(np.uint16) if small else self.tokens
        meta = {"vocab_size": self.vocab_size, "max_ngram": self.max_ngram, "min_ngram": self.min_ngram}
        text = np.array(json.dumps({**meta, "info": self.info}))
        atomic_write(path, lambda f: np.savez_compressed(f, tokens=data[:-1], meta=text))

    @classmethod
    def load(cls, path: str | Path) -> Datastore:
        """The datastore :meth:`save` wrote to ``path``.

        Raises:
            FileNotFoundError: no such file. ValueError: not a datastore file (one line naming it).
        """
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"datastore {path} not found")
        try:
            with np.load(path, allow_pickle=False) as f:
                meta = json.loads(str(f["meta"]))
                tokens = f["tokens"].astype(np.int64)
        except (OSError, ValueError, KeyError) as err:
            raise ValueError(f"{path} is not a datastore file (written by Datastore.save): {err}") from None
        if tokens.size and meta["vocab_size"] < 2**16 - 1:
            tokens[tokens == 2**16 - 1] = SEPARATOR
        kw = {"max_ngram": meta["max_ngram"], "min_ngram": meta["min_ngram"], "info": meta.get("info")}
        return cls(tokens, meta["vocab_size"], **kw)

    def texts(self) -> list[list[int]]:
        """The corpus's texts, in order (each a list of ids, separators dropped)."""
        cuts = np.flatnonzero(self.tokens == SEPARATOR)
        starts = np.concatenate([[0], cuts[:-1] + 1])
        return [self.tokens[a:b].tolist() for a, b in zip(starts, cuts, strict=True) if b > a]

    def sample(self, fraction: float, seed: int = 0) -> Datastore:
        """A datastore of a random ``fraction`` of the texts (at least one; seeded; their order kept), same settings.

        Raises:
            ValueError: ``fraction`` outside ``(0, 1]``.
        """
        if not 0 < fraction <= 1:
            raise ValueError(f"datastore: a fraction of its texts is in (0, 1], got {fraction}")
        texts = self.texts()
        if fraction == 1 or not texts:
            return self
        k = max(1, round(len(texts) * fraction))
        keep = np.sort(np.random.default_rng(seed).choice(len(texts), size=k, replace=False))
        info = {**self.info, "sampled": {"fraction": fraction, "seed": seed, "texts": k}}
        kw = {"max_ngram": self.max_ngram, "min_ngram": self.min_ngram, "info": info}
        return Datastore.from_texts([texts[i] for i in keep], self.vocab_size, **kw)

    def __len__(self) -> int:
        """Tokens in the corpus (separators excluded)."""
        return int((self.tokens != SEPARATOR).sum())

    def __repr__(self) -> str:
        return f"Datastore({len(self)} tokens, vocab {self.vocab_size}, n-grams {self.min_ngram}..{self.max_ngram})"

    def _build(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """The sorted hashes of every n-gram that crosses no separator and is followed by an id (not the end of its
        text), and where each starts (in order).
        """
        arr = self.tokens
        if arr.size < n + 1:
            return np.zeros(0, np.uint64), np.zeros(0, np.int64)
        windows = np.lib.stride_tricks.sliding_window_view(arr, n)[:-1]  # windows[i] is followed by arr[i + n]
        keep = np.flatnonzero((windows != SEPARATOR).all(axis=1) & (arr[n:] != SEPARATOR))
        keys = _hash(windows[keep])
        order = np.argsort(keys, kind="stable")  # equal keys keep the order of their positions
        return keys[order], keep[order]

    # ----------------------------------------------------------------- drafting
    def candidates(self, context: Sequence[int], paths: int, max_tokens: int) -> list[list[int]]:
        """Up to ``paths`` distinct continuations of up to ``max_tokens`` ids that followed the context's last n-gram.

        The longest n-gram of the context's end that occurs in the corpus followed by something is used (none: no
        candidate).
        Of its occurrences (at most 512, evenly spaced), each continuation is cut before a separator; the
        picked ones cover the most occurrences' prefixes, greedily (a tie goes to the earlier occurrence).
        A deterministic function of ``context``.
        """
        if paths <= 0 or max_tokens <= 0:
            return []
        ctx = np.asarray(context[-self.max_ngram :], dtype=np.int64)
        for n in range(min(self.max_ngram, ctx.size), self.min_ngram - 1, -1):
            starts = self._occurrences(ctx[ctx.size - n :])
            if starts.size:
                return self._pick(starts + n, paths, max_tokens)
        return []

    def _occurrences(self, gram: np.ndarray) -> np.ndarray:
        keys, starts = self._index[gram.size]
        key = _hash(gram[None])[0]
        lo, hi = np.searchsorted(keys, key, side="left"), np.searchsorted(keys, key, side="right")
        found = starts[lo:hi]
        if found.size > _MAX_HITS:
            found = found[np.linspace(0, found.size - 1, _MAX_HITS).round().astype(np.int64)]
        same = (self.tokens[found[:, None] + np.arange(gram.size)] == gram).all(axis=1)  # a hash collision fails
        return found[same]

    def _pick(self, at: np.ndarray, paths: int, max_tokens: int) -> list[list[int]]:
        end = self.tokens.size
        idx = np.minimum(at[:, None] + np.arange(max_tokens), end - 1)
        conts = self.tokens[idx]  # (hits, L)
        valid = np.cumprod(conts != SEPARATOR, axis=1).astype(bool)  # cut at the first separator
        if not valid[:, 0].any():
            return []
        # a prefix's id: the hash of its ids (rows of equal prefixes share it); its weight: how many hits share it
        prefix = _prefix_hashes(conts)
        ids = prefix[valid]
        uniq, inverse, counts = np.unique(ids, return_inverse=True, return_counts=True)
        weight = np.zeros(prefix.shape, np.int64)
        weight[valid] = counts[inverse]
        node = np.full(prefix.shape, -1, np.int64)
        node[valid] = inverse
        covered = np.zeros(uniq.size, bool)
        out: list[list[int]] = []
        for _ in range(paths):
            gain = np.where(valid & ~covered[np.maximum(node, 0)], weight, 0).sum(axis=1)
            best = int(np.argmax(gain))  # the first of equal gains: the earliest occurrence
            if gain[best] <= 0:
                break
            length = int(valid[best].sum())
            covered[node[best, :length]] = True
            out.append(conts[best, :length].tolist())
        return out


def _prefix_hashes(rows: np.ndarray) -> np.ndarray:
    """``out[i, j]``: a 64-bit hash of ``rows[i, : j + 1]`` (wrapping arithmetic; equal prefixes, equal hashes)."""
    out = np.zeros(rows.shape, np.uint64)
    h = np.zeros(rows.shape[0], np.uint64)
    with np.errstate(over="ignore"):
        for j in range(rows.shape[1]):
            h = h * _P + rows[:, j].astype(np.uint64) + np.uint64(1)
            out[:, j] = h
    return out


def _hash(rows: np.ndarray) -> np.ndarray:
    """A 64-bit hash of each row of ids."""
    return _prefix_hashes(rows)[:, -1]
