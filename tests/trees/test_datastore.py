"""The datastore (a corpus lookup, REST-style): what it proposes, its files, its errors."""

from __future__ import annotations

import numpy as np
import pytest

from adaptive_spec.planner.plan import Plan
from adaptive_spec.trees import DraftLaw
from adaptive_spec.trees.datastore import SEPARATOR, Datastore


def test_the_longest_ngram_wins_and_texts_are_not_crossed() -> None:
    ds = Datastore.from_texts([[1, 2, 3, 4, 5], [2, 3, 9]], 10, max_ngram=3)
    assert len(ds) == 8 and ds.tokens[-1] == SEPARATOR
    assert ds.candidates([7, 1, 2, 3], 2, 4) == [[4, 5]]  # "1 2 3" occurs once; its text ends after 5
    assert ds.candidates([7, 8, 2, 3], 2, 4) == [[4, 5], [9]]  # "2 3" twice; each continuation cut at its text's end
    assert ds.candidates([4, 5], 2, 3) == []  # "4 5" ends a text: nothing followed it
    ends = Datastore.from_texts([[6, 3, 6, 3], [6, 3, 5, 3]], 8)
    assert ends.candidates([5, 3, 6, 3], 2, 2) == [[6, 3], [5, 3]]  # "3 6 3" ends a text: the shorter "6 3" is used
    assert ds.candidates([3, 7], 2, 3) == []  # "3 7" and "7" never occur
    assert ds.candidates([3, 8], 2, 3) == [] and ds.candidates([2], 1, 2) == [[3, 4]]  # one token matches too
    assert ds.candidates([1, 2], 0, 3) == [] and ds.candidates([1, 2], 2, 0) == []


def test_picks_cover_the_most_hits() -> None:
    """Of the continuations of "6 3", the first covers the most (two start with 1), the next adds the most."""
    ds = Datastore.from_texts([[6, 3, 1, 7], [6, 3, 4, 4], [6, 3, 1, 2], [6, 3, 4, 5], [6, 3, 1, 2]], 8)
    assert ds.candidates([3, 6, 3], 1, 2) == [[1, 2]]  # 1 (3 hits) then 2 (2 of them)
    assert ds.candidates([3, 6, 3], 2, 2) == [[1, 2], [4, 4]]  # 4 (2 hits) then a tie of 4 4 and 4 5: the earlier
    assert ds.candidates([3, 6, 3], 9, 2) == [[1, 2], [4, 4], [1, 7], [4, 5]]  # every distinct one, once
    assert ds.candidates([3, 6, 3], 9, 2) == ds.candidates([3, 6, 3], 9, 2)  # a function of the context


def test_many_hits_are_sampled_evenly_and_checked() -> None:
    rng = np.random.default_rng(0)
    texts = [[5, 6, int(t)] for t in rng.integers(0, 4, 3000)]
    ds = Datastore.from_texts(texts, 8)
    cands = ds.candidates([5, 6], 4, 1)
    assert sorted(c[0] for c in cands) == [0, 1, 2, 3]


def test_save_and_load(tmp_path) -> None:
    for vocab in (10, 70000):  # ids in 16 bits, and not
        ds = Datastore.from_texts([[1, 2, 3, 4], [2, 3, 9]], vocab, max_ngram=3, info={"text": "test"})
        ds.save(tmp_path / "ds.npz")
        back = Datastore.load(tmp_path / "ds.npz")
        assert np.array_equal(back.tokens, ds.tokens) and back.vocab_size == vocab and back.info == {"text": "test"}
        assert (back.max_ngram, back.min_ngram) == (3, 1)
        assert back.candidates([0, 2, 3], 2, 2) == ds.candidates([0, 2, 3], 2, 2) == [[4], [9]]


def test_bad_input(tmp_path) -> None:
    with pytest.raises(ValueError, match="outside the vocabulary of 4 ids"):
        Datastore.from_texts([[1, 5]], 4)
    with pytest.raises(ValueError, match="min_ngram <= max_ngram"):
        Datastore([1, 2], 4, max_ngram=1, min_ngram=2)
    with pytest.raises(FileNotFoundError, match="not found"):
        Datastore.load(tmp_path / "none.npz")
    (tmp_path / "bad.npz").write_text("not a datastore")
    with pytest.raises(ValueError, match="is not a datastore file"):
        Datastore.load(tmp_path / "bad.npz")


def test_corpus_plan_strings() -> None:
    plan = Plan.parse("lookup:3x8+2/nss")
    assert plan.source == "lookup" and plan.corpus_paths == 2 and plan.shape.paths == 5 and plan.shape.depth == 8
    assert plan.shape.law is DraftLaw.DETERMINISTIC and plan.shape.max_nodes == 41
    assert str(plan) == "lookup:3x8+2/nss" and Plan.parse(str(plan)) == plan
    assert Plan.parse("lookup:3x8+2") == plan  # a trie's default verifier is NSS
    one = Plan.parse("lookup:0x4+1/greedy")  # the corpus alone, one path: still a trie, a function of the context
    assert one.shape.law is DraftLaw.DETERMINISTIC and str(one) == "lookup:0x4+1/greedy"
    assert str(plan.truncated(3)) == "lookup:3x3+2/nss" and str(plan.truncated(0)) == "lookup:0/nss"
    assert Plan.parse(str(plan.truncated(3))) == plan.truncated(3) and plan.for_found(1) == plan
    for bad in ("lookup:3x8+0/nss", "lookup:0x8/nss", "lookup:3x8+a/nss", "lookup:3x8+/nss"):
        with pytest.raises(ValueError, match="lookup:WxL\\+K"):
            Plan.parse(bad)
    with pytest.raises(ValueError, match="is not lossless"):
        Plan.parse("lookup:8+1/block")  # a trie: block verification reads rows it does not have
    with pytest.raises(ValueError, match="corpus_paths is for lookup tries"):
        Plan(Plan.parse("chain:2/block").shape, "block", corpus_paths=1)
