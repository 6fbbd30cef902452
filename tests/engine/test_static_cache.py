"""Static KV caches and the engine's lending of them; the captured path on a CPU with a stand-in for the graph (the
CUDA graphs themselves: tests/engine/test_cuda.py)."""

from __future__ import annotations

import logging

import pytest
import torch

from adaptive_spec.engine import SpecEngine
from adaptive_spec.engine.graphs import BUCKETS, ModelSlot, bucket_for, fastest_bucket
from adaptive_spec.engine.runner import ModelRunner
from adaptive_spec.engine.static_cache import SCRATCH, StaticKV, round_capacity
from tests.helpers.graphs import record_ops, slots_as_on_cuda
from tests.helpers.tiny import perturbed, tiny_model


def test_buckets() -> None:
    assert [bucket_for(n) for n in (1, 2, 3, 5, 9, 64, 65, 128)] == [1, 2, 4, 8, 16, 64, 128, 128]
    assert bucket_for(129) is None
    assert BUCKETS[-1] <= SCRATCH
    assert round_capacity(1) == 256 and round_capacity(257) == 512


def test_rollback_moves_a_length_and_commit_moves_rows() -> None:
    model = tiny_model("llama", vocab=48)
    runner = ModelRunner(model)
    assert runner.slot is not None and isinstance(runner.cache, StaticKV)
    kv = runner.slot.kv
    bufs = [*kv.keys, *kv.values]  # every layer's keys and values: views of one buffer, moved in one copy
    assert len(bufs) == 2 * model.config.num_hidden_layers >= 4
    with torch.inference_mode():
        runner.chain_forward(torch.tensor([0, 5, 9, 3]), logits_to_keep=1)
        before = [b.clone() for b in bufs]
        anc = torch.tensor([[1, 0, 0], [1, 1, 0], [1, 0, 1]], dtype=torch.bool)
        runner.block_forward(torch.tensor([7, 8, 9]), torch.tensor([4, 5, 5]), anc, logits_to_keep=3)
        assert runner.cache_length() == 7 and runner.cached == 4
        written = [b.clone() for b in bufs]
        runner.commit(4, torch.tensor([4, 6]))  # keep rows 4 and 6, in that order
    assert runner.cached == runner.cache_length() == 6
    for buf, old, new in zip(bufs, before, written, strict=True):
        assert not torch.equal(new[:, :, 4], new[:, :, 6])  # the move is visible
        torch.testing.assert_close(buf[:, :, :4], old[:, :, :4])
        torch.testing.assert_close(buf[:, :, 4], new[:, :, 4])
        torch.testing.assert_close(buf[:, :, 5], new[:, :, 6])
    runner.rollback(5)
    assert runner.cached == runner.cache_length() == 5
    try:
        runner.rollback(6)
    except RuntimeError as err:
        assert "cannot roll back" in str(err)
    else:
        raise AssertionError("a rollback past the written rows must fail")


def test_the_cache_grows_keeping_its_rows() -> None:
    model = tiny_model("llama", vocab=48, max_positions=2048)
    runner = ModelRunner(model)
    first = runner.slot.kv
    ids = torch.arange(300) % 40 + 3
    with torch.inference_mode():
        a = runner.chain_forward(ids[:200], logits_to_keep=1)
        kept = first.keys[1][:, :, :200].clone()
        b = runner.chain_forward(ids[200:], logits_to_keep=1)  # past the first capacity (256)
    assert runner.slot.kv is not first and runner.slot.kv.capacity >= 300
    torch.testing.assert_close(runner.slot.kv.keys[1][:, :, :200], kept)
    with torch.inference_mode():
        whole = model(input_ids=ids[None]).logits[0]
    torch.testing.assert_close(a[0], whole[199], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(b[0], whole[-1], rtol=1e-4, atol=1e-4)


def _pair():
    target = tiny_model("llama", vocab=48, eos=None)
    return target, perturbed(target, scale=0.3)


def test_the_engine_lends_its_caches_to_one_run_at_a_time() -> None:
    target, draft = _pair()
    engine = SpecEngine(target, draft)
    first = engine.generate([0, 5, 6], max_new_tokens=8, temperature=0, plan="chain:3/block")
    slots = {role: list(v) for role, v in engine._idle_slots.items()}
    assert len(slots["target"]) == 1 and len(slots["draft"]) == 1
    again = engine.generate([0, 5, 6], max_new_tokens=8, temperature=0, plan="chain:3/block")
    assert again.token_ids == first.token_ids
    assert engine._idle_slots["target"] == slots["target"]  # reused, not reallocated
    # A run left half-way (a stream) holds its caches; a generation meanwhile gets others, and both stay right.
    from adaptive_spec.engine.request import build_request

    it = engine._run(build_request(engine, [0, 9, 3, 4], 12, 0.0, plan="chain:2/block"))
    head = next(it)
    other = engine.generate([0, 5, 6], max_new_tokens=8, temperature=0, plan="chain:3/block")
    assert other.token_ids == first.token_ids
    rest = list(head)
    for chunk in it:
        rest.extend(chunk)
    plain = engine.generate([0, 9, 3, 4], max_new_tokens=12, temperature=0, plan=None)
    assert rest == plain.token_ids


def test_kept_state_keeps_its_caches() -> None:
    target, draft = _pair()
    engine = SpecEngine(target, draft)
    kept = engine.generate([0, 5, 6], max_new_tokens=6, temperature=0, plan="chain:2/block", keep_state=True)
    engine.generate([0, 7, 8, 9, 10], max_new_tokens=6, temperature=0, plan="chain:2/block")
    assert kept.state.target.slot not in engine._idle_slots["target"]
    n = kept.state.target.cached
    ctx = kept.state.context
    with torch.inference_mode():
        k_full = target(input_ids=torch.tensor([ctx[:n]]), use_cache=True).past_key_values.layers[0].keys
    torch.testing.assert_close(kept.state.target.slot.kv.keys[0][:, :, :n], k_full[:, :, :n], rtol=1e-4, atol=1e-5)


def test_a_failed_capture_logs_one_line_and_runs_eagerly(monkeypatch, caplog) -> None:
    model = tiny_model("llama", vocab=48)
    slot = ModelSlot(model, 64)
    slot.graphs_on = True  # as on CUDA; the capture itself is made to fail

    def fail(*_args, **_kwargs):
        raise RuntimeError("operation not permitted when stream is capturing\nmore detail")

    monkeypatch.setattr(ModelSlot, "_capture", fail)
    runner = ModelRunner(model, slot=slot)
    eager = ModelRunner(tiny_model("llama", vocab=48))
    with caplog.at_level(logging.WARNING, logger="adaptive_spec.engine"), torch.inference_mode():
        a = runner.chain_forward(torch.tensor([0, 5, 9]), logits_to_keep=2)
        b = runner.chain_forward(torch.tensor([4]), logits_to_keep=1)
        ea = eager.chain_forward(torch.tensor([0, 5, 9]), logits_to_keep=2)
        eb = eager.chain_forward(torch.tensor([4]), logits_to_keep=1)
    torch.testing.assert_close(a, ea)
    torch.testing.assert_close(b, eb)
    lines = [r.getMessage() for r in caplog.records if "capture" in r.getMessage()]
    assert len(lines) == 1 and "RuntimeError: operation not permitted" in lines[0] and "\n" not in lines[0]
    assert slot.failed is not None and slot.captured == []


def test_fastest_bucket_takes_a_larger_bucket_only_when_clearly_faster() -> None:
    # SmolLM2's captured passes on an H100 (ms): 8 and 16 rows cost more than 32
    times = {1: 5.08, 2: 6.08, 4: 5.94, 8: 9.08, 16: 9.48, 32: 6.65, 64: 7.19, 128: 9.0}
    assert [fastest_bucket(n, times) for n in (1, 2, 3, 5, 9, 17, 33, 65)] == [1, 2, 4, 32, 32, 32, 64, 128]
    assert fastest_bucket(2, {2: 1.0, 4: 0.95}) == 2  # within 10 %: the smaller bucket, fewer padding rows
    assert fastest_bucket(2, {2: 1.0, 4: 0.85}) == 4
    assert fastest_bucket(129, times) is None and fastest_bucket(3, {1: 1.0, 2: 1.0}) is None


def test_a_slot_captures_and_times_every_larger_bucket_and_replays_the_fastest(monkeypatch) -> None:
    model = tiny_model("llama", vocab=48)
    slot = ModelSlot(model, 64)
    slot.graphs_on = True  # as on CUDA; capture and timing stand in for the device's
    cost = {1: 5.0, 2: 6.0, 4: 6.0, 8: 9.0, 16: 9.5, 32: 6.6, 64: 7.2, 128: 9.0}
    captured = []
    monkeypatch.setattr(ModelSlot, "_capture", lambda self, b, core, extra: captured.append(b) or f"graph {b}")
    monkeypatch.setattr(ModelSlot, "_time", lambda self, g: cost[int(g.split()[1])])
    assert slot.graph(9, None, ()) == "graph 32"
    assert captured == [16, 32, 64, 128] and slot.captured == [16, 32, 64, 128]
    assert slot.graph(16, None, ()) == "graph 32" and slot.graph(40, None, ()) == "graph 64"
    assert slot.graph(3, None, ()) == "graph 4"  # 4 and 8 captured now; 4 is the fastest holding 3 rows
    assert captured == [16, 32, 64, 128, 4, 8] and slot.times == {b: cost[b] for b in captured}
    assert slot.graph(129, None, ()) is None  # past the largest bucket: eager
    slot.ensure(slot.kv.capacity + 1, keep=0)  # a grown cache drops the graphs and their times
    assert slot.captured == [] and slot.times == {}


def test_a_slot_captures_each_attention_form_and_keeps_the_faster(monkeypatch, caplog) -> None:
    """Each bucket captured in every form the runner names, the cache's attention_form set while capturing, each timed,
    the fastest kept per bucket; a second form that cannot be captured is said once and dropped."""
    slot = ModelSlot(tiny_model("llama", vocab=48), 64)
    slot.graphs_on = True  # as on CUDA; capture and timing stand in for the device's
    # replay ms: sdpa grows with the buffer's rows a pass reads, the products less (made-up figures)
    cost = {"sdpa": {1: 4.0, 2: 5.0, 4: 5.0, 8: 5.5}, "matmul": {1: 2.5, 2: 6.0, 4: 3.0, 8: 3.2}}
    captured = []
    monkeypatch.setattr(
        ModelSlot,
        "_capture",
        lambda self, b, core, extra: captured.append((b, self.kv.attention_form)) or (b, captured[-1][1]),
    )
    monkeypatch.setattr(ModelSlot, "_time", lambda self, g: cost[g[1]].get(g[0], 9.0))
    assert slot.graph(8, None, (), ("sdpa", "matmul")) == (8, "matmul")
    assert captured[:2] == [(8, "sdpa"), (8, "matmul")] and slot.kv.attention_form == "sdpa"  # restored after
    assert slot.graph(1, None, (), ("sdpa", "matmul")) == (1, "matmul")
    assert slot.graph(2, None, (), ("sdpa", "matmul")) == (4, "matmul")  # 2's sdpa (5.0) is slower than 4's products
    assert slot.forms[2] == "sdpa" and slot.form_times[2] == {"sdpa": 5.0, "matmul": 6.0} and slot.times[2] == 5.0
    assert slot.forms[4] == "matmul" and slot.times[4] == 3.0
    slot.ensure(slot.kv.capacity + 1, keep=0)  # a grown cache drops them all
    assert slot.forms == {} and slot.form_times == {} and slot.captured == []

    def products_fail(self, b, core, extra):
        if self.kv.attention_form == "matmul":
            raise RuntimeError("no such kernel\ntrace")
        return (b, "sdpa")

    monkeypatch.setattr(ModelSlot, "_capture", products_fail)
    with caplog.at_level(logging.WARNING, logger="adaptive_spec.engine"):
        assert slot.graph(1, None, (), ("sdpa", "matmul")) == (1, "sdpa")
        assert slot.graph(8, None, (), ("sdpa", "matmul")) == (8, "sdpa")
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "matmul attention failed (RuntimeError: no such kernel)" in lines[0]
    assert slot.failed is None and set(slot.form_failed) == {"matmul"}
    assert slot.form_times and all(set(times) == {"sdpa"} for times in slot.form_times.values())


def test_a_compiled_slot_compiles_the_small_buckets_it_needs_and_replays_the_fastest_graph(monkeypatch, caplog) -> None:
    import adaptive_spec.engine.graphs as graphs

    model = tiny_model("llama", vocab=48)
    assert not ModelSlot(model, 64, graphs=True, compiled=True).compile_on  # a CPU captures nothing
    slot = ModelSlot(model, 64, compiled=True)
    slot.graphs_on = slot.compile_on = True  # as on CUDA; compilation, capture and timing stand in
    # replay ms on an H200 (a SmolLM2-shaped pass): eager captures, and compiled ones where measured
    eager = {1: 4.68, 2: 5.5, 4: 5.49, 8: 6.5, 16: 6.5, 32: 6.22, 64: 7.0, 128: 9.0}
    compiled = {1: 3.42, 2: 6.0, 4: 4.21}
    captured = []
    monkeypatch.setattr(graphs, "_compiled", lambda core: ("compiled", core))
    monkeypatch.setattr(
        ModelSlot, "_capture", lambda self, b, core, extra: captured.append((b, core)) or (isinstance(core, tuple), b)
    )
    monkeypatch.setattr(ModelSlot, "_time", lambda self, g: (compiled if g[0] else eager)[g[1]])
    assert slot.graph(1, "core", ()) == (True, 1)  # every eager bucket, then bucket 1 compiled: faster
    assert captured == [(b, "core") for b in BUCKETS] + [(1, ("compiled", "core"))]
    assert slot.graph(2, "core", ()) == (False, 2)  # compiled, but slower than the eager capture
    assert slot.graph(3, "core", ()) == (True, 4)
    assert slot.graph(9, "core", ()) == (False, 16)  # not compiled: past the small buckets
    assert set(slot.compile_s) == set(slot.compiled_times) == {1, 2, 4} and len(captured) == len(BUCKETS) + 3
    assert slot.graph(1, "core", ()) == (True, 1) and len(captured) == len(BUCKETS) + 3  # each compiled once
    # what each size replays now, as bench passes reports it: (bucket, ms, compiled); 2 rows: the compiled 4
    assert [slot.replayed(n) for n in (1, 2, 3, 9)] == [
        (1, 3.42, True),
        (4, 4.21, True),
        (4, 4.21, True),
        (16, 6.5, False),
    ]
    # a compilation that fails says so once and keeps the eager captures
    slot.ensure(slot.kv.capacity + 1, keep=0)
    assert slot.captured == [] and slot.compiled_times == {} and slot.replayed(1) is None

    def broken(core):
        raise RuntimeError("inductor: no compiler\nlong trace")

    monkeypatch.setattr(graphs, "_compiled", broken)
    with caplog.at_level(logging.WARNING, logger="adaptive_spec.engine"):
        assert slot.graph(1, "core", ()) == (False, 1) and slot.graph(4, "core", ()) == (False, 4)
    lines = [r.getMessage() for r in caplog.records if "compiling" in r.getMessage()]
    assert len(lines) == 1 and "RuntimeError: inductor: no compiler" in lines[0] and "\n" not in lines[0]
    assert slot.compile_failed is not None and slot.failed is None and slot.compiled_times == {}


def test_a_compiled_slot_is_sized_as_the_others_and_says_when_it_grows(monkeypatch, caplog) -> None:
    import adaptive_spec.engine.graphs as graphs

    # A captured pass attends over every row the cache holds: a compiling slot holds no more than a request
    # needs, and a growth that drops compiled graphs (~30 s a bucket to compile again) is said in one line.
    slot = ModelSlot(tiny_model("llama", vocab=48), 64, compiled=True)
    assert slot.kv.capacity == 256
    slot.graphs_on = slot.compile_on = True  # as on CUDA; compilation, capture and timing stand in
    monkeypatch.setattr(graphs, "_compiled", lambda core: ("compiled", core))
    monkeypatch.setattr(ModelSlot, "_capture", lambda self, b, core, extra: (isinstance(core, tuple), b))
    monkeypatch.setattr(ModelSlot, "_time", lambda self, g: 1.0 if g[0] else 2.0)
    with caplog.at_level(logging.WARNING, logger="adaptive_spec.engine"):
        slot.ensure(300)  # nothing compiled yet: grows quietly, to the usual rounding
        assert slot.kv.capacity == 512 and not caplog.records
        assert slot.graph(1, "core", ()) == (True, 1)
        slot.ensure(512)  # a request within it keeps the compiled graphs
        assert slot.compiled_times == {1: 1.0} and not caplog.records
        first = slot.compile_s[1]
        slot.ensure(513, keep=10)
    assert slot.kv.capacity == 768 and slot.compiled_times == {}
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "grows to 768 rows" in lines[0] and "compile again" in lines[0]
    assert slot.graph(1, "core", ()) == (True, 1) and slot.compile_s[1] > first  # the seconds add up


def test_compiled_forwards_are_a_no_op_on_a_cpu() -> None:
    target = tiny_model("llama", vocab=48, eos=None)
    with pytest.warns(UserWarning, match="compile_forwards=True has no effect here"):
        engine = SpecEngine(target, perturbed(target, scale=0.3), compile_forwards=True)
    plain = SpecEngine(target, perturbed(target, scale=0.3))
    for plan in ("autoregressive", "chain:3/block"):
        got = engine.generate([0, 5, 6], max_new_tokens=12, temperature=0, plan=plan).token_ids
        assert got == plain.generate([0, 5, 6], max_new_tokens=12, temperature=0, plan=plan).token_ids
    assert engine.compile_forwards and not engine._idle_slots["target"][0].compile_on
    assert engine.compile_times() == {"target": {}, "draft": {}}
    # two idle slots of one model (after concurrent requests): each compiled its own buckets, and both count
    a, b = ModelSlot(target, 64), ModelSlot(target, 64)
    a.compile_s, b.compile_s = {1: 20.0, 4: 22.0}, {1: 5.0}
    engine._idle_slots["target"] = [a, b]
    assert engine.compile_times() == {"target": {1: 25.0, 4: 22.0}, "draft": {}}


def test_compiling_raises_dynamos_recompile_limit(monkeypatch) -> None:
    import torch._dynamo.config as dynamo_config

    from adaptive_spec.engine.graphs import _compiled

    monkeypatch.setattr(dynamo_config, "recompile_limit", 8)  # the default: 3 buckets x 2 models x 2 sizes pass it
    compiled = _compiled(lambda x: x + 1)
    assert dynamo_config.recompile_limit == 64 and callable(compiled)


@pytest.mark.parametrize(("lean", "attention"), [(True, "sdpa"), (True, "matmul"), (False, "")])
def test_replays_give_the_eager_logits_and_padding_rows_write_only_scratch_rows(monkeypatch, lean, attention) -> None:
    """The captured path's inputs on a CPU (ModelSlot.replay: inputs copied in, the mask over the whole buffer, rows
    and padding), with the graph replaced by a stand-in that runs the same core: logits equal the eager path's,
    committed rows and rows past the block are untouched, padding rows write scratch rows. Grouped keys (4 query
    heads, 2 key heads), the lean layers of engine.decoder in each attention form and the modules' own."""
    monkeypatch.setenv("ADAPTIVE_SPEC_ATTENTION", attention)
    monkeypatch.setattr(ModelSlot, "_record", record_ops)
    monkeypatch.setattr(ModelSlot, "_time", lambda self, g: float(g.rows.numel()))  # smaller buckets are faster
    monkeypatch.setattr(ModelRunner, "lean_layers", lean)
    model = tiny_model("llama", vocab=48)
    slot = ModelSlot(model, 64)
    slot.graphs_on = True
    runner, eager = ModelRunner(model, slot=slot), ModelRunner(model, slot=ModelSlot(model, 64))
    assert (runner.lean is not None) == lean
    anc = torch.tensor([[1, 0, 0], [1, 1, 0], [1, 0, 1]], dtype=torch.bool)
    with torch.inference_mode():
        for r in (runner, eager):  # 5 rows: bucket 8, three padding rows
            r.chain_forward(torch.tensor([0, 5, 9, 3, 7]), logits_to_keep=5)
        got = runner.chain_forward(torch.tensor([4]), logits_to_keep=1)  # one row, no mask: bucket 1
        want = eager.chain_forward(torch.tensor([4]), logits_to_keep=1)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        # a 4-row block first (bucket 4, no padding), rolled back: the graph's 4th input row now holds a real token,
        # which the 3-row block's padding row reads
        four = torch.ones(4, 4, dtype=torch.bool).tril_()
        runner.block_forward(torch.tensor([11, 12, 13, 14]), torch.arange(6, 10), four, 4)
        runner.rollback(6)
        keys = slot.kv.keys[0]
        before = keys.clone()
        ids, pos = torch.tensor([7, 8, 9]), torch.tensor([6, 7, 7])
        got = runner.block_forward(ids, pos, anc, logits_to_keep=3)  # 3 rows: bucket 4, one padding row
        want = eager.block_forward(ids, pos, anc, logits_to_keep=3)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        cap = slot.kv.capacity
        torch.testing.assert_close(keys[:, :, :6], before[:, :, :6])  # committed rows untouched
        torch.testing.assert_close(keys[:, :, 9:cap], before[:, :, 9:cap])  # nothing past the block's rows
        assert not torch.equal(keys[:, :, cap:], before[:, :, cap:])  # the padding row wrote a scratch row
        for r in (runner, eager):
            r.commit(6, torch.tensor([6, 8]))
        got = runner.chain_forward(torch.tensor([11]), logits_to_keep=1)
        want = eager.chain_forward(torch.tensor([11]), logits_to_keep=1)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert {1, 4, 8} <= set(slot.captured) and slot.failed is None
    assert set(slot.forms.values()) == {attention or "sdpa"}  # the modules' own layers: sdpa, their attention


@pytest.mark.parametrize("attention", ["sdpa", "matmul"])
def test_a_captured_pass_reads_no_scratch_row(monkeypatch, attention) -> None:
    """A captured pass attends over the cache's capacity rows, not the scratch rows after them (each row read costs a
    pass time on a GPU, masked or not): NaN keys and values in a scratch row no padding row writes leave the logits
    equal to the eager path's; the same NaN in a row of the capacity past the context would not (the control)."""
    monkeypatch.setenv("ADAPTIVE_SPEC_ATTENTION", attention)
    monkeypatch.setattr(ModelSlot, "_record", record_ops)
    monkeypatch.setattr(ModelSlot, "_time", lambda self, g: float(g.rows.numel()))
    model = tiny_model("llama", vocab=48)
    slot = ModelSlot(model, 64)
    slot.graphs_on = True
    runner, eager = ModelRunner(model, slot=slot), ModelRunner(model, slot=ModelSlot(model, 64))
    cap = slot.kv.capacity
    with torch.inference_mode():
        for r in (runner, eager):
            r.chain_forward(torch.tensor([0, 5, 9, 3, 7]), logits_to_keep=1)
        slot.kv.buffer[:, :, -1] = float("nan")  # the last scratch row: written by no bucket below 128 rows
        got = runner.chain_forward(torch.tensor([4, 6]), logits_to_keep=2)
        want = eager.chain_forward(torch.tensor([4, 6]), logits_to_keep=2)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        slot.kv.buffer[:, :, cap - 1] = float("nan")  # a row the pass reads (masked): NaN reaches the logits
        assert runner.chain_forward(torch.tensor([8]), logits_to_keep=1).isnan().any()


@pytest.mark.parametrize("attention", ["sdpa", "matmul"])
def test_an_eagle_heads_replays_give_its_eager_logits(monkeypatch, attention) -> None:
    """The EAGLE head's captured path on a CPU (its features an extra input), with the stand-in graph of
    tests/helpers/graphs.py."""
    from adaptive_spec.engine.eagle import EagleConfig, EagleHead, EagleRunner

    monkeypatch.setenv("ADAPTIVE_SPEC_ATTENTION", attention)
    monkeypatch.setattr(ModelSlot, "_record", record_ops)
    monkeypatch.setattr(ModelSlot, "_time", lambda self, g: float(g.rows.numel()))
    target = tiny_model("llama", vocab=48, eos=None)
    head = EagleHead(EagleConfig.for_target(target.config, draft_vocab_size=40)).eval()
    head.set_vocabulary(torch.arange(40))
    head.bind(target)
    slot = ModelSlot(head, 64)
    slot.graphs_on = True
    runners = EagleRunner(head, slot=slot), EagleRunner(head, slot=ModelSlot(head, 64))
    feats = torch.randn(6, 32, generator=torch.Generator().manual_seed(0))
    # rows over the step's block: the lone row, then three new ones (a child of it, its child, a second child)
    anc = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 0], [1, 0, 0, 1]], dtype=torch.bool)
    out = []
    with torch.inference_mode():
        for r in runners:
            r.set_target_features(0, feats[:4])
            first = r.chain_forward(torch.tensor([0, 5, 9, 3]), logits_to_keep=2)  # bucket 4
            lone = r.block_forward(torch.tensor([4]), torch.tensor([4]), None, logits_to_keep=1)  # bucket 1, no mask
            block = r.block_forward(torch.tensor([6, 7, 8]), torch.tensor([5, 6, 5]), anc, logits_to_keep=3)
            r.commit(4, None)
            r.set_target_features(4, feats[4:6])
            again = r.chain_forward(torch.tensor([4, 6]), logits_to_keep=1)  # bucket 2
            out.append((first, lone, block, again))
    for a, b in zip(*out, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    assert set(slot.forms.values()) == {attention}
    assert {1, 2, 4} <= set(slot.captured) and slot.failed is None


@pytest.mark.parametrize("draft_kind", ["model", "eagle"])
def test_the_engines_captured_path_decodes_greedily_as_transformers_on_a_cpu(monkeypatch, draft_kind) -> None:
    """The engine's whole step through its captured forwards (the stand-in graph of tests/helpers/graphs.py, every slot
    as on CUDA): greedy tokens equal transformers' for plans whose blocks fall in buckets 1 to 32 and a tree past
    them, with a draft model or an EAGLE head (chains, EAGLE trees decided on the device with and without
    replacement), every bucket keeping the attention as matrix products and the projections fused (timed faster
    here)."""
    from adaptive_spec.engine.eagle import EagleConfig, EagleHead

    faster = {"matmul": 0.5, "sdpa+fused": 0.25, "matmul+fused": 0.75}  # matrix products and fused projections
    slots_as_on_cuda(monkeypatch, lambda self, g: g.rows.numel() - faster.get(g.graph.form, 0.0))
    target = tiny_model("llama", vocab=48, eos=None, max_positions=512)
    if draft_kind == "eagle":
        draft = EagleHead(EagleConfig.for_target(target.config, draft_vocab_size=40)).eval()
        draft.set_vocabulary(torch.arange(40))
        draft.bind(target)
        plans = ("chain:4/block", "eagle:4:8:3:2:wor/traversal", "eagle:4:12:3:2/specinfer")
    else:
        draft = perturbed(target, scale=0.3)
        plans = ("autoregressive", "chain:1/block", "chain:7/block", "chain:31/block", "wor:6x5/traversal")
    engine = SpecEngine(target, draft)
    for prompt in ([0, 5, 6], [0, 9, 3, 4, 11, 12, 13]):
        ids = torch.tensor([prompt])
        expected = target.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=24)
        for plan in plans:
            out = engine.generate(prompt, max_new_tokens=24, temperature=0, plan=plan)
            assert out.token_ids == expected[0, len(prompt) :].tolist(), plan
    for role in ("target", "draft"):
        slot = engine._idle_slots[role][0]
        assert slot.failed is None and slot.captured, role
        kept = engine.attention_forms()[role]
        assert set(kept) == set(slot.captured) and all(k["kept"] == "matmul+fused" for k in kept.values()), role
        assert all(set(k["ms"]) == {"sdpa", "matmul", "sdpa+fused", "matmul+fused"} for k in kept.values()), role


@pytest.mark.parametrize("draft_kind", ["model", "eagle"])
@pytest.mark.parametrize("how", ["in place", "replaced"])
def test_weights_changed_between_requests_decode_as_the_new_weights(monkeypatch, caplog, how, draft_kind) -> None:
    """A captured pass reads the tensors it was captured with (the stand-in graph replays with the tensors it recorded,
    as a CUDA graph does, and refuses a tensor freed since). Weights written in place (``load_state_dict``) are read
    where they are, but the fused form's stacked copies are written again (in place: the graphs read them where they
    are), and the slots serve on. Weights replaced (``assign=True``) leave every graph on the old tensors: the engine
    lends the model a new slot, captured again, and says so; an EAGLE head, which reads the target's embedding table,
    gets one too. Either way the greedy tokens are the new weights'. Unchanged weights keep their slots."""
    from adaptive_spec.engine.eagle import EagleConfig, EagleHead

    slots_as_on_cuda(monkeypatch, lambda self, g: g.rows.numel() - (0.5 if g.graph.form.endswith("+fused") else 0))
    target = tiny_model("llama", vocab=48, eos=None, max_positions=512)
    if draft_kind == "eagle":
        draft = EagleHead(EagleConfig.for_target(target.config, draft_vocab_size=40)).eval()
        draft.set_vocabulary(torch.arange(40))
        draft.bind(target)
    else:
        draft = perturbed(target, scale=0.3)
    engine = SpecEngine(target, draft)
    prompt, ids = [0, 9, 3, 4], torch.tensor([[0, 9, 3, 4]])
    first = engine.generate(prompt, max_new_tokens=16, temperature=0, plan="chain:3/block")
    engine.generate(prompt, max_new_tokens=16, temperature=0, plan="chain:3/block")
    slots = {role: list(v) for role, v in engine._idle_slots.items()}
    assert slots["target"][0].forms and all(f.endswith("+fused") for f in slots["target"][0].forms.values())
    assert engine._idle_slots == slots  # the same slots a second request: nothing in a run changes the weights
    new = perturbed(target, scale=1.0, seed=7).state_dict()
    target.load_state_dict(new, assign=how == "replaced")
    expected = target.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=16)
    assert expected[0, 4:].tolist() != first.token_ids  # the new weights decode otherwise
    with caplog.at_level(logging.INFO, logger="adaptive_spec.engine"):
        out = engine.generate(prompt, max_new_tokens=16, temperature=0, plan="chain:3/block")
    assert out.token_ids == expected[0, 4:].tolist()
    renewed = set() if how == "in place" else {"target"} | ({"draft"} if draft_kind == "eagle" else set())
    for role in ("target", "draft"):  # the head's slot is new when the table it reads was replaced
        assert (engine._idle_slots[role] == slots[role]) == (role not in renewed), role
    lines = [r.getMessage() for r in caplog.records if "weights changed" in r.getMessage()]
    assert lines == [
        f"the {role}'s weights changed since its static cache was made: making a new one (its forwards are captured "
        "again)"
        for role in ("target", "draft")
        if role in renewed
    ]


def test_a_slot_of_weights_without_version_counters_keeps_the_split_projections(monkeypatch) -> None:
    """Weights made under inference mode keep no version counter: a write in place could not be seen, so the slot never
    captures the fused form's stacked copies of them."""
    cost = {"sdpa": 4.0, "matmul": 3.0, "sdpa+fused": 1.0, "matmul+fused": 2.0}
    captured = []
    monkeypatch.setattr(
        ModelSlot, "_capture", lambda self, b, core, extra: captured.append(self.kv.attention_form) or (b, captured[-1])
    )
    monkeypatch.setattr(ModelSlot, "_time", lambda self, g: cost[g[1]])
    forms = tuple(cost)
    with torch.inference_mode():
        untracked = tiny_model("llama", vocab=48)
    for model, kept, tried in ((tiny_model("llama", vocab=48), "sdpa+fused", forms), (untracked, "matmul", forms[:2])):
        slot = ModelSlot(model, 64)
        slot.graphs_on = True  # as on CUDA; capture and timing stand in for the device's
        captured.clear()
        assert slot.graph(1, None, (), forms) == (1, kept)
        assert tuple(captured[: len(tried)]) == tried and set(slot.form_times[1]) == set(tried)


def test_a_new_draft_vocabulary_gets_a_new_slot(monkeypatch) -> None:
    """An EAGLE head's draft vocabulary lives in buffers written in place (``set_vocabulary``); a captured draft reads
    the slot's copy of it: the next request gets a new slot holding the new one."""
    from adaptive_spec.engine.eagle import EagleConfig, EagleHead

    slots_as_on_cuda(monkeypatch)
    target = tiny_model("llama", vocab=48, eos=None, max_positions=512)
    head = EagleHead(EagleConfig.for_target(target.config, draft_vocab_size=40)).eval()
    head.set_vocabulary(torch.arange(40))
    engine = SpecEngine(target, head.bind(target))
    prompt, ids = [0, 9, 3, 4], torch.tensor([[0, 9, 3, 4]])
    expected = target.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=12)
    assert (
        engine.generate(prompt, max_new_tokens=12, temperature=0, plan="chain:3/block").token_ids
        == expected[0, 4:].tolist()
    )
    old = engine._idle_slots["draft"][0]
    assert torch.equal(old._constants["token_ids"], torch.arange(40))
    head.set_vocabulary(torch.arange(8, 48))
    assert (
        engine.generate(prompt, max_new_tokens=12, temperature=0, plan="chain:3/block").token_ids
        == expected[0, 4:].tolist()
    )
    new = engine._idle_slots["draft"][0]
    assert new is not old and torch.equal(new._constants["token_ids"], torch.arange(8, 48))


def test_models_cast_between_requests_get_caches_of_their_new_dtype() -> None:
    """A slot's static cache has its model's dtype: after ``.to(torch.float64)`` the next request gets new caches
    (before, the old float32 caches met float64 queries deep inside torch's attention)."""
    target, draft = _pair()
    engine = SpecEngine(target, draft)
    first = engine.generate([0, 5, 6], max_new_tokens=8, temperature=0, plan="chain:3/block")
    target.to(torch.float64)
    draft.to(torch.float64)
    out = engine.generate([0, 5, 6], max_new_tokens=8, temperature=0, plan="chain:3/block")
    ids = torch.tensor([[0, 5, 6]])
    expected = target.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=8)
    assert out.token_ids == expected[0, 3:].tolist() and len(first.token_ids) == 8
    assert all(slot.kv.keys[0].dtype == torch.float64 for slots in engine._idle_slots.values() for slot in slots)


def test_stacked_copies_are_written_again_in_place_after_writes_in_place() -> None:
    """Qwen2's projections have biases: a write in place to a bias alone is seen too. The copies keep their storage (a
    graph reads them there); a weight replaced cannot be refreshed (a new slot)."""
    from adaptive_spec.engine.decoder import fused_weights, refresh_fused

    model = tiny_model("qwen2", vocab=48)
    layer = model.model.layers[0]
    fused = fused_weights(layer)
    storage = (fused.qkv.data_ptr(), fused.qkv_bias.data_ptr(), fused.gate_up.data_ptr())
    assert refresh_fused(model)  # nothing written: nothing to do
    attn = layer.self_attn
    with torch.no_grad():
        attn.k_proj.bias.add_(1.0)  # a bias alone
    assert refresh_fused(model) and fused_weights(layer) is fused
    torch.testing.assert_close(fused.qkv_bias, torch.cat([attn.q_proj.bias, attn.k_proj.bias, attn.v_proj.bias]))
    with torch.no_grad():
        layer.mlp.up_proj.weight.mul_(2.0)
    assert refresh_fused(model) and fused_weights(layer) is fused
    torch.testing.assert_close(fused.gate_up, torch.cat([layer.mlp.gate_proj.weight, layer.mlp.up_proj.weight]))
    assert (fused.qkv.data_ptr(), fused.qkv_bias.data_ptr(), fused.gate_up.data_ptr()) == storage
    attn.q_proj.weight = torch.nn.Parameter(attn.q_proj.weight.detach().clone())
    assert not refresh_fused(model)
