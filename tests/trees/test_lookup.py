"""Lookup drafting (adaptive_spec.trees.lookup): the n-gram proposer, and its law verified exactly.

A lookup draft is a chain with one-hot rows (each child a deterministic function of the prefix).
Every chain verifier is exact for it: the completed output law equals the target law (TV < 1e-9)
on random instances. Negative control: the same deterministic chain handed to the verifier with
the draft model's rows instead of the one-hot rows it was drawn from is lossy.
"""

from __future__ import annotations

import random

import pytest
import torch

from adaptive_spec.analysis.exact import completed_tv, output_law
from adaptive_spec.analysis.instances import random_instance
from adaptive_spec.planner.plan import Plan
from adaptive_spec.trees import DraftLaw, DraftTree, TreeShape, sample_tree
from adaptive_spec.trees.lookup import (
    MAX_MATCH_LENGTH,
    MAX_NGRAM,
    NgramIndex,
    hybrid_tree,
    lookup_match,
    lookup_tree,
    lookup_trie,
    ngram_candidates,
    ngram_lookup,
    ngram_match,
)
from adaptive_spec.verifiers import REGISTRY
from tests.helpers.verifier_cases import trie_cases


def test_the_longest_most_recent_match_wins() -> None:
    ctx = [1, 2, 3, 9, 9, 2, 3, 7, 8, 1, 2, 3]
    assert ngram_lookup(ctx, 2) == [9, 9]  # "1 2 3" matched at the start (the 3-gram beats "2 3" ... 7 8)
    assert ngram_lookup(ctx, 2, max_ngram=2) == [7, 8]  # "2 3": the most recent earlier match
    assert ngram_lookup([4, 5, 6], 3) == []  # no earlier occurrence
    assert ngram_lookup([5, 5, 5, 5], 8) == [5]  # continuations stop at the end of the context
    assert ngram_lookup(ctx, 0) == [] and ngram_lookup([1], 4) == []
    assert ngram_match(ctx, 2) == ([9, 9], 3) and ngram_match(ctx, 2, max_ngram=2) == ([7, 8], 2)
    assert ngram_match([4, 5, 6], 3) == ([], 0)


def test_lookup_tree_is_a_one_hot_chain() -> None:
    tree = lookup_tree([3, 1, 2], vocab_size=5)
    assert tree.law is DraftLaw.CHAIN and tree.prefixes[-1] == (3, 1, 2)
    assert torch.equal(tree.draft_probs.argmax(-1)[:3], torch.tensor([3, 1, 2]))
    assert tree.draft_probs[:3].sum(-1).tolist() == [1.0, 1.0, 1.0] and tree.draft_probs[3].sum() == 0
    assert lookup_tree([], 5).num_nodes == 1


def _proposer(seed: int, vocab: int, depth: int):
    """A deterministic lookup: each drafted token a function of the prefix (as a match in the context is)."""

    def draft(_sampler) -> DraftTree:
        tokens: list[int] = []
        for _ in range(depth):
            tokens.append((seed * 7 + len(tokens) * 3 + 5 * sum(tokens)) % vocab)
        return lookup_tree(tokens, vocab, None)

    return draft


CHAIN_VERIFIERS = sorted(
    n for n, s in REGISTRY.items() if DraftLaw.CHAIN in s.laws and s.lossless and not s.greedy_only
)


@pytest.mark.parametrize("name", CHAIN_VERIFIERS)
def test_lookup_chains_are_verified_exactly(name) -> None:
    fn = REGISTRY[name].fn
    for seed in range(20):
        for vocab, depth in ((2, 2), (3, 2), (4, 3)):
            inst = random_instance(seed, vocab)
            target = lambda pre, inst=inst: inst.target_fn(pre).double()  # noqa: E731
            law = output_law(fn, _proposer(seed, vocab, depth), inst.draft_fn, target)
            tv, mass = completed_tv(law, target, vocab, depth + 1)
            assert abs(mass - 1) < 1e-12 and tv < 1e-9, (name, seed, vocab, tv)


def test_negative_control_rows_that_did_not_draw_the_child() -> None:
    """The chain is deterministic, but the verifier is told it was drawn from the draft model's rows: lossy."""
    fn = REGISTRY["block"].fn
    worst = 0.0
    for seed in range(10):
        inst = random_instance(seed, 3)
        base = _proposer(seed, 3, 2)

        def mislabelled(sampler, base=base, inst=inst):
            tree = base(sampler)
            rows = torch.stack([inst.draft_fn(p).float() for p in tree.prefixes])
            return DraftTree(tree.tokens, tree.parents, tree.depths, rows, tree.child_draws, tree.shape)

        law = output_law(fn, mislabelled, inst.draft_fn, inst.target_fn)
        worst = max(worst, completed_tv(law, inst.target_fn, 3, 3)[0])
    assert worst > 1e-3


def _hybrid(seed: int, vocab: int, a: int, b: int, draft_fn):
    """A hybrid draft: ``a`` tokens that are a function of the prefix, then ``b`` drawn from the draft model."""

    def draft(sampler) -> DraftTree:
        found: list[int] = []
        for _ in range(a):
            found.append((seed * 7 + len(found) * 3 + 5 * sum(found)) % vocab)
        prefix, tokens, rows = tuple(found), [-1], []
        for _ in range(b):
            rows.append(draft_fn(prefix))
            tokens.append(sampler.categorical(rows[-1]))
            prefix += (tokens[-1],)
        rows.append(torch.zeros_like(rows[0]))
        draws = [[i + 1] for i in range(b)] + [[]]
        tail = DraftTree(tokens, [-1, *range(b)], list(range(b + 1)), torch.stack(rows), draws, TreeShape.chain(b))
        return hybrid_tree(found, tail)

    return draft


@pytest.mark.parametrize("name", CHAIN_VERIFIERS)
def test_hybrid_chains_are_verified_exactly(name) -> None:
    fn = REGISTRY[name].fn
    for seed in range(12):
        for vocab, a, b in ((2, 1, 1), (3, 1, 2), (3, 2, 1)):
            inst = random_instance(seed, vocab)
            tree = _hybrid(seed, vocab, a, b, inst.draft_fn)(_Fixed())
            assert tree.law is DraftLaw.CHAIN and tree.draft_probs[:a].sum(-1).tolist() == [1.0] * a
            law = output_law(fn, _hybrid(seed, vocab, a, b, inst.draft_fn), inst.draft_fn, inst.target_fn)
            tv, mass = completed_tv(law, inst.target_fn, vocab, a + b + 1)
            assert abs(mass - 1) < 1e-12 and tv < 1e-9, (name, seed, vocab, a, b, tv)


def test_negative_control_hybrid_told_the_lookup_came_from_the_model() -> None:
    """The looked-up part verified against the draft model's rows instead of its one-hot rows: lossy."""
    fn = REGISTRY["block"].fn
    worst = 0.0
    for seed in range(10):
        inst = random_instance(seed, 3)
        base = _hybrid(seed, 3, 1, 1, inst.draft_fn)

        def mislabelled(sampler, base=base, inst=inst):
            tree = base(sampler)
            rows = tree.draft_probs.clone()
            rows[0] = inst.draft_fn(())
            return DraftTree(tree.tokens, tree.parents, tree.depths, rows, tree.child_draws, tree.shape)

        law = output_law(fn, mislabelled, inst.draft_fn, inst.target_fn)
        worst = max(worst, completed_tv(law, inst.target_fn, 3, 3)[0])
    assert worst > 1e-3


class _Fixed:
    """A sampler that always draws the first token of positive weight (to inspect one tree)."""

    def categorical(self, weights) -> int:
        return int((weights > 0).nonzero()[0])


# ---------------------------------------------------------------- multi-candidate lookup: a trie
def test_candidates_longest_and_most_recent_first_distinct_and_merged() -> None:
    ctx = [1, 2, 3, 4, 1, 2, 5, 6, 1, 2, 3, 7, 9, 1, 2]
    assert ngram_candidates(ctx, 3, 4) == [[3, 7, 9, 1], [5, 6, 1, 2], [3, 4, 1, 2]]
    assert ngram_candidates(ctx, 1, 4) == [ngram_lookup(ctx, 4)]  # the first candidate is the chain lookup's
    assert ngram_candidates(ctx, 9, 2) == [[3, 7], [5, 6], [3, 4]]  # every distinct continuation, no more
    # a continuation cut by the end of the context is replaced by a longer one it is a prefix of
    assert ngram_candidates([5, 6, 5, 6, 5], 2, 3) == [[6, 5, 6]]  # "5 6 5" -> 6 5 (cut), "5" earlier -> 6 5 6
    assert ngram_candidates([7, 8, 9], 3, 4) == [] and ngram_candidates(ctx, 0, 4) == []


def test_lookup_trie_merges_shared_prefixes() -> None:
    tree = lookup_trie([[3, 7, 9], [5, 6], [3, 4]], vocab_size=10, paths=3)
    assert tree.law is DraftLaw.DETERMINISTIC and str(tree.shape) == "trie:3x3"
    assert tree.prefixes == [(), (3,), (3, 7), (3, 7, 9), (5,), (5, 6), (3, 4)]
    assert tree.draft_probs[0, 3] == tree.draft_probs[0, 5] == 0.5 and tree.draft_probs[1, [7, 4]].tolist() == [
        0.5,
        0.5,
    ]
    assert lookup_trie([[3, 7]], 10, 3).law is DraftLaw.CHAIN  # one candidate: the chain
    assert lookup_trie([], 10, 3).num_nodes == 1
    assert Plan.parse("lookup:3x8").verifier == "nss" and str(Plan.parse("lookup:3x8/greedy")) == "lookup:3x8/greedy"
    with pytest.raises(ValueError, match="verifiers for 'deterministic' trees: nss"):
        Plan.parse("lookup:3x8/traversal")
    with pytest.raises(ValueError, match="found in the context"):
        Plan(TreeShape.lookup(3, 4), "nss")
    with pytest.raises(ValueError, match="sample_tree"):
        sample_tree(TreeShape.lookup(3, 4), lambda _: torch.ones(4) / 4, torch.Generator())


# The exact test of the trie's law with NSS and greedy is in tests/verifiers/test_exact.py (every
# registered (verifier, law) pair, DETERMINISTIC included). Negative controls: every verifier that
# reads the draft rows is lossy on a trie, which is why the registry refuses them.
TREE_LAWS = {DraftLaw.IID, DraftLaw.WITHOUT_REPLACEMENT}  # verifiers of branching trees (the others need a chain)
ROW_VERIFIERS = sorted(
    n
    for n, s in REGISTRY.items()
    if s.lossless and not s.greedy_only and DraftLaw.DETERMINISTIC not in s.laws and TREE_LAWS & s.laws
)


@pytest.mark.parametrize("name", ROW_VERIFIERS)
def test_negative_control_row_verifiers_are_lossy_on_a_trie(name) -> None:
    fn = REGISTRY[name].fn
    worst = 0.0
    for inst, drafter in trie_cases(12):
        law = output_law(fn, drafter, inst.draft_fn, inst.target_fn)
        worst = max(worst, completed_tv(law, inst.target_fn, inst.vocab, drafter.depth + 1)[0])
    assert worst > 1e-3, name


def test_the_first_candidate_is_not_always_ngram_lookups() -> None:
    """As ngram_candidates' docstring says: a cut-short continuation is replaced, further down, by its extension."""
    context = [1, 1, 0, 1, 2, 1, 1, 1, 1]
    assert ngram_lookup(context, 3) == [1]
    assert ngram_candidates(context, 3, 3) == [[0, 1, 2], [1, 1, 1], [2, 1, 1]]
    assert ngram_candidates([1, 2, 1, 2, 9, 1, 2, 1], 2, 4)[0] == ngram_lookup([1, 2, 1, 2, 9, 1, 2, 1], 4)


def _scan_candidates(ctx: list[int], paths: int, max_tokens: int, max_ngram: int, min_ngram: int) -> list[list[int]]:
    """ngram_candidates' contract by brute force: every earlier start of the last n-gram, longest n first, most recent
    first; a continuation that a kept one extends is skipped, one that extends kept ones replaces them."""
    if max_tokens <= 0 or paths <= 0 or len(ctx) < min_ngram + 1:
        return []
    out: list[list[int]] = []
    length = len(ctx)
    for n in range(min(max_ngram, length - 1), min_ngram - 1, -1):
        for s in range(length - 1 - n, -1, -1):
            if ctx[s : s + n] != ctx[length - n :]:
                continue
            cand = ctx[s + n : s + n + max_tokens]
            if any(kept[: len(cand)] == cand for kept in out):
                continue
            out = [kept for kept in out if cand[: len(kept)] != kept] + [cand]
            if len(out) == paths:
                return out
    return out


def _scan_match(ctx: list[int], max_tokens: int, max_ngram: int, min_ngram: int) -> tuple[list[int], int, int, int]:
    """lookup_match's contract by brute force: (continuation, n, earlier occurrences, match length)."""
    length = len(ctx)
    if max_tokens <= 0 or length < min_ngram + 1:
        return [], 0, 0, 0
    for n in range(min(max_ngram, length - 1), min_ngram - 1, -1):
        hits = [s for s in range(length - n) if ctx[s : s + n] == ctx[length - n :]]
        if hits:
            hit, agree = hits[-1], n
            while agree < MAX_MATCH_LENGTH and hit + n - agree - 1 >= 0:
                if ctx[hit + n - agree - 1] != ctx[length - agree - 1]:
                    break
                agree += 1
            return ctx[hit + n : hit + n + max_tokens], n, len(hits), agree
    return [], 0, 0, 0


def test_the_ngram_index_finds_what_a_scan_of_the_context_finds() -> None:
    """NgramIndex (what the engine searches each step) against brute force: one-shot, and following a context
    that grows, shrinks and has its last token replaced between lookups."""
    rng = random.Random(0)
    for _ in range(1500):
        ctx = [rng.randrange(rng.choice([2, 3, 6])) for _ in range(rng.randrange(0, 40))]
        mx, mn = rng.choice([1, 2, 3, 4]), rng.choice([1, 1, 2])
        paths, depth = rng.choice([0, 1, 2, 3, 5]), rng.choice([0, 1, 3, 8])
        assert ngram_candidates(ctx, paths, depth, mx, mn) == _scan_candidates(ctx, paths, depth, mx, mn)
        m = lookup_match(ctx, depth, mx, mn)
        assert (m.tokens, m.ngram, m.matches, m.match_length) == _scan_match(ctx, depth, mx, mn)
    for _ in range(150):
        vocab, ctx = rng.choice([2, 3, 5]), []
        index = NgramIndex(ctx)
        for _ in range(40):
            r = rng.random()
            if r < 0.1 and ctx:
                del ctx[rng.randrange(len(ctx)) :]
            elif r < 0.2 and ctx:
                ctx[-1] = (ctx[-1] + 1) % vocab
            else:
                ctx.extend(rng.randrange(vocab) for _ in range(rng.randrange(0, 4)))
            assert index.candidates(3, 6) == _scan_candidates(ctx, 3, 6, MAX_NGRAM, 1)
            m = index.match(64, max_ngram=2)
            assert (m.tokens, m.ngram, m.matches, m.match_length) == _scan_match(ctx, 64, 2, 1)
    with pytest.raises(ValueError, match="n-grams up to 3 tokens, not 4"):
        NgramIndex([1, 2, 1, 2]).candidates(2, 3, max_ngram=4)
