"""The committed default pair (adaptive_spec/zoo/default): it loads offline and meets its requirements."""

from __future__ import annotations

import json

import pytest
import torch

from adaptive_spec.files import default_pair_path, default_prompts
from adaptive_spec.zoo import load_default_pair

MAX_BYTES = 50 * 2**20  # the committed pair's size limit


@pytest.fixture(scope="module")
def info():
    return json.loads((default_pair_path() / "build_info.json").read_text())


@pytest.fixture(scope="module")
def pair():
    return load_default_pair()


def test_files_and_size():
    root = default_pair_path()
    for name in ("target", "draft"):
        for f in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"):
            assert (root / name / f).is_file(), f"{name}/{f}"
        assert json.loads((root / name / "config.json").read_text())["dtype"] in ("float16", "bfloat16")
    assert sum(f.stat().st_size for f in root.rglob("*") if f.is_file()) < MAX_BYTES


def test_shared_vocabulary(pair, info):
    target, draft, tokenizer = pair
    assert target.config.vocab_size == draft.config.vocab_size == len(tokenizer) == info["vocab_size"]
    root = default_pair_path()
    assert (root / "target" / "tokenizer.json").read_bytes() == (root / "draft" / "tokenizer.json").read_bytes()
    assert target.dtype == draft.dtype == torch.float32 and not target.training  # float32 on CPU by default


def test_build_info_meets_the_requirements(pair, info):
    assert info["latency_ms"]["ratio"] >= 10, "target must be >= 10x slower than the draft per token"
    assert info["target_val_loss"] < info["draft_val_loss"] - 0.1, "target must be clearly better than the draft"
    assert 0.3 < info["acceptance"] < 1 and 0.3 < info["greedy_agreement"] < 1
    target, draft, _ = pair
    assert info["params"] == {
        "target": sum(p.numel() for p in target.parameters()),
        "draft": sum(p.numel() for p in draft.parameters()),
    }
    assert {"seed", "minutes", "date", "config", "training"} <= set(info)


def test_prompts_come_from_heldout_code(info):
    prompts = default_prompts()
    assert 16 <= len(prompts) <= 24 and len(prompts) == info["num_prompts"]
    lo, hi = info["config"]["prompt_chars"]
    assert all(lo <= len(p) <= hi and p.startswith(("def ", "async def ")) for p in prompts)


@torch.inference_mode()
def test_the_pair_continues_a_prompt(pair):
    target, draft, tokenizer = pair
    ids = tokenizer(default_prompts()[0], return_tensors="pt")["input_ids"]
    for model in (target, draft):
        logits = model(input_ids=ids).logits
        assert logits.shape == (1, ids.shape[1], len(tokenizer)) and torch.isfinite(logits).all()
    out = target.generate(ids, max_new_tokens=8, do_sample=False)
    assert out.shape[1] == ids.shape[1] + 8
