"""The runner's fast path (a model's parts called in order) gives the model's own logits."""

from __future__ import annotations

import pytest
import torch

from adaptive_spec.engine.runner import ModelRunner, fast_path_parts
from tests.helpers.tiny import tiny_model


def _run(model, fast: bool, keep_hidden: bool) -> list[torch.Tensor]:
    old = ModelRunner.fast_path
    ModelRunner.fast_path = fast
    try:
        runner = ModelRunner(model, keep_hidden=keep_hidden)
        assert (runner.fast_parts is not None) == fast
        out = [runner.chain_forward(torch.tensor([0, 5, 9, 3, 7]), logits_to_keep=2)]
        hidden = [runner.hidden] if keep_hidden else []
        out.append(runner.chain_forward(torch.tensor([11]), logits_to_keep=1))
        # a tree block: two children of the pending token, and a grandchild under the first
        anc = torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 1, 0, 1]], dtype=torch.bool)
        pos = torch.tensor([6, 7, 7, 8])
        out.append(runner.block_forward(torch.tensor([4, 12, 13, 14]), pos, anc, logits_to_keep=4))
        hidden += [runner.hidden] if keep_hidden else []
        runner.commit(6, torch.tensor([7, 9]))
        out.append(runner.chain_forward(torch.tensor([15, 16]), logits_to_keep=2))
        return out + hidden
    finally:
        ModelRunner.fast_path = old


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_fast_path_logits_equal_the_models_forward(kind: str, attn: str) -> None:
    model = tiny_model(kind, attn=attn, vocab=48)
    with torch.inference_mode():
        fast = _run(model, True, keep_hidden=True)
        slow = _run(model, False, keep_hidden=True)
    assert len(fast) == len(slow) == 6
    for a, b in zip(fast, slow, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_no_fast_path_for_other_architectures() -> None:
    assert fast_path_parts(tiny_model("gpt2", vocab=48)) is None
    assert fast_path_parts(tiny_model("llama", vocab=48)) is not None


def test_hooks_on_the_model_keep_its_own_forward() -> None:
    model = tiny_model("llama", vocab=48)
    calls = []
    handle = model.register_forward_pre_hook(lambda *_: calls.append(1))
    try:
        assert fast_path_parts(model) is None  # a hook on the model needs the model's own forward
        ModelRunner(model).chain_forward(torch.tensor([0, 5, 9]), logits_to_keep=1)
        assert calls == [1]
    finally:
        handle.remove()
    assert fast_path_parts(model) is not None
