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


def test_extend_keeps_the_base_and_adds_the_shards_after_it(tmp_path, monkeypatch) -> None:
    """``--extend``: the base's texts first, only the shards after its own generated and read, its command chained,
    the prompt shards going on after the prompts it answered."""
    import transformers

    from adaptive_spec.engine import models, pretrained
    from adaptive_spec.trees.datastore import Datastore
    from adaptive_spec.zoo import datastore as zds
    from adaptive_spec.zoo import selfdistill

    calls = []

    def generate(model, tokenizer, out, *, shards, start, prompt_offset, user_prompts, **kw):
        calls.append((start, shards, prompt_offset, len(user_prompts)))
        for i in range(start, shards):
            _shard(out, i, [(f"request {i}", [4, 5, i % 3], 0.0), (f"again {i}", [2, 2, 2], 0.0)])
        return {"shards": shards, "new_answer_tokens": 6, "tok_per_s": 1.0, "device": "cpu"}

    class Tok:
        def __len__(self):
            return 10

    monkeypatch.setattr(selfdistill, "generate_conversations", generate)
    monkeypatch.setattr(models, "fetch_model", lambda name: tmp_path)
    monkeypatch.setattr(pretrained, "load_causal_lm", lambda *a, **k: __import__("torch").nn.Linear(1, 1))
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", lambda *a, **k: Tok())
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(f'{{"prompt": "question number {i}"}}\n' for i in range(7)))
    out, work = tmp_path / "ds.npz", tmp_path / "work"
    with pytest.raises(FileNotFoundError, match="--extend: no datastore at"):
        zds.build_datastore(out=out, work=work, shards=2, extend=True, prompt_files=[prompts], progress=False)
    _shard(work / "conv", 7, [("a stray shard past --shards", [9, 9], 0.0)])
    first = zds.build_datastore(out=out, work=work, shards=2, batch=2, prompt_files=[prompts], progress=False)
    assert calls[-1] == (0, 2, 0, 7) and first["shards"] == 2 and first["prompts_used"] == 2
    assert Datastore.load(out).texts() == [[4, 5, 0], [2, 2, 2], [4, 5, 1]]  # shard 7 unread, [2, 2, 2] once
    assert first["dropped_duplicates"] == 1 and first["conversations"] == 3
    with pytest.raises(ValueError, match=r"already holds shards 0..1; give --shards above 2"):
        zds.build_datastore(out=out, work=work, shards=2, extend=True, prompt_files=[prompts], progress=False)
    grown = zds.build_datastore(
        out=out, work=work, shards=5, batch=3, extend=True, prompt_files=[prompts], progress=False
    )
    # shards 2..4 only; odd shard 3 takes prompts from (3 // 2) * 3 + offset = 2 on: after the base's two
    assert calls[-1] == (2, 5, 2 - 1 * 3, 7) and grown["shards"] == 5 and grown["prompts_used"] == 5
    assert Datastore.load(out).texts() == [[4, 5, 0], [2, 2, 2], [4, 5, 1], [4, 5, 2]]
    assert grown["conversations"] == 4 and grown["dropped_duplicates"] == 1 + 5  # the base's, then 5 of 6 new
    assert grown["command"] == (
        f"adaptive-spec zoo datastore smollm2 --shards 2 --batch 2 --answer-tokens 256 --prompts {prompts} && "
        f"adaptive-spec zoo datastore smollm2 --extend --shards 5 --batch 3 --answer-tokens 256 --prompts {prompts}"
    )
