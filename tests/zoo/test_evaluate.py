"""evaluate_pair on tiny random models: identities that hold whatever the weights."""

from __future__ import annotations

import pytest

from adaptive_spec.zoo.config import ModelSpec
from adaptive_spec.zoo.corpus import train_tokenizer
from adaptive_spec.zoo.evaluate import evaluate_pair
from adaptive_spec.zoo.model import make_llama

TEXTS = ["def add(a, b):\n    return a + b\n" * 4, "class A:\n    pass\n" * 3]


@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer(TEXTS, 300)


def test_a_model_against_itself_is_always_accepted(tokenizer):
    model = make_llama(ModelSpec(32, 1, 2, 64, 128), tokenizer, seed=0).eval()
    figs = evaluate_pair(model, model, tokenizer, TEXTS, seq_len=16, latency_context=8, latency_repeats=3)
    assert figs["acceptance"] == pytest.approx(1.0, abs=1e-5)
    assert figs["greedy_agreement"] == 1.0
    assert figs["kl"] == pytest.approx(0.0, abs=1e-5)
    assert figs["target_val_loss"] == pytest.approx(figs["draft_val_loss"])
    assert figs["positions"] == sum(len(tokenizer(t)["input_ids"]) - 1 for t in TEXTS)


def test_different_models_have_acceptance_below_one(tokenizer):
    target = make_llama(ModelSpec(32, 2, 2, 64, 128), tokenizer, seed=0).eval()
    draft = make_llama(ModelSpec(16, 1, 2, 32, 128), tokenizer, seed=1).eval()
    figs = evaluate_pair(target, draft, tokenizer, TEXTS, seq_len=16, latency_context=8, latency_repeats=3)
    assert 0 < figs["acceptance"] < 1 and figs["kl"] > 0
    assert figs["target_latency_ms"] > 0 and figs["draft_latency_ms"] > 0
    assert figs["latency_ratio"] == pytest.approx(figs["target_latency_ms"] / figs["draft_latency_ms"])
