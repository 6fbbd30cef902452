"""`adaptive-spec demo` and `bench e2e` without model arguments, on a tiny stand-in for the built-in pair."""

from __future__ import annotations

import json

import pytest

import adaptive_spec.zoo as zoo
from adaptive_spec.cli import main
from tests.engine._tiny import perturbed, tiny_model, tiny_tokenizer


@pytest.fixture
def tiny_pair(tmp_path, monkeypatch):
    root = tmp_path / "pair"
    tok = tiny_tokenizer(48)
    target = tiny_model("llama", vocab=48, eos=1, seed=3)
    draft = perturbed(target, scale=0.2, seed=4)
    for name, model in (("target", target), ("draft", draft)):
        model.save_pretrained(root / name)
        tok.save_pretrained(root / name)
    (root / "prompts.jsonl").write_text("\n".join(json.dumps({"prompt": p}) for p in ["w5 w6 w7", "w9 w3"]))
    (root / "build_info.json").write_text(json.dumps({"seed": 0, "note": "tiny test pair"}))
    monkeypatch.setattr(zoo, "default_pair_path", lambda: root)
    return root


def test_demo_prints_the_table_and_writes_the_report(tiny_pair, tmp_path, capsys):
    out = tmp_path / "report"
    rc = main(["demo", "--out", str(out), "--max-new-tokens", "8", "--plans", "chain:3/block,iid:2x2/traversal",
               "--no-progress"])  # fmt: skip
    assert rc == 0
    printed = capsys.readouterr().out
    assert "temperature 0" in printed and "temperature 1" in printed and "chain:3/block" in printed
    report = json.loads((out / "results.json").read_text())
    assert set(report["runs"]) == {"0", "1"}
    for run in report["runs"].values():
        assert {r["plan"] for r in run["results"]} == {"chain:3/block", "iid:2x2/traversal"}
        assert run["baselines"]["autoregressive"]["speedup_vs_ar"] == pytest.approx(1.0)
        assert all(r["block_efficiency"] >= 1.0 for r in run["results"])
    for png in ("speedup.png", "accepted_lengths.png", "block_efficiency_vs_tree_size.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert png in (out / "summary.md").read_text()


def test_bench_e2e_defaults_to_the_builtin_pair_and_prompts(tiny_pair, tmp_path):
    out = tmp_path / "e2e.json"
    rc = main(["bench", "e2e", "--plans", "chain:2/token", "--max-new-tokens", "6", "--no-hf", "--json", str(out),
               "--no-progress"])  # fmt: skip
    assert rc == 0
    report = json.loads(out.read_text())
    assert report["config"]["num_prompts"] == 2
    assert report["results"][0]["plan"] == "chain:2/token"
    assert report["results"][0]["new_tokens"] > 0


def test_bench_overhead_separates_forwards_from_engine_time(tiny_pair, tmp_path):
    out = tmp_path / "ovh.json"
    rc = main(["bench", "overhead", "--plans", "iid:3x5/specinfer", "--max-new-tokens", "12", "--limit", "2",
               "--json", str(out)])  # fmt: skip
    assert rc == 0
    row = json.loads(out.read_text())["rows"][0]
    assert row["plan"] == "iid:3x5/specinfer"
    assert 0 < row["target_forward_s"] < row["wall_s"] and 0 < row["draft_forward_s"] < row["wall_s"]
    assert 0 < row["overhead_fraction"] < 1
