"""Online distillation with a tiny target and a tiny EAGLE head.

- the engine's draft-data log holds, for every committed position, the token, the target's teacher-forced
  feature and its top-k law (from the prompt's last token on); shards are atomic and a stopped log resumes;
- at T = 0, ``chain:1/block``'s acceptance equals the head's teacher-forced top-1 over the same positions, step
  by step; misaligned features (negative control) break the equality;
- a head fine-tuned on a log gets closer to the target on it.
"""

from __future__ import annotations

import pytest
import torch

from adaptive_spec.engine import SpecEngine
from adaptive_spec.engine.draft_data import log_draft_data
from adaptive_spec.formats.draft_log import DraftDataLogger, logged_keys, read_draft_log
from adaptive_spec.zoo.online import chain1_consistency, records_to_shard, split_records, take_tokens
from tests.engine.test_eagle import make_head
from tests.helpers.tiny import tiny_model

PROMPTS = [[3, 5, 2, 7], [1, 4], [6, 6, 0, 2, 5, 3], [2]]


@pytest.fixture(scope="module")
def pair():
    target = tiny_model("llama", vocab=8, hidden=16, eos=None, init_range=0.5, seed=11, layers=1)
    return target, make_head(target, 6, [0, 1, 2, 3, 5, 6], seed=2, init=0.5)


def _teacher_forced(target, ids):
    seen = []
    handle = target.lm_head.register_forward_pre_hook(lambda _m, a: seen.append(a[0]))
    with torch.inference_mode():
        logits = target(input_ids=torch.tensor([ids])).logits[0]
    handle.remove()
    return seen[0][0], torch.softmax(logits.float(), -1)


@pytest.mark.parametrize("plan", ["chain:3/block", "wor:2x2/traversal"])
def test_the_log_holds_the_targets_features_and_laws(pair, tmp_path, plan) -> None:
    target, head = pair
    engine = SpecEngine(target, head)
    log_draft_data(engine, tmp_path / "log", top_k=4, shard_tokens=30)
    outs = []
    for i, prompt in enumerate(PROMPTS):
        engine.draft_data.prompt_index = i
        outs.append(engine.generate(prompt, max_new_tokens=20, temperature=0.8, plan=plan, seed=i))
    engine.close()
    recs = sorted(read_draft_log(tmp_path / "log"), key=lambda r: r["prompt_index"])
    assert len(recs) == len(PROMPTS) and len(list((tmp_path / "log").glob("shard-*.parquet"))) >= 2
    for prompt, out, r in zip(PROMPTS, outs, recs, strict=True):
        full = prompt + out.token_ids
        n = r["ids"].numel()
        assert r["ids"].tolist() == full[:n] and n >= len(full) - 1 - 3  # all but the last step's bonus and cut
        feat, probs = _teacher_forced(target, full[:n])
        assert torch.allclose(r["feat"].float(), feat, atol=2e-2)
        assert r["law_positions"].tolist() == list(range(len(prompt) - 1, n))
        top = probs[r["law_positions"]].topk(4, -1)
        assert torch.equal(r["top_ids"].long(), top.indices)
        assert torch.allclose(r["top_p"].float(), top.values, atol=2e-3)
        assert r["temperature"] == pytest.approx(0.8)
    # a stopped collection resumes: the logged prompts are known; another pair's log is refused
    assert sorted(i for _, i in logged_keys(tmp_path / "log")) == list(range(len(PROMPTS)))
    other = tiny_model("llama", vocab=8, hidden=16, eos=None, init_range=0.5, seed=12, layers=1)
    with pytest.raises(ValueError, match="other models"):
        log_draft_data(SpecEngine(other, make_head(other, 6, [0, 1, 2, 3, 5, 6])), tmp_path / "log")


def test_records_become_training_shards(pair, tmp_path) -> None:
    target, head = pair
    engine = SpecEngine(target, head)
    log_draft_data(engine, tmp_path / "log", top_k=4)
    for i in range(12):
        engine.generate([i % 8, (3 * i) % 8, 5], max_new_tokens=16, temperature=1.0, plan="chain:2/block", seed=i)
    engine.close()
    recs = read_draft_log(tmp_path / "log")
    cut = take_tokens(recs, 40)
    assert sum(r["law_positions"].numel() for r in cut) == 40
    with pytest.raises(ValueError, match="fewer than"):
        take_tokens(recs, 10_000)
    shard = records_to_shard(cut)
    assert shard["feat"].shape[0] == shard["ids"].numel() == int(shard["starts"][-1])
    labelled = shard["top_p"].float().sum(-1) > 0
    assert int(labelled.sum()) == 40
    train, held = split_records(recs, 3)
    assert {r["prompt_key"] for r in train}.isdisjoint({r["prompt_key"] for r in held})


def test_chain1_acceptance_is_teacher_forced_top1(pair) -> None:
    """The engine's chain:1 acceptance at T = 0 equals the head's teacher-forced top-1, step by step."""
    target, head = pair
    engine = SpecEngine(target, head)
    got = chain1_consistency(engine, PROMPTS, max_new_tokens=40)
    assert got["positions"] > 60
    assert 0.05 < got["engine_acceptance"] < 0.95  # both outcomes occur (about 0.12 here)
    assert got["mismatched_steps"] == 0
    assert got["engine_acceptance"] == got["teacher_forced_top1"]
    # negative control: features one position off (as a misaligned training pipeline would read them)
    for shift in (0, 2):
        bad = chain1_consistency(engine, PROMPTS, max_new_tokens=40, shift=shift)
        assert bad["mismatched_steps"] > 0, shift


def test_logger_refuses_bad_settings(tmp_path) -> None:
    with pytest.raises(ValueError, match=">= 1"):
        DraftDataLogger(tmp_path, top_k=0)
    with pytest.raises(ValueError, match="run_id"):
        DraftDataLogger(tmp_path, run_id="a/b")
    with pytest.raises(FileNotFoundError, match="not a draft log"):
        read_draft_log(tmp_path)


def test_evaluation_prompts_are_never_training_prompts(tmp_path) -> None:
    """Spec-Bench questions and the demo's prompts are dropped from training prompt files, however written."""
    from adaptive_spec.zoo.user_prompts import (
        ONLINE_PROMPTS,
        check_no_evaluation,
        demo_prompts,
        exclude_evaluation,
        read_prompt_file,
        spec_bench_sample,
    )

    question, demo = spec_bench_sample(5)[2], demo_prompts()[1]
    mine = ["How do I fold a paper crane?", "how do i fold a paper crane"]
    prompts = [question.upper() + "  ", f"Please answer: {demo}", *mine]
    kept, dropped = exclude_evaluation(prompts)
    assert kept == mine[:1] and dropped == 3
    with pytest.raises(ValueError, match="evaluation only"):
        check_no_evaluation([mine[0], question], "train")
    check_no_evaluation(mine, "train")  # no false alarm
    path = tmp_path / "p.jsonl"
    import json

    lines = [{"messages": [{"role": "user", "content": demo}]}, {"prompt": "Name three birds."}]
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    got, desc = read_prompt_file(path)
    assert got == ["Name three birds."] and desc["dropped_evaluation_or_duplicate"] == 1
    assert "unknown" in desc["licence"]
    path.write_text('{"text": 3}\n')
    with pytest.raises(ValueError, match="line 1: no prompt"):
        read_prompt_file(path)
    # the project's own prompts and the shipped public set are clean, and the set's licence is recorded
    own, _ = read_prompt_file(ONLINE_PROMPTS)
    assert len(own) == sum(1 for line in ONLINE_PROMPTS.read_text().splitlines() if line.strip())
    from adaptive_spec.cli.zoo_drafts import prompt_files
    from adaptive_spec.zoo.user_prompts import PROMPT_SETS

    public, desc = read_prompt_file(PROMPT_SETS["self-instruct"])
    assert len(public) == 427 and desc["licence"].startswith("Apache-2.0") and desc["prompts_kept"] == 427
    assert prompt_files(None) == [PROMPT_SETS["self-instruct"]] and prompt_files(["none"]) == []
    assert prompt_files(["self-instruct", str(path)]) == [PROMPT_SETS["self-instruct"], path]


def test_a_sharded_head_loads_through_the_engine(pair, tmp_path) -> None:
    """A head saved in several small files (as the 16 MiB limit does to the real head) loads through the engine."""
    from adaptive_spec.zoo.drafts import MAX_SHARD, save_sharded
    from tests.helpers.tiny import tiny_tokenizer

    assert MAX_SHARD == "16MB"
    target, head = pair
    target.save_pretrained(tmp_path / "target")
    tiny_tokenizer(8).save_pretrained(tmp_path / "target")
    import copy

    import adaptive_spec.zoo.drafts as drafts

    small = copy.deepcopy(head)
    small._embed = []
    old = drafts.MAX_SHARD
    drafts.MAX_SHARD = "2KB"
    try:
        save_sharded(small, tmp_path / "head")
    finally:
        drafts.MAX_SHARD = old
    files = list((tmp_path / "head").glob("*.safetensors"))
    assert len(files) > 1 and (tmp_path / "head" / "model.safetensors.index.json").exists()
    engine = SpecEngine.from_pretrained(str(tmp_path / "target"), str(tmp_path / "head"), dtype="float32")
    ref = SpecEngine(target, small.float().bind(target)).generate(
        [5, 6], max_new_tokens=12, temperature=0, plan="chain:3/block"
    )
    out = engine.generate([5, 6], max_new_tokens=12, temperature=0, plan="chain:3/block")
    assert out.token_ids == ref.token_ids and sum(out.stats.accept_lengths) == sum(ref.stats.accept_lengths)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_batched_logging_writes_the_engines_records(tmp_path, temperature) -> None:
    """``log_batched`` (batched ``generate`` + one teacher-forced pass) logs each chat's committed positions."""
    from adaptive_spec.zoo.online import log_batched
    from tests.helpers.tiny import tiny_tokenizer

    target = tiny_model("llama", vocab=48, hidden=16, eos=1, init_range=0.5, seed=5, layers=1)
    tok = tiny_tokenizer(48)
    tok.pad_token = "<bos>"
    tok.chat_template = "{% for m in messages %}w3 {{ m['content'] }} w4{% endfor %}"
    prompts = ["w5 w6 w7", "w9", "w10 w11 w12 w13 w14", "w20 w21"]
    logger = log_draft_data(SpecEngine(target, make_head(target, 6, list(range(6))), tok), tmp_path / "log", top_k=4)
    got = log_batched(target, tok, prompts, logger, max_new_tokens=12, temperature=temperature, batch=3, index_offset=7)
    logger.close()
    recs = sorted(read_draft_log(tmp_path / "log"), key=lambda r: r["prompt_index"])
    assert [r["prompt_index"] for r in recs] == [7, 8, 9, 10]
    assert got["tokens"] == sum(r["ids"].numel() - r["prompt_length"] + 1 for r in recs)
    for p, r in zip(prompts, recs, strict=True):
        P = int(r["prompt_length"])
        assert r["ids"][:P].tolist() == tok(f"w3 {p} w4", add_special_tokens=False)["input_ids"]
        feat, probs = _teacher_forced(target, r["ids"].tolist())
        assert torch.allclose(r["feat"].float(), feat, atol=2e-2)
        assert r["law_positions"].tolist() == list(range(P - 1, r["ids"].numel()))
        top = probs[r["law_positions"]].topk(4, -1)
        assert torch.equal(r["top_ids"].long(), top.indices)
        if temperature == 0:  # greedy: every logged token after the prompt is the target's top-1 there
            assert r["ids"][P:].tolist() == top.indices[:-1, 0].tolist()


def test_training_goes_on_from_committed_drafts(pair, tmp_path) -> None:
    """``init="shipped"`` loads a committed head (bound, its vocabulary kept) and standalone draft to train on."""
    from adaptive_spec.zoo.drafts import save_sharded, shipped_drafts, vocabulary_coverage
    from tests.helpers.tiny import perturbed

    target, _head = pair
    save_sharded(make_head(target, 6, [0, 1, 2, 3, 5, 6], seed=2, init=0.5), tmp_path / "eagle")
    save_sharded(perturbed(target, 0.1), tmp_path / "draft")
    got, standalone = shipped_drafts(target, tmp_path)
    assert got.token_ids.tolist() == [0, 1, 2, 3, 5, 6] and got.lm_head.weight.dtype == torch.float32
    assert standalone.config.vocab_size == 8
    shard = {"ids": torch.tensor([4, 1, 4, 4, 7, 2]), "starts": torch.tensor([0, 3, 6]), "answer": torch.tensor([1, 1])}
    # answers: [1, 4] and [7, 2]: tokens 1 and 2 are in the vocabulary, 4 and 7 are not
    assert vocabulary_coverage([shard], got.token_ids) == 0.5
    with pytest.raises(FileNotFoundError, match="no committed drafts"):
        shipped_drafts(target, tmp_path / "nothing")


def test_a_request_from_a_prompt_file_is_never_a_label() -> None:
    """Labels start at the self-written request (the target's own text), but at the answer after a given one."""
    from adaptive_spec.zoo.drafts import _sequences

    shard = {
        "ids": torch.arange(12),
        "starts": torch.tensor([0, 6, 12]),
        "answer": torch.tensor([4, 3]),
        "given": torch.tensor([False, True]),
    }
    got = [(s, e, first) for _, s, e, first in _sequences([shard], labels_from=1)]
    assert got == [(0, 6, 1), (6, 12, 9)]
    assert [first for *_, first in _sequences([shard])] == [4, 9]
    old = {k: v for k, v in shard.items() if k != "given"}  # feature files written before the flag
    assert [first for *_, first in _sequences([old], labels_from=1)] == [1, 7]
