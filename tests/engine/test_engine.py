"""Engine behaviour: cache integrity, EOS, budgets, streaming, planners, stats and bad inputs."""

from __future__ import annotations

import copy

import pytest
import torch

from adaptive_spec.engine import Plan, SpecEngine, StepResult, StepState
from adaptive_spec.trees import TreeShape
from tests.helpers.tiny import perturbed, tiny_model, tiny_tokenizer

V = 48


@pytest.fixture(scope="module")
def models():
    target = tiny_model("llama", vocab=V, eos=None)
    return target, perturbed(target, scale=0.3)


@pytest.fixture(scope="module")
def engine(models) -> SpecEngine:
    return SpecEngine(*models, tokenizer=tiny_tokenizer(V))


def _next_logits_from_cache(runner, context: list[int]) -> torch.Tensor:
    pending = torch.tensor(context[runner.cached :])
    with torch.inference_mode():
        return runner.chain_forward(pending, logits_to_keep=1)[0].float()


def _fresh_logits(model, context: list[int]) -> torch.Tensor:
    with torch.inference_mode():
        return model(input_ids=torch.tensor([context])).logits[0, -1].float()


@pytest.mark.parametrize(
    "plan", ["delayed:2x3x2/traversal", "wor:3x2x1/rrsw", "chain:5/block", "iid:3x3/spectr", "lookup:2x4+m3/nss"]
)
def test_caches_match_a_fresh_prefill_after_many_steps(models, plan: str) -> None:
    engine = SpecEngine(*models)  # no tokenizer, so no EOS: all 60 tokens are generated
    out = engine.generate([0, 4, 9], max_new_tokens=60, temperature=1.0, plan=plan, seed=3, keep_state=True)
    state = out.state
    assert len(out.token_ids) == 60 and out.stats.steps > 10
    assert state.target.cached == len(state.context) - 1 == state.target.cache_length()
    assert len(state.context) - 2 <= state.draft.cached == state.draft.cache_length() <= len(state.context) - 1
    for runner in (state.target, state.draft):
        torch.testing.assert_close(
            _next_logits_from_cache(runner, state.context),
            _fresh_logits(runner.model, state.context),
            atol=1e-4,
            rtol=1e-4,
        )


def test_eos_inside_an_accepted_block_ends_generation() -> None:
    target = tiny_model("llama", vocab=V, eos=None, seed=7)
    prompt = [0, 11, 12]
    ids = torch.tensor([prompt])
    greedy = target.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=8)[0, 3:]
    greedy = greedy.tolist()
    k = next(i for i in range(2, 8) if greedy[i] not in greedy[:i])
    target.generation_config.eos_token_id = greedy[k]
    engine = SpecEngine(target, copy.deepcopy(target))  # identical draft: the whole chain is accepted
    out = engine.generate(prompt, max_new_tokens=20, temperature=0, plan="chain:7/token")
    assert out.token_ids == greedy[: k + 1]
    assert out.stats.steps == 1 and out.stats.stop_reason == "eos"
    # Sampling too: EOS (as a stop token id) cuts the block.
    out = engine.generate(prompt, max_new_tokens=30, temperature=1.0, plan="chain:7/token", seed=0, stop=[greedy[0]])
    assert greedy[0] not in out.token_ids[:-1]


@pytest.mark.parametrize(
    "plan", [None, "chain:4/token", "iid:2x2/gbv", "delayed:1x2x2/nss", "wor:2x2/traversal", "lookup:2x4+m3/nss"]
)
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_max_new_tokens_is_exact(models, plan: str | None, temperature: float) -> None:
    engine = SpecEngine(*models)  # no tokenizer, and the models have no EOS: only the budget stops a sampled run
    assert not engine.eos_token_ids
    for n in (1, 2, 7):
        out = engine.generate([0, 5], max_new_tokens=n, temperature=temperature, plan=plan, seed=n)
        assert len(out.token_ids) == n and out.stats.new_tokens == n
        assert out.stats.stop_reason == "max_new_tokens"
    out = engine.generate([0, 5], max_new_tokens=1, temperature=temperature, plan=plan, seed=0)
    assert out.stats.steps == 1 and out.stats.target_forwards == 2  # prefill + one step
    assert out.stats.draft_forwards == (0 if plan is None else 1)  # prefill only: the tree was cut to the root


def test_context_window_is_respected() -> None:
    target = tiny_model("qwen2", vocab=V, eos=None, max_positions=16)
    engine = SpecEngine(target, perturbed(target, 0.3))
    out = engine.generate(list(range(3, 13)), max_new_tokens=20, plan="chain:4/block", seed=0)
    assert len(out.token_ids) == 6 and out.stats.stop_reason == "context_window"
    with pytest.raises(ValueError, match="context window"):
        engine.generate(list(range(3, 19)), max_new_tokens=2, plan="chain:4/block")


def test_seeded_runs_repeat_and_stats_add_up(engine: SpecEngine) -> None:
    a = engine.generate("w3 w4 w5", max_new_tokens=25, plan="delayed:2x2x2/specinfer", seed=11, top_k=20, top_p=0.9)
    b = engine.generate("w3 w4 w5", max_new_tokens=25, plan="delayed:2x2x2/specinfer", seed=11, top_k=20, top_p=0.9)
    assert a.token_ids == b.token_ids and a.text == b.text
    s = a.stats
    assert s.target_forwards == s.steps + 1
    n = len(a.token_ids)
    assert s.new_tokens == n and len(s.accept_lengths) == s.steps == len(a.steps)
    # the budget ran out, or an end token came first (at the 25th token too)
    assert (s.stop_reason == "max_new_tokens" and n == 25) or (s.stop_reason == "eos" and n <= 25)
    assert s.block_efficiency == pytest.approx(n / s.steps)
    assert sum(r.num_accepted + 1 for r in a.steps) >= n
    assert set(s.phase_times_s) == {"draft", "target", "verify", "other"} and s.tokens_per_s > 0
    assert sum(s.phase_times_s.values()) <= s.wall_time_s
    assert s.as_dict()["block_efficiency"] == s.block_efficiency


def test_stream_and_streamer(engine: SpecEngine) -> None:
    from transformers import TextIteratorStreamer

    kwargs = {"max_new_tokens": 15, "plan": "wor:2x2/traversal", "seed": 2}
    full = engine.generate("w3 w9", **kwargs)
    assert "".join(engine.stream("w3 w9", **kwargs)) == full.text
    streamer = TextIteratorStreamer(engine.tokenizer, skip_prompt=True, skip_special_tokens=True)  # as the text
    again = engine.generate("w3 w9", streamer=streamer, **kwargs)
    assert "".join(streamer).strip() == again.text.strip() == full.text.strip()


def test_stop_string(engine: SpecEngine) -> None:
    full = engine.generate([0, 3], max_new_tokens=30, temperature=0, plan="chain:3/token")
    word = engine.tokenizer.decode(full.token_ids[5:6])
    first = next(i for i, t in enumerate(full.token_ids) if t == full.token_ids[5])
    out = engine.generate([0, 3], max_new_tokens=30, temperature=0, plan="chain:3/token", stop=[word])
    assert out.token_ids == full.token_ids[: first + 1] and out.stats.stop_reason == "stop"


def test_stop_string_cuts_the_text_mid_token(engine: SpecEngine) -> None:
    """A stop string ending inside a token's text: ``text`` ends with it, ``token_ids`` keep that token."""
    full = engine.generate([0, 3], max_new_tokens=30, temperature=0, plan="chain:3/token")
    word = engine.tokenizer.decode(full.token_ids[5:6])  # e.g. "w17": stop at "w1"
    stop = word[:-1]
    out = engine.generate([0, 3], max_new_tokens=30, temperature=0, plan="chain:3/token", stop=[stop])
    assert out.stats.stop_reason == "stop" and out.text.endswith(stop)
    assert engine.tokenizer.decode(out.token_ids).startswith(out.text)  # the whole token is kept in the ids
    assert out.text.count(stop) == 1 and not engine.tokenizer.decode(out.token_ids[:-1]).count(stop)


def test_planner_protocol(engine: SpecEngine) -> None:
    class Alternating:
        def __init__(self) -> None:
            self.seen: list[StepState] = []
            self.results: list[StepResult] = []

        def choose(self, state: StepState) -> Plan | str:
            self.seen.append(state)
            return "chain:3/block" if state.step % 2 == 0 else Plan(TreeShape.iid(2, 2), "specinfer")

        def observe(self, result: StepResult) -> None:
            self.results.append(result)

    planner = Alternating()
    out = engine.generate([0, 7], max_new_tokens=20, plan=planner, seed=1)
    assert len(planner.seen) == len(planner.results) == out.stats.steps
    assert [s.step for s in planner.seen] == list(range(out.stats.steps))
    assert planner.seen[1].last is planner.results[0]
    assert {r.plan.verifier for r in planner.results} == {"block", "specinfer"}


def test_plan_parsing() -> None:
    assert str(Plan.parse("delayed:2x3x3/traversal")) == "delayed:2x3x3/traversal"
    assert Plan.parse("wor:3x2").verifier == "traversal"
    assert Plan.parse("iid:1x4/token").shape == TreeShape.chain(4)  # canonical shapes
    for bad in ["delayed:2x3/traversal", "chain:3/nope", "iid:2x2/token", "chain:3/", "chain:3/hsd", "tree:3/token"]:
        with pytest.raises(ValueError):
            Plan.parse(bad)
    assert Plan(TreeShape.chain(2), "hsd", allow_lossy=True).verifier == "hsd"


def test_different_vocab_sizes_share_the_tokenizer() -> None:
    target = tiny_model("llama", vocab=V, eos=None, seed=1)
    draft = tiny_model("gpt2", vocab=V + 16, eos=None, seed=2)  # padded embedding matrix
    engine = SpecEngine(target, draft, tokenizer=tiny_tokenizer(V))
    assert engine.vocab_size == V
    ids = torch.tensor([[0, 5, 6]])
    expected = target.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=10)
    out = engine.generate([0, 5, 6], max_new_tokens=10, temperature=0, plan="iid:2x3/traversal")
    assert out.token_ids == expected[0, 3:].tolist()
    assert all(t < V for t in engine.generate([0, 5], max_new_tokens=20, plan="wor:3x2/rrsw", seed=0).token_ids)
    # The engine's vocabulary is the target's, as in transformers' generate, whatever the tokenizer's length.
    small = SpecEngine(target, draft, tokenizer=tiny_tokenizer(V - 8))
    assert small.vocab_size == V


def test_eager_and_sdpa_and_bf16_agree_greedily(models) -> None:
    target, draft = models
    ref = SpecEngine(target, draft).generate([0, 9], max_new_tokens=10, temperature=0, plan=None).token_ids
    eager_t, eager_d = copy.deepcopy(target), copy.deepcopy(draft)
    eager_t.config._attn_implementation = eager_d.config._attn_implementation = "eager"
    out = SpecEngine(eager_t, eager_d).generate([0, 9], max_new_tokens=10, temperature=0, plan="delayed:1x2x2/gbv")
    assert out.token_ids == ref
    bf16 = SpecEngine(copy.deepcopy(target), copy.deepcopy(draft), dtype=torch.bfloat16, device="cpu")
    assert bf16.target.dtype == torch.bfloat16
    assert len(bf16.generate([0, 9], max_new_tokens=10, plan="wor:2x2/traversal", seed=0).token_ids) == 10


def test_bad_inputs(engine: SpecEngine, models) -> None:
    cases = [
        ({"prompt": []}, "empty"),
        ({"prompt": ""}, "empty"),
        ({"prompt": [0, V + 5]}, "outside"),
        ({"prompt": 3.5}, "prompt must be"),
        ({"temperature": -1.0}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"top_k": -2}, "top_k"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"max_new_tokens": 0}, "max_new_tokens"),
        ({"plan": "iid:2x2/token"}, "not lossless for trees drafted as 'iid'"),
        ({"plan": "chain:2/unknown"}, "unknown verifier"),
        ({"plan": "tree:3/token"}, "cannot parse"),
        ({"plan": 42}, "plan must be"),
        ({"plan": "chain:2/greedy", "temperature": 1.0}, "temperature 0"),
        ({"stop": [""]}, "stop"),
    ]
    for kwargs, message in cases:
        kwargs = {"prompt": [0, 5], "max_new_tokens": 3, "plan": "chain:2/token", **kwargs}
        with pytest.raises(ValueError, match=message):
            engine.generate(**kwargs)
    with pytest.raises(ValueError, match="tokenizer"):
        SpecEngine(*models).generate("w3 w4")
    with pytest.raises(ValueError, match="tokenizer"):
        list(SpecEngine(*models).stream([0, 3]))


def test_nan_logits_raise() -> None:
    target = tiny_model("llama", vocab=V, eos=None)
    draft = copy.deepcopy(target)
    with torch.no_grad():
        draft.lm_head.weight.fill_(float("nan"))
    engine = SpecEngine(target, draft)
    # token: checked before the verifier runs; block and greedy: the check rides the verifier's one host read
    for plan, temperature in [("chain:2/token", 1.0), ("chain:3/block", 1.0), ("chain:3/block", 0.0)]:
        kw = {"max_new_tokens": 4, "plan": plan, "temperature": temperature, "seed": 0}
        with pytest.raises(ValueError, match="draft model returned NaN"):
            engine.generate([0, 5], **kw)
        with pytest.raises(ValueError, match="target model returned NaN"):
            SpecEngine(draft, target).generate([0, 5], **kw)
    with pytest.raises(ValueError, match="target model returned NaN"):
        SpecEngine(draft, target).generate([0, 5], max_new_tokens=4, plan=None, seed=0)
    with pytest.raises(ValueError, match="target model returned NaN"):  # looked up: no draft forward
        SpecEngine(draft, target).generate([0, 5, 0, 5], max_new_tokens=4, plan="lookup:2/block", seed=0)


def test_mismatched_tokenizers_and_attention_are_refused(models) -> None:
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from transformers import PreTrainedTokenizerFast

    other = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(WordLevel({f"x{i}": i for i in range(V)}, unk_token="x0")), unk_token="x0"
    )
    with pytest.raises(ValueError, match="tokenizers differ"):
        SpecEngine(*models, tokenizer=tiny_tokenizer(V), draft_tokenizer=other)
    flash = copy.deepcopy(models[1])
    flash.config._attn_implementation = "flash_attention_2"
    with pytest.raises(ValueError, match="attn_implementation"):
        SpecEngine(models[0], flash)


def test_pending_tokens_are_a_view_of_the_device_tail_while_it_matches_the_context() -> None:
    from adaptive_spec.engine.metrics import GenerationStats
    from adaptive_spec.engine.outputs import DeviceTail, EngineState

    on_device = torch.tensor([7, 8, 9])
    tail = DeviceTail(2, [7, 8, 9], on_device)
    state = EngineState([1, 2, 7, 8, 9], 2, None, None, torch.Generator(), GenerationStats(), tail=tail)
    view = state.pending(3, torch.device("cpu"))
    assert view.tolist() == [8, 9] and view.data_ptr() == on_device[1:].data_ptr()  # nothing copied
    assert state.pending(1, torch.device("cpu")).tolist() == [2, 7, 8, 9]  # older than the tail: one copy
    del state.context[4:]  # cut at a stop string: the tail no longer matches, the context wins
    stale = state.pending(3, torch.device("cpu"))
    assert stale.tolist() == [8] and stale.data_ptr() != on_device[1:].data_ptr()
