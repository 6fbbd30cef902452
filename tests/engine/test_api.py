"""The API as a transformers user meets it: top-level import, chat prompts, BatchEncodings, finish_reason."""

from __future__ import annotations

import pytest
import torch

from adaptive_spec.engine.prompts import prompt_ids
from tests.helpers.tiny import perturbed, tiny_model, tiny_tokenizer

V = 48


@pytest.fixture(scope="module")
def engine():
    from adaptive_spec import SpecEngine

    tok = tiny_tokenizer(V)
    tok.chat_template = (
        "{% for m in messages %}{{ m['content'] }} {% endfor %}{% if add_generation_prompt %}w9{% endif %}"
    )
    target = tiny_model("llama", vocab=V, eos=1)
    return SpecEngine(target, perturbed(target, scale=0.3), tokenizer=tok)


def test_top_level_import():
    import adaptive_spec
    from adaptive_spec import SpecEngine
    from adaptive_spec.engine import SpecEngine as Same

    assert SpecEngine is Same and "SpecEngine" in adaptive_spec.__all__


def test_chat_messages_use_the_chat_template(engine):
    msgs = [{"role": "user", "content": "w5 w6"}, {"role": "assistant", "content": "w7"}]
    a = engine.generate(messages=msgs, max_new_tokens=6, temperature=0, plan="chain:3/block")
    ids = engine.tokenizer("w5 w6 w7 w9")["input_ids"]
    b = engine.generate(ids, max_new_tokens=6, temperature=0, plan="chain:3/block")
    assert a.token_ids == b.token_ids
    rendered = engine.tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True, return_dict=True)
    c = engine.generate(rendered, max_new_tokens=6, temperature=0, plan="chain:3/block")  # a BatchEncoding
    assert c.token_ids == a.token_ids
    d = engine.generate({"input_ids": torch.tensor([ids])}, max_new_tokens=6, temperature=0)  # a dict of [1, n]
    assert d.token_ids == a.token_ids
    with pytest.raises(ValueError, match="either a prompt or messages"):
        engine.generate("w5", messages=msgs)
    with pytest.raises(ValueError, match="list of"):
        engine.generate(messages={"role": "user", "content": "w5"})


class _BosTokenizer:
    """Adds BOS (id 0) in front of every text, as Llama tokenizers do."""

    bos_token_id = 0

    def __call__(self, text):
        words = text.split()
        return {"input_ids": [0] + [0 if w == "<bos>" else int(w[1:]) for w in words]}


def test_no_double_bos():
    tok = _BosTokenizer()
    assert prompt_ids("<bos> w5 w6", tok, 10) == [0, 5, 6]  # the text began with BOS: one BOS kept
    assert prompt_ids("w5 w6", tok, 10) == [0, 5, 6]
    assert prompt_ids({"input_ids": [0, 0, 5]}, tok, 10) == [0, 0, 5]  # explicit ids are taken as given


def test_finish_reason(engine):
    out = engine.generate([0, 5], max_new_tokens=3, temperature=0, plan="chain:2/block")
    assert out.finish_reason in ("length", "stop")
    stopped = engine.generate([0, 5], max_new_tokens=20, temperature=0, plan="chain:2/block", stop=[out.token_ids[0]])
    assert stopped.finish_reason == "stop" and stopped.token_ids == out.token_ids[:1]
    full = engine.generate([0, 5], max_new_tokens=2, temperature=1.0, plan="chain:2/block", seed=0, stop=[])
    assert full.finish_reason == ("stop" if 1 in full.token_ids else "length")


def test_row_wise_logits_processors_are_applied_to_both_models(engine):
    from transformers import LogitsProcessorList, MinPLogitsWarper, SuppressTokensLogitsProcessor

    banned = list(range(3, 30))
    procs = LogitsProcessorList([SuppressTokensLogitsProcessor(banned), MinPLogitsWarper(0.05)])
    for plan in ("autoregressive", "chain:3/block", "conf-chain:4:0.3/block", "iid:2x2/traversal"):
        for seed in range(3):
            out = engine.generate(
                [0, 5], max_new_tokens=12, temperature=1.0, plan=plan, seed=seed, logits_processor=procs
            )
            assert not set(out.token_ids) & set(banned), plan
    # Greedy: the processed argmax, as transformers' generate computes it.
    ids = torch.tensor([[0, 5]])
    ref = engine.target.generate(
        ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=8, suppress_tokens=banned
    )[0, 2:].tolist()
    got = engine.generate(
        [0, 5],
        max_new_tokens=8,
        temperature=0,
        plan="chain:3/block",
        logits_processor=[SuppressTokensLogitsProcessor(banned)],
    )
    assert got.token_ids[: len(ref)] == ref


def test_history_dependent_processors_and_criteria_are_refused(engine):
    from transformers import RepetitionPenaltyLogitsProcessor
    from transformers.generation.stopping_criteria import ConfidenceCriteria

    with pytest.raises(ValueError, match=r"RepetitionPenaltyLogitsProcessor is not supported.*row alone"):
        engine.generate([0, 5], max_new_tokens=3, logits_processor=[RepetitionPenaltyLogitsProcessor(1.2)])
    with pytest.raises(ValueError, match="stopping criterion ConfidenceCriteria is not supported"):
        engine.generate([0, 5], max_new_tokens=3, stopping_criteria=[ConfidenceCriteria(0.5)])


def test_stopping_criteria_cut_like_generate(engine):
    from transformers import MaxLengthCriteria, StoppingCriteriaList

    out = engine.generate(
        [0, 5],
        max_new_tokens=10,
        temperature=0,
        plan="chain:4/block",
        stopping_criteria=StoppingCriteriaList([MaxLengthCriteria(max_length=5)]),
    )
    assert len(out.token_ids) == 3 and out.finish_reason == "stop"
    full = engine.generate([0, 5], max_new_tokens=10, temperature=0, plan="chain:4/block")
    assert out.token_ids == full.token_ids[:3]


def test_generation_config(engine):
    from transformers import GenerationConfig

    greedy = engine.generate(
        [0, 5], generation_config=GenerationConfig(do_sample=False, max_new_tokens=5), plan="chain:2/block"
    )
    assert greedy.token_ids == engine.generate([0, 5], max_new_tokens=5, temperature=0, plan="chain:2/block").token_ids
    cfg = GenerationConfig(do_sample=True, temperature=0.7, top_k=10, top_p=0.9, max_new_tokens=6)
    a = engine.generate([0, 5], generation_config=cfg, seed=4, plan="chain:2/block")
    b = engine.generate([0, 5], max_new_tokens=6, temperature=0.7, top_k=10, top_p=0.9, seed=4, plan="chain:2/block")
    assert a.token_ids == b.token_ids
    # Explicit arguments win over the config.
    c = engine.generate([0, 5], generation_config=cfg, max_new_tokens=3, temperature=0, plan="chain:2/block")
    assert len(c.token_ids) == 3
    with pytest.raises(TypeError, match="GenerationConfig"):
        engine.generate([0, 5], generation_config={"do_sample": False})
