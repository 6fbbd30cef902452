"""EAGLE-style draft heads (adaptive_spec.engine.eagle) with tiny random models.

- greedy decoding through the engine equals transformers' greedy ``generate`` of the target, for
  every plan family;
- the law of the first three tokens at T > 0 is the target's (chi-square, as in test_lossless),
  with a reduced draft vocabulary that leaves some target tokens at q = 0; the same test fails
  when the verifier reads rows the head's tokens were not drawn from (negative control);
- the head reads the target's hidden states: its root row equals a hand computation from a
  teacher-forced target pass, and differs when the features are withheld (negative control);
- a saved head loads back through ``AutoModelForCausalLM`` and ``SpecEngine.from_pretrained``.
"""

from __future__ import annotations

import pytest
import torch

from adaptive_spec.engine import SpecEngine
from adaptive_spec.engine.eagle import EagleConfig, EagleHead, EagleRunner
from adaptive_spec.engine.logits import ProbsFn, SamplingConfig
from tests.helpers.laws import chi_square_pvalue, exact_law
from tests.helpers.tiny import tiny_model, tiny_tokenizer

V = 8
SAMPLING = SamplingConfig(temperature=0.9, top_k=6, top_p=1.0)
PLANS = [
    "chain:4/block",
    "wor:2x3/traversal",
    "iid:2x2/specinfer",
    "delayed:1x2x2/gbv",
    "conf-chain:5:0.3/block",
    "eagle:2:4:1:2:wor/traversal",
]


def make_head(target, draft_vocab: int, vocab_ids, seed: int = 0, init: float = 0.3) -> EagleHead:
    cfg = EagleConfig.for_target(target.config, draft_vocab_size=draft_vocab, initializer_range=init)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(seed)
    head = EagleHead(cfg).eval()
    head.set_vocabulary(torch.as_tensor(vocab_ids))
    return head.bind(target)


@pytest.fixture(scope="module")
def pair():
    target = tiny_model("llama", vocab=48, hidden=32, seed=3, eos=None)
    return target, make_head(target, 40, range(8, 48))


@pytest.mark.parametrize("plan", PLANS)
@pytest.mark.parametrize("prompt", [[5], [5, 6, 7, 2, 3]], ids=["one-token", "prefill"])
@pytest.mark.parametrize("vocab", [48, 8])
def test_greedy_equals_transformers(pair, plan, prompt, vocab) -> None:
    if vocab == 48:
        target, head = pair
    else:  # a small vocabulary, where the random head's drafts are often accepted
        target = tiny_model("llama", vocab=8, hidden=16, eos=None, init_range=0.5, seed=11, layers=1)
        head = make_head(target, 6, [0, 1, 2, 3, 5, 6], seed=2, init=0.5)
    engine = SpecEngine(target, head)
    ref = target.generate(torch.tensor([prompt]), max_new_tokens=40, do_sample=False)[0, len(prompt) :].tolist()
    out = engine.generate(prompt, max_new_tokens=40, temperature=0, plan=plan)
    assert out.token_ids == ref
    if vocab == 8:  # accepted nodes were committed (and fed again with the target's features)
        assert sum(out.stats.accept_lengths) > 0


def test_reduced_vocabulary_gives_zero_probability_outside() -> None:
    ids = torch.tensor([5, 2, 7])
    fn = ProbsFn([], 10, one_hot=False, token_ids=ids)
    probs = fn(torch.tensor([[1.0, 2.0, 3.0]]))
    outside = torch.ones(10, dtype=torch.bool)
    outside[ids] = False
    assert probs[0, outside].sum() == 0
    assert torch.allclose(probs[0, ids], torch.softmax(torch.tensor([1.0, 2.0, 3.0]), -1))


def _last_hidden(target, ids: list[int]) -> torch.Tensor:
    seen = []
    handle = target.lm_head.register_forward_pre_hook(lambda _m, a: seen.append(a[0]))
    with torch.inference_mode():
        target(input_ids=torch.tensor([ids]))
    handle.remove()
    return seen[0][0]  # [n, H], after the final norm


@pytest.mark.parametrize("withhold", [False, True], ids=["target-features", "negative-control"])
def test_head_reads_the_targets_features(pair, withhold) -> None:
    """The engine's first draft row equals the head run by hand on the teacher-forced target features."""
    target, head = pair
    prompt = [5, 9, 11, 4, 30, 7]
    f = _last_hidden(target, prompt)  # f[j] is the feature of position j
    feats = torch.cat([torch.zeros(1, f.shape[1]), f[:-1]])  # position j reads f[j - 1]
    with torch.inference_mode():
        logits, h = head(torch.tensor([prompt]), feats[None], torch.arange(len(prompt))[None], None, None)
        # the first drafted token (position n) reads the head's own output at the root
        seq, seq_feats = torch.tensor([[*prompt, 7]]), torch.cat([feats, h[0, -1:]])[None]
        want, _ = head(seq, seq_feats, torch.arange(len(prompt) + 1)[None], None, None)
        want = want[:, -1:]
    runner = EagleRunner(head)
    with torch.inference_mode():
        runner.set_target_features(0, f[:-1] if not withhold else torch.zeros_like(f[:-1]))
        runner.chain_forward(torch.tensor(prompt[:-1]), logits_to_keep=1)
        causal = torch.ones(1, 1, dtype=torch.bool)
        root = runner.block_forward(torch.tensor(prompt[-1:]), torch.tensor([len(prompt) - 1]), causal, 1)
        # the root's row: the head's output over position n - 1
        assert torch.allclose(root[0], logits[0, -1], atol=1e-5) != withhold
        anc = torch.ones(1, 2, dtype=torch.bool)
        child = runner.block_forward(torch.tensor([7]), torch.tensor([len(prompt)]), anc, 1)
        assert torch.allclose(child[0], want[0, 0], atol=1e-5) != withhold


def test_commit_keeps_only_context_rows(pair) -> None:
    target, head = pair
    runner = EagleRunner(head)
    f = _last_hidden(target, [5, 6, 7])
    with torch.inference_mode():
        runner.set_target_features(0, f[:2])
        runner.chain_forward(torch.tensor([5, 6]), logits_to_keep=1)
        runner.block_forward(torch.tensor([7]), torch.tensor([2]), torch.ones(1, 1, dtype=torch.bool), 1)  # the root
        runner.block_forward(torch.tensor([8]), torch.tensor([3]), torch.ones(1, 2, dtype=torch.bool), 1)  # a node
        assert runner.cache_length() == 4
        runner.commit(3, torch.tensor([3]))  # the engine asks to keep the accepted node: it is fed again instead
    assert runner.cached == 3 and runner.cache_length() == 3


@pytest.fixture(scope="module")
def small_engine():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    target = tiny_model("llama", vocab=V, hidden=16, eos=None, init_range=0.5, seed=11, layers=1)
    head = make_head(target, 6, [0, 1, 2, 3, 5, 6], seed=2, init=0.5)  # tokens 4 and 7 are never drafted
    yield SpecEngine(target, head)
    torch.set_num_threads(threads)


@pytest.mark.parametrize(
    ("plan", "prompt"),
    [
        ("chain:2/block", [3]),
        ("wor:2x2/traversal", [3]),
        ("conf-chain:3:0.35/block", [3]),
        ("eagle:2:5:2:2:wor/traversal", [3]),  # an EAGLE-style tree, decided on the device
        ("chain:2/block", [3, 5, 2]),  # a prefill first (the head's catch-up over the prompt)
    ],
    ids=["one-token-chain", "one-token-wor", "one-token-conf-chain", "one-token-eagle", "prefill-chain"],
)
def test_lossless_with_an_eagle_head(small_engine, plan, prompt) -> None:
    counts = torch.zeros(V, V, V, dtype=torch.long)
    for seed in range(1000):  # the negative control below detects a wrong row at 300
        out = small_engine.generate(
            prompt, max_new_tokens=3, temperature=SAMPLING.temperature, top_k=SAMPLING.top_k, plan=plan, seed=seed
        )
        counts[tuple(out.token_ids)] += 1
    law = exact_law(small_engine.target, SAMPLING, list(prompt), V)
    assert chi_square_pvalue(counts, law) > 1e-3


@pytest.mark.parametrize("wrong", [False, True], ids=["right", "negative-control"])
def test_chi_square_sees_wrong_head_rows(small_engine, monkeypatch, wrong) -> None:
    """The head's tokens verified against rows they were not drawn from (uniform, so q > 0 outside the
    head's vocabulary too) fail the chi-square test that the head's own rows pass (300 runs each)."""
    from tests.engine.test_lookup import corrupt_rows

    changed = corrupt_rows(monkeypatch, looked_up=False, drawn=wrong)
    counts = torch.zeros(V, V, V, dtype=torch.long)
    for seed in range(300):
        kw = {"temperature": SAMPLING.temperature, "top_k": SAMPLING.top_k, "seed": seed}
        counts[tuple(small_engine.generate([3, 5, 2], max_new_tokens=3, plan="chain:2/block", **kw).token_ids)] += 1
    law = exact_law(small_engine.target, SAMPLING, [3, 5, 2], V)
    assert (chi_square_pvalue(counts, law) < 1e-3) == wrong
    assert bool(changed) == wrong


def test_save_and_load(pair, tmp_path) -> None:
    from transformers import AutoModelForCausalLM

    target, head = pair
    head.save_pretrained(tmp_path / "head")
    target.save_pretrained(tmp_path / "target")
    tiny_tokenizer(48).save_pretrained(tmp_path / "target")
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "head")
    assert isinstance(loaded, EagleHead) and torch.equal(loaded.token_ids, head.token_ids)
    engine = SpecEngine.from_pretrained(str(tmp_path / "target"), str(tmp_path / "head"), dtype="float32")
    ref = SpecEngine(target, head).generate([5, 6], max_new_tokens=12, temperature=0, plan="chain:3/block")
    out = engine.generate([5, 6], max_new_tokens=12, temperature=0, plan="chain:3/block")
    assert out.token_ids == ref.token_ids and out.stats.accept_lengths == ref.stats.accept_lengths


def test_a_head_for_another_target_is_refused(pair) -> None:
    _, head = pair
    other = tiny_model("llama", vocab=40, hidden=32, seed=3)
    with pytest.raises(ValueError, match="trained for a target"):
        SpecEngine(other, EagleHead(head.config))
