"""The weight order chosen per host: measured once and cached, re-measured after a corrupt cache,
per forward size when the orders trade wins, overridden by ADAPTIVE_SPEC_WEIGHT_ORDER; same logits
whatever it picks."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from torch.nn import functional
from transformers import AutoModelForCausalLM

from adaptive_spec.engine import SpecEngine, weight_order
from adaptive_spec.engine.layout import PerSizeLinear, packing_available, row_major_linears
from adaptive_spec.engine.weight_order import CACHE_NAME, ORDER_ENV, SIZES, ShapeChoice, arrange_linears
from tests.engine.test_layout import _logits
from tests.helpers.tiny import tiny_model

ROW = [1.0] * len(SIZES)


def _fake(column_ms: list[float], calls: list):
    """A stand-in for measure_shape: the stock order 1 ms at every size, column-major ``column_ms``."""

    def measure(out, inp, dtype, bias, sizes=SIZES, deadline=None):
        calls.append((out, inp))
        faster = [1.0 if c < 1 else 0.0 for c in column_ms]
        return {"sizes": list(sizes), "row_ms": list(ROW), "column_ms": list(column_ms), "column_faster": faster}

    return measure


def _model():
    model = tiny_model("llama", vocab=48).eval()
    model.config.tie_word_embeddings = True
    model.tie_weights()
    return model


def _shapes(model) -> set[tuple[int, int]]:
    return {tuple(m.weight.shape) for m in model.modules() if isinstance(m, torch.nn.Linear)}


def _per_size(monkeypatch, measure):
    """A tiny model arranged with ``measure`` standing in for measure_shape, every weight per size; returns the
    model, its state dict and logits before, and its Linear layers. Same logits and state dict keys after.
    """
    monkeypatch.setattr(weight_order, "measure_shape", measure)
    model = _model()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    logits = _logits(model)
    counts = arrange_linears(model)
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    assert counts["per-size"] == len({id(m.weight) for m in linears}) and counts["column"] == counts["row"] == 0
    assert all(type(m) is PerSizeLinear and m.weight.is_contiguous() for m in linears)
    assert model.state_dict().keys() == before.keys()  # the copies are outside the state dict
    torch.testing.assert_close(_logits(model), logits, rtol=1e-5, atol=1e-5)
    return model, before, logits, linears


def _back_to_stock_and_saved(model, before, linears, copy_attr: str, tmp_path) -> None:
    """row_major_linears turns every layer back into a plain Linear without its copy; the model saves as loaded."""
    assert row_major_linears(model) == len({id(m.weight) for m in linears})
    assert all(type(m) is torch.nn.Linear and not hasattr(m, copy_attr) for m in linears)
    model.save_pretrained(tmp_path / "saved")
    again = AutoModelForCausalLM.from_pretrained(tmp_path / "saved")
    assert all(torch.equal(v, before[k]) for k, v in again.state_dict().items() if k in before)


@pytest.fixture
def auto(monkeypatch, tmp_path):
    """Auto order, a fresh user data folder; returns the cache path."""
    monkeypatch.setenv(ORDER_ENV, "auto")
    monkeypatch.setenv("ADAPTIVE_SPEC_HOME", str(tmp_path))
    return tmp_path / CACHE_NAME


def test_the_cache_is_written_once_and_reused(auto, monkeypatch) -> None:
    calls: list = []
    monkeypatch.setattr(weight_order, "measure_shape", _fake([0.5] * len(SIZES), calls))
    model = _model()
    counts = arrange_linears(model)
    assert sorted(calls) == sorted(_shapes(model))  # each distinct shape measured once
    assert counts["column"] == len({id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Linear)}) > 0
    assert counts["per-size"] == counts["row"] == 0
    entries = json.loads(auto.read_text())["entries"]
    assert len(entries) == len(calls)

    def no_measuring(*args, **kwargs):
        raise AssertionError("measured again despite the cache")

    monkeypatch.setattr(weight_order, "measure_shape", no_measuring)
    again = _model()
    assert arrange_linears(again) == counts
    assert all(not m.weight.is_contiguous() for m in again.modules() if isinstance(m, torch.nn.Linear))


@pytest.mark.parametrize("text", ["{not json", '{"format": "adaptive-spec weight order", "version": 1, "entries": []}'])
def test_a_corrupt_cache_is_measured_again(auto, monkeypatch, text) -> None:
    auto.write_text(text)
    calls: list = []
    monkeypatch.setattr(weight_order, "measure_shape", _fake([0.5] * len(SIZES), calls))
    arrange_linears(_model())
    assert calls
    assert len(json.loads(auto.read_text())["entries"]) == len(calls)


def test_a_malformed_entry_is_measured_again(auto, monkeypatch) -> None:
    calls: list = []
    monkeypatch.setattr(weight_order, "measure_shape", _fake([0.5] * len(SIZES), calls))
    arrange_linears(_model())
    data = json.loads(auto.read_text())
    first = sorted(data["entries"])[0]
    data["entries"][first]["row_ms"] = [1.0]  # too short
    auto.write_text(json.dumps(data))
    calls.clear()
    arrange_linears(_model())
    assert len(calls) == 1


def test_the_stock_order_where_column_major_wins_nowhere(auto, monkeypatch) -> None:
    monkeypatch.setattr(weight_order, "measure_shape", _fake([1.01] * len(SIZES), []))  # a tie: within the margin
    model = _model()
    counts = arrange_linears(model)
    assert counts["column"] == counts["per-size"] == 0 and counts["row"] > 0
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    assert all(m.weight.is_contiguous() and type(m) is torch.nn.Linear for m in linears)


def test_per_size_when_the_orders_trade_wins_same_logits(auto, monkeypatch, tmp_path) -> None:
    column = [0.5 if n <= 3 else 1.5 for n in SIZES]  # column-major wins at 1-3 rows, loses from 4 on
    model, before, logits, linears = _per_size(monkeypatch, _fake(column, []))
    assert all(not m.column_weight.tensor.is_contiguous() for m in linears)
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    # the forward size picks the copy: spoil the column-major copy, and only small forwards see it
    layer = model.model.layers[0].mlp.down_proj
    x1, x8 = torch.randn(1, 1, layer.in_features), torch.randn(1, 8, layer.in_features)
    with torch.inference_mode():
        good1, good8 = layer(x1), layer(x8)
    layer.column_weight.tensor = torch.zeros_like(layer.column_weight.tensor)
    with torch.inference_mode():
        assert not torch.allclose(layer(x1), good1) and torch.equal(layer(x8), good8)
    assert torch.allclose(layer(x1), good1)  # with autograd on, the stock weight: gradients reach it
    # load_state_dict writes the weights in place: the (spoiled) copy is made again from them
    model.load_state_dict({k: 2 * v for k, v in before.items()})
    with torch.inference_mode():
        torch.testing.assert_close(layer(x1), 2 * good1, rtol=1e-5, atol=1e-5)
    model.load_state_dict(before)
    torch.testing.assert_close(_logits(model), logits, rtol=1e-5, atol=1e-5)
    _back_to_stock_and_saved(model, before, linears, "column_weight", tmp_path)


def test_copies_never_go_stale_unseen_nor_linger_off_the_cpu(auto, monkeypatch) -> None:
    column = [0.5 if n <= 3 else 1.5 for n in SIZES]
    model, before, _, linears = _per_size(monkeypatch, _fake(column, []))
    layer = model.model.layers[0].mlp.down_proj
    x1 = torch.randn(1, 1, layer.in_features)
    # a weight that keeps no version counter (made under inference mode): its writes in place cannot be seen, so a
    # forward multiplies by the weight itself, never by a copy made before such a write
    with torch.inference_mode():
        layer.weight = torch.nn.Parameter(before["model.layers.0.mlp.down_proj.weight"].clone(), requires_grad=False)
        layer(x1)
        layer.weight.mul_(3)
        torch.testing.assert_close(layer(x1), functional.linear(x1, layer.weight), rtol=1e-5, atol=1e-5)
    assert layer.column_weight.tensor is None
    # moved off the CPU, every layer drops its copies (they would only hold host memory)
    with torch.inference_mode():
        model(torch.tensor([[1, 2, 3]]))
    assert all(m.column_weight.tensor is not None for m in linears if m is not layer)
    model.to("meta")
    assert all(m.column_weight.tensor is None for m in linears)


def test_a_model_made_under_inference_mode_keeps_the_stock_form(auto, monkeypatch) -> None:
    monkeypatch.setattr(weight_order, "measure_shape", _fake([0.5 if n <= 3 else 1.5 for n in SIZES], []))
    with torch.inference_mode():
        model = _model()
        twice = {k: 2 * v for k, v in model.state_dict().items()}
    counts = arrange_linears(model)
    assert counts["per-size"] == 0 and counts["row"] > 0
    assert not any(isinstance(m, PerSizeLinear) for m in model.modules())
    with torch.inference_mode():
        model.load_state_dict(twice)  # a write in place no copy would have seen
    fresh = _model()
    fresh.load_state_dict(twice)
    torch.testing.assert_close(_logits(model), _logits(fresh), rtol=1e-5, atol=1e-5)


def test_no_second_copies_past_the_memory_share(auto, monkeypatch) -> None:
    monkeypatch.setattr(weight_order, "measure_shape", _fake([0.5 if n <= 3 else 1.5 for n in SIZES], []))
    monkeypatch.setattr(weight_order, "_physical_memory", lambda: 1024)
    model = _model()
    counts = arrange_linears(model)
    assert counts["per-size"] == 0 and counts["row"] > 0
    assert not any(isinstance(m, PerSizeLinear) for m in model.modules())


def test_a_shape_out_of_time_keeps_the_stock_order_and_is_retried_later(auto, monkeypatch) -> None:
    calls: list = []

    def out_of_time(*args, **kwargs):
        calls.append(args)
        return None

    monkeypatch.setattr(weight_order, "measure_shape", out_of_time)
    model = _model()
    assert arrange_linears(model)["row"] > 0
    assert all(m.weight.is_contiguous() for m in model.modules() if isinstance(m, torch.nn.Linear))
    tried = len(calls)
    assert tried == len(_shapes(model))
    arrange_linears(_model())
    assert len(calls) == tried  # not again within the hour
    data = json.loads(auto.read_text())
    for entry in data["entries"].values():
        entry["given_up"] -= weight_order.RETRY_S
    auto.write_text(json.dumps(data))
    monkeypatch.setattr(weight_order, "measure_shape", _fake([0.5] * len(SIZES), calls))
    assert arrange_linears(_model())["column"] > 0
    assert len(calls) == 2 * tried


@pytest.mark.parametrize("order", ["row", "column"])
def test_the_override_needs_no_measurement(monkeypatch, tmp_path, order) -> None:
    monkeypatch.setenv(ORDER_ENV, order)
    monkeypatch.setenv("ADAPTIVE_SPEC_HOME", str(tmp_path))
    monkeypatch.setattr(weight_order, "measure_shape", lambda *a, **k: pytest.fail("measured"))
    model = _model()
    logits = _logits(model)
    counts = arrange_linears(model)
    assert counts[order] > 0 and counts["per-size"] == 0 and sum(counts.values()) == counts[order]
    weights = [m.weight for m in model.modules() if isinstance(m, torch.nn.Linear)]
    assert all(w.is_contiguous() == (order == "row") for w in weights)
    torch.testing.assert_close(_logits(model), logits, rtol=1e-5, atol=1e-5)
    assert not (tmp_path / CACHE_NAME).exists()


def test_a_bad_override_is_one_clear_line(monkeypatch) -> None:
    monkeypatch.setenv(ORDER_ENV, "sideways")
    with pytest.raises(ValueError, match=f"^{ORDER_ENV} must be one of auto, column, packed, row, got 'sideways'$"):
        arrange_linears(_model())


def test_a_win_needs_the_margin_and_the_agreement() -> None:
    sizes = (1, 2, 4)

    def choice(column_ms, faster):
        return ShapeChoice("8x8 float32", sizes, (1.0, 1.0, 1.0), tuple(column_ms), tuple(faster))

    assert choice([0.9, 0.9, 1.1], [1.0, 0.4, 0.0]).wins() == ["column", "tie", "row"]
    assert choice([0.9, 1.0, 1.0], [1.0, 0.6, 0.4]).order == "column"
    assert choice([0.9, 1.5, 0.9], [1.0, 0.6, 1.0]).wins() == ["column", "row", "column"]  # slower: no agreement asked
    mixed = choice([0.9, 1.1, 0.9], [1.0, 0.0, 1.0])
    assert mixed.order == "per-size"
    forms, above = mixed.row_forms()
    assert forms == ("row", "column", "row", "row", "column") and above == "column"  # 3: between a loss and a win


def test_measure_shape_reports_both_orders_and_stops_at_its_deadline() -> None:
    got = weight_order.measure_shape(16, 24, torch.float32, True, sizes=(1, 3))
    assert got["sizes"] == [1, 3] and len(got["row_ms"]) == len(got["column_ms"]) == 2
    assert all(x > 0 for x in got["row_ms"] + got["column_ms"])
    assert all(0 <= x <= 1 for x in got["column_faster"])
    assert weight_order.measure_shape(16, 24, torch.float32, False, deadline=0.0) is None


# ------------------------------------------------------------------ oneDNN's packed copy

needs_packing = pytest.mark.skipif(not packing_available(), reason="this torch has no oneDNN packed linear")


def _fake_packed(column_ms: list[float], packed_ms: list[float]):
    """measure_shape's stand-in with the packed form: the stock order 1 ms at every size."""

    def measure(out, inp, dtype, bias, sizes=SIZES, deadline=None):
        got = _fake(column_ms, [])(out, inp, dtype, bias, sizes)
        return got | {"packed_ms": list(packed_ms), "packed_faster": [1.0 if p < 1 else 0.0 for p in packed_ms]}

    return measure


def test_a_packed_win_takes_its_sizes_and_must_beat_the_better_order() -> None:
    sizes = (1, 2, 4)

    def choice(column_ms, packed_ms):
        faster = [1.0] * 3
        return ShapeChoice("8x8 float32", sizes, (1.0,) * 3, tuple(column_ms), tuple(faster), tuple(packed_ms), faster)

    both = choice([0.8, 0.9, 1.1], [0.9, 0.5, 0.6])
    assert both.wins() == ["column", "packed", "packed"] and both.order == "per-size"
    assert choice([1.0, 1.0, 1.0], [0.5, 0.5, 0.5]).wins()[0] == "tie"  # never at one row (PACKED_FROM)
    forms, above = both.row_forms()
    assert forms == ("row", "column", "packed", "packed", "packed") and above == "packed"
    assert choice([1.0, 1.0, 1.0], [0.5, 0.97, 0.5]).wins() == ["tie", "tie", "packed"]  # 3 % is within the margin
    assert choice([0.8, 0.8, 0.8], [0.78, 0.7, 0.5]).wins() == ["column", "packed", "packed"]  # it must beat column too
    gap = choice([1.0, 1.0, 1.0], [0.5, 1.0, 0.5])  # 3 rows lie between a tie and a packed win: the stock order
    assert gap.row_forms() == (("row", "row", "row", "row", "packed"), "packed")
    assert ShapeChoice("8x8 float32", sizes, (1.0,) * 3, (0.5,) * 3, (1.0,) * 3).order == "column"  # no packed form


@needs_packing
def test_packed_where_it_wins_same_logits_and_state(auto, monkeypatch, tmp_path) -> None:
    column = [0.5 if n == 1 else 1.5 for n in SIZES]  # column-major at one row, packed from two on
    measure = _fake_packed(column, [1.2 if n == 1 else 0.5 for n in SIZES])
    model, before, logits, linears = _per_size(monkeypatch, measure)
    assert all(m.row_forms[:3] == ("row", "column", "packed") and m.form_above == "packed" for m in linears)
    # the forward size picks the form: spoil the packed copy, and only forwards of two rows and more see it
    layer = model.model.layers[0].mlp.down_proj
    x1, x8 = torch.randn(1, 1, layer.in_features), torch.randn(1, 8, layer.in_features)
    with torch.inference_mode():
        good1, good8 = layer(x1), layer(x8)
        layer.packed_weight.tensor = torch.ops.mkldnn._reorder_linear_weight(torch.zeros_like(layer.weight), 1)
        assert torch.equal(layer(x1), good1) and not torch.allclose(layer(x8), good8)
    assert torch.allclose(layer(x8), good8, rtol=1e-5, atol=1e-5)  # autograd on: the stock weight
    # a weight written in place is packed again
    with torch.no_grad():
        layer.weight.mul_(2)
    with torch.inference_mode():
        torch.testing.assert_close(layer(x8), 2 * good8, rtol=1e-5, atol=1e-5)
    # a copy packs its own (an opaque tensor cannot be copied), and gives the same logits
    with torch.no_grad():
        layer.weight.div_(2)
    twin = copy.deepcopy(model)
    torch.testing.assert_close(_logits(twin), logits, rtol=1e-5, atol=1e-5)
    _back_to_stock_and_saved(model, before, linears, "packed_weight", tmp_path)


@needs_packing
def test_the_packed_override_same_greedy_tokens(tiny_pair, monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("ADAPTIVE_SPEC_HOME", str(tmp_path))
    monkeypatch.setattr(weight_order, "measure_shape", lambda *a, **k: pytest.fail("measured"))
    monkeypatch.setenv(ORDER_ENV, "packed")
    packed = SpecEngine.from_pretrained(device="cpu")
    for m in (packed.target, packed.draft):
        linears = [x for x in m.modules() if isinstance(x, torch.nn.Linear)]
        assert linears and all(type(x) is PerSizeLinear and x.form_above == "packed" for x in linears)
    monkeypatch.setenv(ORDER_ENV, "row")
    plain = SpecEngine.from_pretrained(device="cpu")
    for plan in ("autoregressive", "chain:2/block", "iid:2x2/specinfer"):
        a = packed.generate("w5 w6 w7", max_new_tokens=12, temperature=0.0, plan=plan)
        b = plain.generate("w5 w6 w7", max_new_tokens=12, temperature=0.0, plan=plan)
        assert a.token_ids == b.token_ids, plan
    assert not (tmp_path / CACHE_NAME).exists()


def test_the_packed_override_without_onednn_is_one_clear_line(monkeypatch) -> None:
    monkeypatch.setenv(ORDER_ENV, "packed")
    monkeypatch.setattr(weight_order, "packing_available", lambda: False)
    with pytest.raises(ValueError, match=f"^{ORDER_ENV}=packed needs torch built with oneDNN"):
        arrange_linears(_model())


@needs_packing
def test_measure_shape_times_the_packed_form_where_there_is_one(monkeypatch) -> None:
    got = weight_order.measure_shape(16, 24, torch.float32, True, sizes=(1, 3))
    assert len(got["packed_ms"]) == 2 and all(x > 0 for x in got["packed_ms"])
    assert all(0 <= x <= 1 for x in got["packed_faster"])
    monkeypatch.setattr(weight_order, "packing_available", lambda: False)
    got = weight_order.measure_shape(16, 24, torch.float32, True, sizes=(1, 3))
    assert got["packed_ms"] is None and got["packed_faster"] is None
