"""Column-major Linear weights: the same logits, the same state dict, saved by save_pretrained as they are."""

from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM

from adaptive_spec.engine import SpecEngine
from adaptive_spec.engine.layout import column_major_linears, row_major_linears
from adaptive_spec.engine.runner import ModelRunner
from tests.helpers.tiny import tiny_model


def _logits(model) -> torch.Tensor:
    runner = ModelRunner(model)
    with torch.inference_mode():
        first = runner.chain_forward(torch.tensor([0, 5, 9, 3, 7]), logits_to_keep=5)
        anc = torch.tensor([[1, 0, 0], [1, 1, 0], [1, 0, 1]], dtype=torch.bool)
        block = runner.block_forward(torch.tensor([4, 12, 13]), torch.tensor([5, 6, 6]), anc, logits_to_keep=3)
    return torch.cat([first, block])


def test_column_major_keeps_values_and_logits(tmp_path) -> None:
    model = tiny_model("llama", vocab=48).eval()
    model.config.tie_word_embeddings = True
    model.tie_weights()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    logits = _logits(model)
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    changed = column_major_linears(model)
    assert changed == len({id(m.weight) for m in linears}) > 0  # the tied head counted once
    for m in linears:
        assert m.weight.stride() == (1, m.weight.shape[0])  # [in, out] in memory
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    torch.testing.assert_close(_logits(model), logits, rtol=1e-5, atol=1e-5)
    assert column_major_linears(model) == 0  # idempotent
    assert row_major_linears(model) == changed
    assert all(m.weight.is_contiguous() for m in linears)
    model.save_pretrained(tmp_path / "saved")
    again = AutoModelForCausalLM.from_pretrained(tmp_path / "saved")
    assert all(torch.equal(v, before[k]) for k, v in again.state_dict().items() if k in before)


def test_from_pretrained_on_cpu_stores_linears_column_major(tiny_pair, monkeypatch) -> None:
    monkeypatch.setenv("ADAPTIVE_SPEC_WEIGHT_ORDER", "column")
    engine = SpecEngine.from_pretrained(device="cpu")
    for model in (engine.target, engine.draft):
        weights = [m.weight for m in model.modules() if isinstance(m, torch.nn.Linear)]
        assert weights and all(not w.is_contiguous() and w.t().is_contiguous() for w in weights)
    plain = SpecEngine.from_pretrained(device="cpu")
    row_major_linears(plain.target)
    row_major_linears(plain.draft)
    prompt = "w5 w6 w7"
    a = engine.generate(prompt, max_new_tokens=12, temperature=0.0, plan="chain:2/block")
    b = plain.generate(prompt, max_new_tokens=12, temperature=0.0, plan="chain:2/block")
    assert a.token_ids == b.token_ids


def test_what_column_major_weights_can_and_cannot_be_saved_by(tmp_path) -> None:
    """transformers' ``save_pretrained`` writes column-major weights as they are (it packs each tensor);
    ``safetensors.torch.save_file`` of the raw state dict refuses them until :func:`row_major_linears`."""
    import pytest
    from safetensors.torch import save_file

    model = tiny_model("llama", vocab=48).eval()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    assert column_major_linears(model) > 0
    model.save_pretrained(tmp_path / "saved")
    again = AutoModelForCausalLM.from_pretrained(tmp_path / "saved")
    assert all(torch.equal(v, before[k]) for k, v in again.state_dict().items() if k in before)
    weights = {k: v for k, v in model.state_dict().items() if not v.is_contiguous()}
    assert weights
    with pytest.raises(ValueError, match="non contiguous"):
        save_file(weights, tmp_path / "raw.safetensors")
    row_major_linears(model)
    save_file({k: v for k, v in model.state_dict().items() if k in weights}, tmp_path / "raw.safetensors")
