"""Greedy speculative decoding equals the target's own greedy ``generate``, token for token."""

from __future__ import annotations

import pytest
import torch

from adaptive_spec.engine import SpecEngine
from adaptive_spec.planner import Plan
from adaptive_spec.verifiers import REGISTRY
from tests.helpers.tiny import perturbed, tiny_model

SHAPES = [
    "chain:3",
    "iid:2x3",
    "delayed:1x2x2",
    "wor:2x2x1",
    "conf-chain:5:0.3",
    "cum-chain:6:0.2",
    "conf-delayed:4:0.6:2",
    "eagle:3:8:2:2",
    "eagle:3:8:2:2:wor",
]
NEW_TOKENS = 12


def _valid_verifiers(shape: str) -> list[str]:
    law = Plan.parse(shape).shape.law
    return sorted(name for name, s in REGISTRY.items() if law in s.laws and s.lossless)


def _hf_greedy(model, prompt: list[int], n: int) -> list[int]:
    ids = torch.tensor([prompt])
    # attention_mask explicitly: the tiny models' pad id is also BOS, which HF would mask out.
    out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=n)
    return out[0, len(prompt) :].tolist()


def _prompts(count: int, vocab: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [
        [0, *torch.randint(3, vocab, (int(torch.randint(1, 6, (1,), generator=g)),), generator=g).tolist()]
        for _ in range(count)
    ]


@pytest.mark.parametrize(("kind", "num_prompts"), [("llama", 12), ("qwen2", 6), ("gpt2", 6)])
def test_greedy_equals_target_generate(kind: str, num_prompts: int) -> None:
    V = 48
    target = tiny_model(kind, vocab=V, eos=None)
    draft = perturbed(target, scale=0.3)  # agrees often, so accepted paths are long and varied
    engine = SpecEngine(target, draft)
    for i, prompt in enumerate(_prompts(num_prompts, V, seed=1)):
        expected = _hf_greedy(target, prompt, NEW_TOKENS)
        assert engine.generate(prompt, max_new_tokens=NEW_TOKENS, temperature=0, plan=None).token_ids == expected
        for shape in SHAPES:
            valid = _valid_verifiers(shape)
            # Every verifier valid for the shape is run on some prompt (at T=0 all of them verify greedily).
            for verifier in {valid[i % len(valid)], valid[(i + 3) % len(valid)]}:
                out = engine.generate(prompt, max_new_tokens=NEW_TOKENS, temperature=0, plan=f"{shape}/{verifier}")
                assert out.token_ids == expected, (prompt, shape, verifier)


def test_greedy_with_eos_and_random_draft() -> None:
    """An unrelated draft (mostly rejected) and an EOS token: still the target's greedy output."""
    V = 32
    target = tiny_model("llama", vocab=V, eos=5, seed=3)
    draft = tiny_model("llama", vocab=V, eos=5, seed=4)
    engine = SpecEngine(target, draft)
    for prompt in _prompts(8, V, seed=2):
        expected = _hf_greedy(target, prompt, 20)
        for plan in ["chain:4/block", "delayed:2x2x2/gbv", "wor:3x1x1/traversal"]:
            assert engine.generate(prompt, max_new_tokens=20, temperature=0, plan=plan).token_ids == expected
