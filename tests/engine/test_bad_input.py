"""Bad input, tried as a new user would: a clear one-line error, or correct behaviour; nothing silently wrong."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from adaptive_spec import SpecEngine
from adaptive_spec.analysis.exact import completed_tv, output_law
from adaptive_spec.analysis.instances import Instance, random_instance
from adaptive_spec.planner import Plan
from adaptive_spec.trees import TreeShape
from adaptive_spec.verifiers import REGISTRY
from tests.helpers.tiny import perturbed, tiny_model, tiny_tokenizer

V = 48


@pytest.fixture(scope="module")
def engine() -> SpecEngine:
    target = tiny_model("llama", vocab=V, eos=None)
    return SpecEngine(target, perturbed(target, scale=0.3), tokenizer=tiny_tokenizer(V))


# ----------------------------------------------------------------------------- a smaller draft vocabulary
def _draft_without(inst: Instance, missing: set[int]) -> Instance:
    def draft(c):
        row = inst.draft_fn(c).clone()
        row[list(missing)] = 0.0
        if row.sum() == 0:
            row[0] = 1.0
        return row / row.sum()

    return Instance(inst.name + f"-draft-lacks{sorted(missing)}", inst.vocab, inst.target_fn, draft)


@pytest.mark.parametrize("name", ["token", "block", "traversal", "specinfer", "rrsw", "spectr", "gbv"])
def test_a_draft_lacking_ids_stays_lossless_exactly(name):
    """The engine pads a smaller draft's row with zeros: the exact law is still the target's."""
    shape = {"token": TreeShape.chain(2), "block": TreeShape.chain(2), "rrsw": TreeShape.without_replacement((2, 1))}
    shape = shape.get(name, TreeShape.iid(2, 2))
    for seed in range(8):
        inst = _draft_without(random_instance(600 + seed, 3, zero_frac=0.0), {2})
        out = output_law(REGISTRY[name].fn, shape, inst.draft_fn, inst.target_fn)
        tv, _ = completed_tv(out, inst.target_fn, inst.vocab, shape.depth + 1)
        assert tv < 1e-9, (name, seed, tv)


def test_a_smaller_draft_vocabulary_does_not_truncate_the_target():
    target = tiny_model("llama", vocab=V, eos=None, init_range=0.05)  # flat: every id is likely
    draft = tiny_model("llama", vocab=40, eos=None, seed=5)
    eng = SpecEngine(target, draft)
    assert eng.vocab_size == V
    seen_ar, seen_spec = set(), set()
    for seed in range(6):
        seen_ar |= set(eng.generate([0, 5], max_new_tokens=20, plan="autoregressive", seed=seed).token_ids)
        out = eng.generate([0, 5], max_new_tokens=20, plan="chain:3/block", seed=seed)
        seen_spec |= set(out.token_ids)
    assert max(seen_ar) >= 40 and max(seen_spec) >= 40  # ids the draft lacks are generated (and fed back)


def test_a_draft_tokenizer_that_disagrees_is_refused():
    tok = tiny_tokenizer(V)
    other = tiny_tokenizer(V)
    other.add_tokens(["zz"])  # id V: not shared, fine
    target = tiny_model("llama", vocab=V, eos=None)
    SpecEngine(target, perturbed(target), tokenizer=tok, draft_tokenizer=other)
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = {f"x{i}": i for i in range(V)}
    raw = Tokenizer(models.WordLevel(vocab=words, unk_token="x2"))
    raw.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    clash = PreTrainedTokenizerFast(tokenizer_object=raw, unk_token="x2")
    with pytest.raises(ValueError, match="tokenizers differ"):
        SpecEngine(target, perturbed(target), tokenizer=tok, draft_tokenizer=clash)


# ----------------------------------------------------------------------------- sampling arguments
def test_tiny_temperatures_are_refused_with_a_fix(engine):
    with pytest.raises(ValueError, match=r"too small to sample from .*temperature=0"):
        engine.generate([0, 5], max_new_tokens=3, temperature=1e-39)


def test_numpy_scalars_are_accepted(engine):
    out = engine.generate(
        [0, 5],
        max_new_tokens=np.int64(4),
        temperature=np.float32(0.7),
        top_k=np.int64(10),
        top_p=np.float64(0.9),
        seed=np.int64(3),
        plan="chain:2/block",
    )
    ref = engine.generate([0, 5], max_new_tokens=4, temperature=0.7, top_k=10, top_p=0.9, seed=3, plan="chain:2/block")
    assert out.token_ids == ref.token_ids
    assert engine.generate(np.array([0, 5]).tolist(), max_new_tokens=2, temperature=0).token_ids


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"prompt": [0, 5.0]}, "token ids must be integers"),
        ({"prompt": [0, 5.7]}, "token ids must be integers"),
        ({"prompt": b"\x00\x05"}, "bytes prompt"),
        ({"prompt": torch.tensor([0.0, 5.0])}, "token ids must be integers"),
        ({"prompt": ["w5 w6", "w7"]}, "batches are not supported yet"),
        ({"prompt": [[0, 5], [0, 6]]}, "batches are not supported yet"),
        ({"prompt": torch.zeros(2, 3, dtype=torch.long)}, "batches are not supported yet"),
        ({"prompt": [0, 5], "seed": 2**64}, "seed must be below 2\\*\\*64"),
        ({"prompt": [0, 5], "seed": -1}, "seed must be an integer >= 0"),
        ({"prompt": [0, 5], "max_new_tokens": 3.0}, "max_new_tokens must be an integer"),
        ({"prompt": [0, 5], "stop": [V + 3]}, "stop token id 51 is outside the vocabulary"),
        ({"prompt": [0, 5], "stop": [2.0]}, "stop entries must be"),
    ],
)
def test_argument_types_are_checked(engine, kwargs, match):
    kwargs = {"max_new_tokens": 3, **kwargs}
    with pytest.raises(ValueError, match=match):
        engine.generate(**kwargs)


def test_a_streamer_without_put_and_end_is_refused(engine):
    with pytest.raises(TypeError, match="streamer must have put"):
        engine.generate([0, 5], max_new_tokens=2, streamer=print)


def test_autoregressive_is_an_explicit_plan(engine):
    a = engine.generate([0, 5], max_new_tokens=5, plan="autoregressive", seed=1)
    b = engine.generate([0, 5], max_new_tokens=5, plan=None, seed=1)
    assert a.token_ids == b.token_ids and not a.steps


# ----------------------------------------------------------------------------- plans
@pytest.mark.parametrize("text", ["chain:0", "iid:3x0", "delayed:0x2x0", "chain:0/block"])
def test_plans_that_draft_nothing_are_refused(engine, text):
    with pytest.raises(ValueError, match=r"drafts no token.*autoregressive"):
        engine.generate([0, 5], max_new_tokens=2, plan=text)
    Plan.parse(text)  # a planner may still choose a depth-0 step (e.g. the budget's last token)


def test_iid_zero_paths_is_refused_too():
    with pytest.raises(ValueError, match="paths must be an integer >= 1"):
        Plan.parse("iid:0x3")


def test_huge_trees_are_refused_before_allocating():
    with pytest.raises(ValueError, match=r"wor:1000x1000 has up to 1001001 nodes, more than the limit of 4096"):
        Plan.parse("wor:1000x1000")


# ----------------------------------------------------------------------------- model paths
@pytest.mark.parametrize("path", ["./no/such/model", "/nonexistent/dir", "a/b/c", "~/missing-model/"])
def test_missing_local_model_directories_fail_at_once(path):
    with pytest.raises(ValueError, match="no such directory"):
        SpecEngine.from_pretrained(path, path)


def test_a_file_is_not_a_model_directory(tmp_path):
    f = tmp_path / "model.bin"
    f.write_bytes(b"x")
    with pytest.raises(ValueError, match="is a file, not a model directory"):
        SpecEngine.from_pretrained(str(f), str(f))


# ----------------------------------------------------------------------------- prompt files
def test_prompt_files_name_the_file_and_line(tmp_path):
    from adaptive_spec.files import read_prompts

    bad = tmp_path / "p.jsonl"
    bad.write_text('{"prompt": "a"}\n\n{"prompt": "b"\n')
    with pytest.raises(ValueError, match=r"p\.jsonl:3: not valid JSON"):
        read_prompts(bad)
    bad.write_text('{"prompt": "a"}\n["b"]\n')
    with pytest.raises(ValueError, match=r"p\.jsonl:2: expected a JSON object.*got a list"):
        read_prompts(bad)
    bad.write_text('{"text": "a"}\n')
    with pytest.raises(ValueError, match=r"p\.jsonl:1: a record needs a 'prompt'"):
        read_prompts(bad)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        read_prompts(tmp_path / "missing.jsonl")
    txt = tmp_path / "p.txt"
    txt.write_text("def f():\n\n  x = 1\n")
    assert read_prompts(txt) == ["def f():", "  x = 1"]


def test_prompt_files_saved_with_a_byte_order_mark_are_read(tmp_path):
    """Editors on Windows write a UTF-8 BOM: it is not part of the first prompt, nor a JSON error."""
    from adaptive_spec.files import read_prompts

    bom = "\ufeff".encode()
    jsonl = tmp_path / "p.jsonl"
    jsonl.write_bytes(bom + '{"prompt": "héllo"}\n{"prompt": "b"}\n'.encode())
    assert read_prompts(jsonl) == ["héllo", "b"]
    txt = tmp_path / "p.txt"
    txt.write_bytes(bom + b"first\nsecond\n")
    assert read_prompts(txt) == ["first", "second"]
    gz = tmp_path / "p.jsonl.gz"
    gz.write_bytes(__import__("gzip").compress(bom + b'{"prompt": "z"}\n'))
    assert read_prompts(gz) == ["z"]


def test_bench_reports_a_missing_prompt_file_before_loading_models(tmp_path, monkeypatch):
    import adaptive_spec.cli.bench_e2e as e2e
    from adaptive_spec.cli import main

    def boom(*a, **k):
        raise AssertionError("models were loaded before the prompt file was checked")

    monkeypatch.setattr(e2e, "load_engine", boom)
    with pytest.raises(SystemExit, match="does not exist"):
        main(["bench", "e2e", "--prompts", str(tmp_path / "nope.jsonl"), "--plans", "chain:2/block"])


def test_one_prompt_never_loses_the_benchmark(engine, capsys):
    from adaptive_spec.bench.e2e import measure

    long_prompt = " ".join(["w5"] * 300)  # longer than the tiny models' 256-token window
    res = measure(engine, ["w5 w6", long_prompt, "w7 w8"], ["chain:2/block"], [0.0], 8, hf=False, progress=False)
    assert [s["prompt"] for s in res["skipped_prompts"]] == [1]
    assert "prompt 2 has 300 tokens" in capsys.readouterr().err
    assert res["runs"]["0"]["results"][0]["new_tokens"] == 16  # the two prompts that fit
    with pytest.raises(ValueError, match="exceeds the 256-token context window"):
        measure(
            engine, ["w5", long_prompt], ["chain:2/block"], [0.0], 8, hf=False, progress=False, long_prompts="error"
        )

    original = engine.generate

    def flaky(prompt, **kw):
        if prompt == "w7 w8" and kw.get("plan") is not None:
            raise RuntimeError("simulated failure")
        return original(prompt, **kw)

    engine.generate = flaky
    try:
        res = measure(engine, ["w5 w6", "w7 w8", "w9"], ["chain:2/block"], [0.0], 8, hf=False, progress=False)
    finally:
        del engine.generate
    assert res["failed_prompts"] == [{"prompt": 1, "error": "RuntimeError: simulated failure"}]
    row = res["runs"]["0"]["results"][0]
    assert row["new_tokens"] == 16 and res["runs"]["0"]["baselines"]["autoregressive"]["new_tokens"] == 16


def test_a_plan_the_engine_cannot_play_fails_the_benchmark_before_it_runs(engine):
    from adaptive_spec.bench.e2e import measure

    calls = []
    original = engine.generate
    engine.generate = lambda *a, **k: calls.append(1) or original(*a, **k)
    try:
        plans = ["chain:2/block", "lookup:2x3+2/nss"]
        with pytest.raises(ValueError, match=r"plan lookup:2x3\+2/nss drafts from a datastore and the engine has none"):
            measure(engine, ["w5 w6"], plans, [0.0], 4, hf=False, progress=False)
        with pytest.raises(ValueError, match="'greedy' is only lossless at temperature 0"):  # at T = 1 only
            measure(engine, ["w5 w6"], ["chain:2/block", "chain:2/greedy"], [0.0, 1.0], 4, hf=False, progress=False)
    finally:
        del engine.generate
    assert not calls  # nothing generated, not even the warm-up


# ----------------------------------------------------------------------------- storage, selector
def test_postgres_urls_name_the_missing_driver(monkeypatch):
    import importlib.util

    from adaptive_spec.tuning.storage import postgres_driver_url

    assert postgres_driver_url("sqlite:///x.db") == "sqlite:///x.db"
    assert postgres_driver_url("postgresql+psycopg2://u@h/db") == "postgresql+psycopg2://u@h/db"
    have = postgres_driver_url("postgresql://u@h/db")
    assert have in ("postgresql+psycopg://u@h/db", "postgresql+psycopg2://u@h/db")
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    with pytest.raises(ValueError, match=r"neither psycopg nor psycopg2 is installed.*adaptive-spec\[postgres\]"):
        postgres_driver_url("postgresql://u@h/db")


def test_a_selector_with_nonfinite_logits_is_refused_at_load(tmp_path):
    import onnx
    from onnx import numpy_helper

    from adaptive_spec.formats.features import SCHEMA
    from adaptive_spec.selector.export import export_net
    from adaptive_spec.selector.model import SelectorNet
    from adaptive_spec.selector.runtime import SelectorLoadError, SelectorRuntime

    net = SelectorNet(SCHEMA.num_scalar, 2, hidden_sizes=(8,)).eval()
    good = tmp_path / "good.onnx"
    export_net(net, good, actions=["chain:1/block", "chain:2/block"])
    SelectorRuntime(good)  # loads
    model = onnx.load(str(good))
    weights = max(model.graph.initializer, key=lambda t: int(np.prod(t.dims)))  # a weight matrix
    arr = numpy_helper.to_array(weights).copy()
    arr[...] = np.nan
    weights.CopyFrom(numpy_helper.from_array(arr, weights.name))
    bad = tmp_path / "nan.onnx"
    onnx.save(model, str(bad))
    with pytest.raises(SelectorLoadError, match="NaN or infinite logits on a probe batch"):
        SelectorRuntime(bad)


def test_json_prompt_record_with_turns(tmp_path):
    from adaptive_spec.files import read_prompts

    f = tmp_path / "chat.jsonl"
    f.write_text(json.dumps({"turns": ["hello", "again"]}) + "\n")
    assert read_prompts(f) == ["hello"]


def test_a_sliding_window_model_is_refused_in_one_line() -> None:
    """A sliding-window cache cannot be gathered row by row: the engine refuses such a model, naming the fix."""
    target = tiny_model("qwen2", vocab=48, eos=1)
    target.config.use_sliding_window = True
    target.config.sliding_window = 8
    target.config.layer_types = ["sliding_attention"] * target.config.num_hidden_layers
    with pytest.raises(ValueError) as err:
        SpecEngine(target, perturbed(target, 0.1)).generate([3, 4, 5], max_new_tokens=2)
    assert "disable sliding windows" in str(err.value) and "\n" not in str(err.value)
