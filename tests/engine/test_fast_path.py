"""The runner's fast path (a model's parts called in order) gives the model's own logits."""

from __future__ import annotations

import pytest
import torch

from adaptive_spec.engine.runner import ModelRunner, fast_path_parts
from tests.helpers.tiny import tiny_model


def _run(model, fast: bool, keep_hidden: bool, attention: str = "sdpa") -> list[torch.Tensor]:
    old = ModelRunner.fast_path
    ModelRunner.fast_path = fast
    try:
        runner = ModelRunner(model, keep_hidden=keep_hidden)
        assert (runner.fast_parts is not None) == fast
        if attention != "sdpa":
            runner.cache.attention_form = attention  # as a slot sets it while capturing a pass
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


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_lean_layers_give_the_layers_own_logits(kind: str, dtype: torch.dtype, monkeypatch) -> None:
    """engine.decoder's layers against the modules' forward on the same fast path: grouped keys (4 query heads,
    2 key heads), Qwen2's biases, half precision's casts; chains, a tree block, a commit."""
    model = tiny_model(kind, vocab=48).to(dtype)
    with torch.inference_mode():
        assert ModelRunner(model).lean == (4, 2, 8)
        lean = _run(model, True, keep_hidden=True)
    monkeypatch.setattr(ModelRunner, "lean_layers", False)
    with torch.inference_mode():
        assert ModelRunner(model).lean is None
        layers = _run(model, True, keep_hidden=True)
    tol = 1e-5 if dtype == torch.float32 else 1e-2  # float rounding: the stacked heads attend in other blocks
    for a, b in zip(lean, layers, strict=True):
        torch.testing.assert_close(a, b, rtol=tol, atol=tol)


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
@pytest.mark.parametrize("form", ["matmul", "sdpa+fused", "matmul+fused"])
def test_every_capture_form_gives_sdpas_logits(kind: str, form: str) -> None:
    """The lean layers' other capture forms (engine.decoder.attention_forms: attention as matrix products, the
    projections fused) against the first: chains of one and of several rows, a tree block, a commit; grouped keys,
    Qwen2's biases (stacked with the fused weights)."""
    model = tiny_model(kind, vocab=48)
    with torch.inference_mode():
        sdpa = _run(model, True, keep_hidden=True)
        other = _run(model, True, keep_hidden=True, attention=form)
    for a, b in zip(other, sdpa, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    # negative control: the form is read (a form it does not know is refused)
    with torch.inference_mode(), pytest.raises(ValueError, match="unknown attention form"):
        _run(model, True, keep_hidden=False, attention="flash")


@pytest.mark.parametrize("rows", [1, 3])
def test_attend_over_a_whole_masked_buffer_as_a_captured_pass_does(rows: int) -> None:
    """A captured pass attends over every row of its cache, the rows past the context masked with the dtype's lowest
    value; both forms agree there, and with attention over the context alone."""
    from adaptive_spec.engine.decoder import attend

    g = torch.Generator().manual_seed(0)
    heads, width, context, d = 2, 40, 17, 8
    q = torch.randn(1, heads, rows, d, generator=g)
    keys, values = torch.randn(1, heads, width, d, generator=g), torch.randn(1, heads, width, d, generator=g)
    mask = torch.zeros(1, 1, rows, width)
    mask[..., context:] = torch.finfo(torch.float32).min
    mask[..., 0, 3] = torch.finfo(torch.float32).min  # a tree row that does not see one of the context's rows
    inside = attend(q, keys[:, :, :context], values[:, :, :context], mask[..., :context], 0.3, "sdpa")
    for form in ("sdpa", "matmul"):
        torch.testing.assert_close(attend(q, keys, values, mask, 0.3, form), inside, rtol=1e-5, atol=1e-6)
    if rows == 1:  # one row, no mask: every key
        every = attend(q, keys, values, None, 0.3, "sdpa")
        torch.testing.assert_close(attend(q, keys, values, None, 0.3, "matmul"), every, rtol=1e-5, atol=1e-6)
        assert not torch.allclose(every, inside)  # negative control: the masked rows count when not masked


def test_the_runner_captures_lean_layers_in_every_form_unless_told(monkeypatch) -> None:
    model = tiny_model("llama", vocab=48)
    assert ModelRunner(model).attention_forms == ("sdpa", "sdpa+fused", "matmul", "matmul+fused")
    monkeypatch.setenv("ADAPTIVE_SPEC_ATTENTION", "sdpa")
    assert ModelRunner(model).attention_forms == ("sdpa", "sdpa+fused")
    monkeypatch.setenv("ADAPTIVE_SPEC_LINEARS", "split")
    assert ModelRunner(model).attention_forms == ("sdpa",)  # as before the projections could be fused
    monkeypatch.setenv("ADAPTIVE_SPEC_ATTENTION", "Matmul")
    monkeypatch.setenv("ADAPTIVE_SPEC_LINEARS", "fused")
    assert ModelRunner(model).attention_forms == ("matmul+fused",)
    monkeypatch.setenv("ADAPTIVE_SPEC_ATTENTION", "flash")
    with pytest.raises(ValueError, match="ADAPTIVE_SPEC_ATTENTION='flash': use one of sdpa, matmul"):
        ModelRunner(model)
    monkeypatch.setenv("ADAPTIVE_SPEC_ATTENTION", "sdpa")
    monkeypatch.setenv("ADAPTIVE_SPEC_LINEARS", "stacked")
    with pytest.raises(ValueError, match="ADAPTIVE_SPEC_LINEARS='stacked': use one of split, fused"):
        ModelRunner(model)
    monkeypatch.delenv("ADAPTIVE_SPEC_ATTENTION")
    monkeypatch.delenv("ADAPTIVE_SPEC_LINEARS")
    half = ModelRunner(tiny_model("llama", vocab=48).to(torch.bfloat16)).attention_forms
    assert half == ("sdpa", "sdpa+fused")  # the products' rounding: sdpa alone; fused projections are the same sums
    monkeypatch.setattr(ModelRunner, "lean_layers", False)  # the modules' own layers attend as they do
    assert ModelRunner(model).attention_forms == ("sdpa",)


def test_fused_projections_are_made_once_outside_the_state_dict_and_again_for_new_weights() -> None:
    """The stacked weights of a layer (engine.decoder.fused_weights) are kept on it, not in its state dict, reused
    while its weights stand, made again when one is replaced; a fused pass dispatches three products fewer a layer."""
    from adaptive_spec.engine.decoder import fused_weights

    model = tiny_model("qwen2", vocab=48)
    layer = model.model.layers[0]
    keys = set(model.state_dict())
    first = fused_weights(layer)
    assert fused_weights(layer) is first and set(model.state_dict()) == keys
    attn = layer.self_attn
    assert first.qkv.shape[0] == attn.q_proj.out_features + attn.k_proj.out_features + attn.v_proj.out_features
    assert first.qkv_bias is not None and first.gate_up_bias is None  # Qwen2: biases on q, k, v only
    with torch.no_grad():
        attn.k_proj.weight = torch.nn.Parameter(attn.k_proj.weight * 2)
    again = fused_weights(layer)
    assert again is not first and torch.equal(again.qkv[attn.q_proj.out_features :][:16], attn.k_proj.weight[:16])
    from torch.utils._python_dispatch import TorchDispatchMode

    class Products(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Products.n += func.overloadpacket in (torch.ops.aten.linear, torch.ops.aten.addmm, torch.ops.aten.mm)
            return func(*args, **(kwargs or {}))

    counts = {}
    for form in ("sdpa", "sdpa+fused"):
        runner = ModelRunner(model)
        runner.cache.attention_form = form
        Products.n = 0
        with torch.inference_mode(), Products():
            runner.chain_forward(torch.tensor([0, 5, 9]), logits_to_keep=1)
        counts[form] = Products.n
    assert counts["sdpa"] - counts["sdpa+fused"] == 3 * len(model.model.layers), counts


def test_lean_layers_dispatch_fewer_ops(monkeypatch) -> None:
    """Fewer kernels a layer (the point of engine.decoder): counted as aten ops dispatched by a tree block."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if not func.is_view:
                Count.n += 1
            return func(*args, **(kwargs or {}))

    model = tiny_model("llama", vocab=48, layers=4)
    counts = {}
    for flag in (True, False):
        monkeypatch.setattr(ModelRunner, "lean_layers", flag)
        with torch.inference_mode():
            runner = ModelRunner(model)
            runner.chain_forward(torch.tensor([0, 5, 9, 3, 7]), logits_to_keep=1)
            anc = torch.tensor([[1, 0, 0], [1, 1, 0], [1, 0, 1]], dtype=torch.bool)
            Count.n = 0
            with Count():
                runner.block_forward(torch.tensor([4, 12, 13]), torch.tensor([5, 6, 6]), anc, logits_to_keep=3)
            counts[flag] = Count.n
    assert counts[True] < 0.8 * counts[False], counts


def test_a_hook_on_a_layer_part_keeps_the_layers_own_forward() -> None:
    model = tiny_model("llama", vocab=48)
    calls = []
    handle = model.model.layers[1].self_attn.k_proj.register_forward_hook(lambda *_: calls.append(1))
    try:
        runner = ModelRunner(model)
        assert runner.fast_parts is not None and runner.lean is None
        with torch.inference_mode():
            runner.chain_forward(torch.tensor([0, 5, 9]), logits_to_keep=1)
        assert calls == [1]
    finally:
        handle.remove()
    assert ModelRunner(model).lean is not None


def test_lean_eagle_head_gives_the_layers_own_logits(monkeypatch) -> None:
    from adaptive_spec.engine.eagle import EagleConfig, EagleHead, EagleRunner

    target = tiny_model("llama", vocab=48, eos=None)
    head = EagleHead(EagleConfig.for_target(target.config, draft_vocab_size=40)).eval()
    head.set_vocabulary(torch.arange(40))
    head.bind(target)
    out = {}
    for flag in (True, False):
        monkeypatch.setattr(ModelRunner, "lean_layers", flag)
        with torch.inference_mode():
            runner = EagleRunner(head)
            assert (runner.lean is not None) == flag
            runner.set_target_features(0, torch.randn(4, 32, generator=torch.Generator().manual_seed(0)))
            first = runner.chain_forward(torch.tensor([0, 5, 9, 3]), logits_to_keep=2)
            anc = torch.tensor([[1, 0, 0], [1, 1, 0], [1, 0, 1]], dtype=torch.bool)
            block = runner.block_forward(torch.tensor([4, 12, 13]), torch.tensor([4, 5, 5]), anc, logits_to_keep=3)
            out[flag] = (first, block)
    for a, b in zip(out[True], out[False], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)


def test_a_model_loaded_with_eager_attention_keeps_its_own_layers() -> None:
    """The lean layers attend as sdpa does: a model loaded with attn_implementation="eager" runs its own modules."""
    assert ModelRunner(tiny_model("llama", vocab=48, attn="eager")).lean is None
    assert ModelRunner(tiny_model("llama", vocab=48, attn="sdpa")).lean == (4, 2, 8)
