"""A real target's datastore from its conversation shards: greedy answers only, evaluation texts left out."""

from __future__ import annotations

import json

import pytest

from adaptive_spec.zoo.datastore import datastore_from_conversations
from adaptive_spec.zoo.user_prompts import demo_prompts


def _shard(folder, i, convs) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps({"request": r, "prompt_ids": [1], "answer_ids": a, "temperature": t}) for r, a, t in convs]
    (folder / f"conv-{i:05d}.jsonl").write_text("\n".join(lines) + "\n")


def test_greedy_answers_only_and_no_evaluation_text(tmp_path) -> None:
    conv = tmp_path / "conv"
    _shard(conv, 0, [("Write a haiku about rain.", [4, 5, 6, 7], 0.0), ("Tell me a joke.", [4, 5, 9, 9], 1.0)])
    _shard(conv, 1, [(demo_prompts()[1], [4, 5, 8, 8], 0.0), ("Name three rivers.", [2, 3, 4, 5, 6, 2], 0.0)])
    store = datastore_from_conversations(conv, 10)
    info = store.info
    assert info["conversations"] == 2 and info["dropped_evaluation"] == 1 and info["tokens"] == len(store) == 10
    # "4 5" was followed by 6 twice in the kept answers; 9 (sampled) and 8 (a demo prompt's answer) are not there
    assert store.candidates([0, 4, 5], 3, 2) == [[6, 7], [6, 2]]


def test_an_answer_repeated_word_for_word_is_kept_once(tmp_path) -> None:
    conv = tmp_path / "conv"
    _shard(conv, 0, [("Write a haiku about rain.", [4, 5, 6, 7], 0.0), ("Name a river.", [4, 5, 9], 0.0)])
    _shard(conv, 1, [("Write a haiku about rain.", [4, 5, 6, 7], 0.0), ("Name a lake.", [4, 5, 6], 0.0)])
    store = datastore_from_conversations(conv, 10)
    assert store.texts() == [[4, 5, 6, 7], [4, 5, 9], [4, 5, 6]]
    assert store.info["conversations"] == 3 and store.info["dropped_duplicates"] == 1
    # "4 5" was followed by 6 twice (two texts, not three) and by 9 once
    assert store.candidates([4, 5], 2, 2) == [[6, 7], [9]]


def test_no_greedy_conversation(tmp_path) -> None:
    _shard(tmp_path / "conv", 0, [("Tell me a joke.", [4, 5], 1.0)])
    with pytest.raises(ValueError, match="no greedy conversation in"):
        datastore_from_conversations(tmp_path / "conv", 10)


def test_the_committed_smollm2_datastore() -> None:
    """The shipped file loads, matches SmolLM2's vocabulary and says what it holds."""
    from adaptive_spec.engine.models import shipped_datastore
    from adaptive_spec.trees.datastore import Datastore

    store = Datastore.load(shipped_datastore("smollm2"))
    assert store.vocab_size == 49152 and len(store) == store.info["tokens"] > 100_000
    assert store.info["dropped_evaluation"] == 0 and "no benchmark text" in store.info["text"]
    assert store.info["command"].startswith("adaptive-spec zoo datastore smollm2 --shards ")
    assert store.candidates([28, 253], 2, 4)  # a common bigram of its text is followed by something
    texts = store.texts()
    assert len({tuple(t) for t in texts}) == len(texts) == store.info["conversations"]  # no answer twice
