"""CLI smoke tests: ``adaptive-spec generate`` and ``adaptive-spec bench e2e`` on tiny saved models."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from adaptive_spec.cli import main
from tests.helpers.tiny import perturbed, tiny_model, tiny_tokenizer


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    target = tiny_model("llama", vocab=48, eos=1)
    tok = tiny_tokenizer(48)
    target.save_pretrained(root / "target")
    tok.save_pretrained(root / "target")
    perturbed(target, 0.3).save_pretrained(root / "draft")
    tok.save_pretrained(root / "draft")
    return root


def test_generate_command(saved, capsys) -> None:
    args = ["generate", "--target", str(saved / "target"), "--draft", str(saved / "draft"), "--prompt", "w3 w4"]
    assert main([*args, "--plan", "wor:2x2/traversal", "--max-new-tokens", "8", "--seed", "1", "--json"]) == 0
    stats = json.loads(capsys.readouterr().out)  # one JSON document, the text included
    assert stats["plan"] == "wor:2x2/traversal" and 1 <= stats["new_tokens"] <= 8
    assert isinstance(stats["text"], str) and stats["text"]
    assert main([*args, "--plan", "ar", "--temperature", "0", "--max-new-tokens", "4", "--stream"]) == 0


def test_bench_e2e_command(saved, tmp_path, capsys) -> None:
    prompts = tmp_path / "prompts.jsonl.gz"
    with gzip.open(prompts, "wt") as f:
        f.write(json.dumps({"prompt": "w3 w4 w5"}) + "\n")
        f.write(json.dumps({"turns": ["w7 w8", "w9"]}) + "\n")
    out_json = tmp_path / "bench" / "e2e.json"
    argv = ["bench", "e2e", "--target", str(saved / "target"), "--draft", str(saved / "draft")]
    argv += ["--prompts", str(prompts), "--plans", "chain:3/block,delayed:1x2x2/traversal"]
    argv += ["--max-new-tokens", "8", "--temperature", "0", "--json", str(out_json)]
    assert main(argv) == 0
    report = json.loads(out_json.read_text())
    assert list(report["runs"]) == ["0"] and report["config"]["temperatures"] == [0.0]
    run = report["runs"]["0"]
    assert [r["plan"] for r in run["results"]] == ["chain:3/block", "delayed:1x2x2/traversal"]
    for row in run["results"]:
        assert set(row) >= {"plan", "tokens_per_s", "speedup_vs_ar", "block_efficiency", "new_tokens"}
        assert row["block_efficiency"] >= 1.0
        # a step's time: the run's seconds over its steps (new tokens / block efficiency)
        steps = row["new_tokens"] / row["block_efficiency"]
        assert row["ms_per_step"] == pytest.approx(1e3 * row["seconds"] / steps)
        assert "chosen_actions" not in row and "static_plan" not in row
    assert set(run["baselines"]) == {"autoregressive", "hf_assisted", "hf_prompt_lookup", "hf_generate"}
    assert run["baselines"]["autoregressive"]["block_efficiency"] == 1.0
    assert run["baselines"]["hf_generate"]["ms_per_step"] is None
    for name in ("hf_assisted", "hf_prompt_lookup", "hf_generate"):
        assert "error" not in run["baselines"][name], run["baselines"][name]
        assert run["baselines"][name]["new_tokens"] == 16  # 2 prompts x 8 tokens
    gen = run["baselines"]["hf_generate"]["tokens_per_s"]
    assert run["results"][0]["ratio_to_hf_generate"] == pytest.approx(run["results"][0]["tokens_per_s"] / gen)
    assert "chain:3/block" in capsys.readouterr().out


def test_bench_e2e_warms_a_compiling_engine_up_with_its_longest_request() -> None:
    """A compiled cache that grows inside the timed runs compiles again: the warm-up sizes it for all of them."""
    from adaptive_spec.bench.e2e import _warm_up

    class Engine:
        compiles = False

        def __init__(self):
            self.calls = []

        def tokenizer(self, text):
            return {"input_ids": text.split()}

        def generate(self, prompt, max_new_tokens, temperature, plan):
            self.calls.append((prompt, max_new_tokens, plan))

    prompts = [(0, "a b"), (1, "a b c d e"), (2, [1, 2, 3])]
    table = {"chain:2/block": {"0": "P"}}
    plain = Engine()
    _warm_up(plain, prompts, [0.0], ["0"], table, 128)
    assert plain.calls == [("a b", 4, None), ("a b", 4, "P")]
    compiling = Engine()
    compiling.compiles = True
    _warm_up(compiling, prompts, [0.0], ["0"], table, 128)
    assert compiling.calls == [("a b c d e", 128, None), ("a b c d e", 128, "P")]


def test_bench_e2e_says_how_long_compiling_fell_inside_its_timed_runs(saved, tmp_path, monkeypatch, capsys) -> None:
    # On an H200 a static cache that grew mid-run recompiled its forwards inside the timed runs: reported.
    from adaptive_spec.engine import SpecEngine

    calls = []  # compile seconds so far: 30 after the warm-up, 75 once the timed runs recompiled

    def compile_times(self):
        calls.append(1)
        return {
            "target": {1: 20.0 if len(calls) == 1 else 50.0},
            "draft": {1: 10.0, 4: 0.0 if len(calls) == 1 else 15.0},
        }

    monkeypatch.setattr(SpecEngine, "compiles", property(lambda self: self.compile_forwards))
    monkeypatch.setattr(SpecEngine, "compile_times", compile_times)
    out_json = tmp_path / "e2e.json"
    argv = ["bench", "e2e", "--target", str(saved / "target"), "--draft", str(saved / "draft"), "--no-hf"]
    argv += ["--plans", "chain:2/block", "--max-new-tokens", "4", "--temperature", "0", "--no-progress"]
    assert main([*argv, "--compile-forwards", "--json", str(out_json)]) == 0
    report = json.loads(out_json.read_text())
    assert report["compiled_while_timed_s"] == 45.0 and report["config"]["compile_s"]["draft"] == {"1": 10.0, "4": 15.0}
    assert "45.0 s of compiling fell inside the timed runs" in capsys.readouterr().out
    assert main([*argv, "--json", str(out_json)]) == 0  # not compiling: nothing to say
    assert "compiled_while_timed_s" not in json.loads(out_json.read_text())
    assert "compiling" not in capsys.readouterr().out


@pytest.fixture(scope="module")
def selector(tmp_path_factory):
    from tests.helpers.tiny_selector import tiny_selector

    return tiny_selector(tmp_path_factory.mktemp("selector") / "selector.onnx")


def test_generate_with_the_selector(saved, selector, tmp_path, monkeypatch, capsys) -> None:
    from tests.helpers.profiles import synthetic_profile
    from tests.helpers.tiny_selector import ACTIONS, restamp

    monkeypatch.chdir(tmp_path)  # no data/profile/profile.json: latency features 0
    args = ["generate", "--target", str(saved / "target"), "--draft", str(saved / "draft"), "--prompt", "w3 w4"]
    args += ["--selector", str(selector), "--max-new-tokens", "12", "--seed", "1", "--json"]
    assert main([*args, "--temperature", "0"]) == 0
    captured = capsys.readouterr()
    stats = json.loads(captured.out[captured.out.index("{") :])
    assert stats["plan"] == "adaptive" and stats["selector"] == str(selector) and stats["latency_profile"] is None
    assert 1 <= stats["new_tokens"] <= 12
    chosen = stats["chosen_actions"]
    assert set(chosen) <= set(ACTIONS) and sum(chosen.values()) == stats["decision_latency_us"]["n"] > 0
    assert stats["decision_latency_us"]["median"] > 0
    assert "warning" not in captured.err  # the selector records no latency features

    # A selector trained with latency features and no profile anywhere: one is measured on first
    # use and cached in the user data folder; the next run reads the cache; --profile wins.
    monkeypatch.setenv("ADAPTIVE_SPEC_HOME", str(tmp_path / "home"))
    means = {"draft_ms": 1.5, "target_ms": 8.0, "target_ms_per_token": 0.3}
    latency_sel = restamp(selector, tmp_path / "lat.onnx", training={"latency_feature_mean": means})
    args[args.index(str(selector))] = str(latency_sel)
    assert main(args) == 0
    captured = capsys.readouterr()
    assert captured.err.count("measured one for this pair on this device") == 1
    cached = json.loads(captured.out[captured.out.index("{") :])["latency_profile"]
    assert cached.startswith(str(tmp_path / "home" / "profiles")) and Path(cached).is_file()
    assert main(args) == 0
    captured = capsys.readouterr()
    assert (
        "measured" not in captured.err
        and json.loads(captured.out[captured.out.index("{") :])["latency_profile"] == cached
    )
    profile = tmp_path / "profile.json"
    profile.write_text(json.dumps(synthetic_profile()))
    assert main([*args, "--profile", str(profile)]) == 0
    captured = capsys.readouterr()
    assert "warning" not in captured.err
    assert json.loads(captured.out[captured.out.index("{") :])["latency_profile"] == str(profile)


def test_generate_selector_errors(saved, selector, tmp_path) -> None:
    args = ["generate", "--target", str(saved / "target"), "--draft", str(saved / "draft"), "--prompt", "w3"]
    with pytest.raises(SystemExit, match="not both"):
        main([*args, "--selector", str(selector), "--plan", "chain:2/block"])
    with pytest.raises(SystemExit, match=r"no selector at .*selector pipeline"):
        main([*args, "--selector", str(tmp_path / "missing.onnx")])
    (tmp_path / "junk.onnx").write_bytes(b"not onnx")
    with pytest.raises(SystemExit, match="corrupt or truncated"):
        main([*args, "--selector", str(tmp_path / "junk.onnx")])
    with pytest.raises(SystemExit, match="needs --selector"):
        main([*args, "--profile", str(tmp_path / "p.json")])


@pytest.mark.parametrize("role", ["target", "draft"])
def test_a_truncated_weight_file_is_one_line(saved, tmp_path, role) -> None:
    """A truncated model.safetensors (an interrupted download or build): one line naming the file and the fix,
    from the API (ValueError) and from the CLI."""
    import shutil

    from adaptive_spec.engine import SpecEngine

    for name in ("target", "draft"):
        shutil.copytree(saved / name, tmp_path / name)
    weights = tmp_path / role / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    with pytest.raises(ValueError) as err:
        SpecEngine.from_pretrained(str(tmp_path / "target"), str(tmp_path / "draft"))
    text = str(err.value)
    assert "\n" not in text and str(weights) in text and f"the {role} model" in text
    assert "adaptive-spec zoo fetch" in text and "adaptive-spec zoo drafts" in text
    args = ["generate", "--target", str(tmp_path / "target"), "--draft", str(tmp_path / "draft"), "--prompt", "w3"]
    with pytest.raises(SystemExit) as exit_:
        main(args)
    message = str(exit_.value.code)
    assert "generate" in message.split(":")[0] and "\n" not in message
    assert str(weights) in message and "truncated or corrupt" in message


def test_hf_baselines_print_no_generation_config_deprecation() -> None:
    """The assisted and prompt-lookup baselines of ``bench e2e`` log no "Passing `generation_config` together
    with generation-related arguments is deprecated" warning; transformers' assisted generation, called
    directly, does (its own assistant call): the negative control that shows the check can fail."""
    import logging

    import torch

    from adaptive_spec.bench.e2e import _hf_generate
    from adaptive_spec.engine import SpecEngine

    class Records(logging.Handler):
        def __init__(self) -> None:
            super().__init__()
            self.messages: list[str] = []

        def emit(self, record: logging.LogRecord) -> None:
            self.messages.append(record.getMessage())

    target = tiny_model("llama", vocab=48, eos=1)
    engine = SpecEngine(target, perturbed(target, 0.3), tiny_tokenizer(48))
    hf_log = logging.getLogger("transformers")  # transformers' loggers do not propagate to the root
    records, level = Records(), hf_log.level
    hf_log.addHandler(records)
    hf_log.setLevel(logging.WARNING)  # whatever verbosity earlier tests set
    deprecated = "Passing `generation_config` together with generation-related"
    try:
        for how in ({"assistant_model": engine.draft}, {"prompt_lookup_num_tokens": 3}):
            for temperature in (0.0, 1.0):
                logging.Logger.warning_once.cache_clear()  # transformers warns once per process
                _hf_generate(engine, [0, 5, 7, 5, 7], temperature, 6, 0, **how)
        assert not [m for m in records.messages if m.startswith(deprecated)]
        logging.Logger.warning_once.cache_clear()
        ids = torch.tensor([[0, 5, 7, 5, 7]])
        target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=4, assistant_model=engine.draft)
        assert [m for m in records.messages if m.startswith(deprecated)]
    finally:
        hf_log.removeHandler(records)
        hf_log.setLevel(level)


@pytest.mark.parametrize(
    ("plan", "match"),
    [("lookup:3x8+m9/nss", r"1 <= D <= L"), ("chain:3/nowhere", "nowhere"), ("source:x", "tree shape .x.")],
)
def test_generate_refuses_a_malformed_plan_before_loading_the_models(plan, match, monkeypatch) -> None:
    from adaptive_spec.engine import SpecEngine

    def never(*_a, **_k):
        raise AssertionError("the models were loaded")

    monkeypatch.setattr(SpecEngine, "from_pretrained", never)
    with pytest.raises(SystemExit, match=f"^generate: .*{match}") as err:
        main(["generate", "--prompt", "w3", "--plan", plan])
    assert "\n" not in str(err.value.code)
