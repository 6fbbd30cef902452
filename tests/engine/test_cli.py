"""CLI smoke tests: ``adaptive-spec generate`` and ``adaptive-spec bench e2e`` on tiny saved models."""

from __future__ import annotations

import gzip
import json

import pytest
from _tiny import perturbed, tiny_model, tiny_tokenizer

from adaptive_spec.cli import main


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
    out = capsys.readouterr().out
    stats = json.loads(out[out.index("{") :])
    assert stats["plan"] == "wor:2x2/traversal" and 1 <= stats["new_tokens"] <= 8
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
    assert [r["plan"] for r in report["results"]] == ["chain:3/block", "delayed:1x2x2/traversal"]
    for row in report["results"]:
        assert set(row) >= {"plan", "tokens_per_s", "speedup_vs_ar", "block_efficiency", "new_tokens"}
        assert row["block_efficiency"] >= 1.0
    assert set(report["baselines"]) == {"autoregressive", "hf_assisted"}
    assert report["baselines"]["autoregressive"]["block_efficiency"] == 1.0
    assert "error" not in report["baselines"]["hf_assisted"], report["baselines"]["hf_assisted"]
    assert "chain:3/block" in capsys.readouterr().out
