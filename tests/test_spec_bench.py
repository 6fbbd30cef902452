"""Spec-Bench: the shipped questions, the per-category summary, and the command end to end on the built-in pair."""

from __future__ import annotations

import gzip
import hashlib
import json
import math

import pytest

from adaptive_spec.bench import spec_bench
from adaptive_spec.cli import main


def test_shipped_questions_are_spec_bench_unchanged():
    raw = gzip.decompress(spec_bench.QUESTIONS.read_bytes())
    assert hashlib.sha256(raw).hexdigest() == "4b6d33e79484f9841c487ee87d1cf6aa8c6066f61d5d482ff09e5a007fafdf04"
    assert "Apache License" in (spec_bench.QUESTIONS.parent / "LICENSE-spec-bench").read_text()
    questions = spec_bench.load_questions()
    counts = {c: sum(q.category == c for q in questions) for c in spec_bench.CATEGORIES}
    assert counts == dict.fromkeys(spec_bench.CATEGORIES, 80)
    assert all(len(q.turns) == (2 if q.category == "mt_bench" else 1) for q in questions)


def test_per_category_is_evenly_spaced():
    every = spec_bench.load_questions()
    some = spec_bench.load_questions(4)
    for c in spec_bench.CATEGORIES:
        ids = [q.question_id for q in every if q.category == c]
        assert [q.question_id for q in some if q.category == c] == [ids[0], ids[20], ids[40], ids[60]]
    with gzip.open(spec_bench.QUESTIONS, "rt") as f:
        mt = {json.loads(line)["category"] for line in f} - set(spec_bench.CATEGORIES)
    assert mt == spec_bench.MT_BENCH  # MT-bench's sub-categories, all folded into mt_bench


def test_bad_question_files(tmp_path):
    with pytest.raises(ValueError, match="at least 1"):
        spec_bench.load_questions(0)
    bad = tmp_path / "q.jsonl.gz"
    bad.write_bytes(gzip.compress(b'{"question_id": 1, "category": "qa", "turns": ["x"]}\n{"category": "qa"}\n'))
    with pytest.raises(ValueError, match="line 2"):
        spec_bench.load_questions(path=bad)
    bad.write_bytes(gzip.compress(b'{"question_id": 1, "category": "poetry", "turns": ["x"]}\n'))
    with pytest.raises(ValueError, match="unknown category 'poetry'"):
        spec_bench.load_questions(path=bad)


def _report(ar, plan, hf):
    """A measure() report: (new tokens, seconds[, block efficiency]) per method."""
    return {
        "runs": {
            "0": {
                "baselines": {
                    "autoregressive": {
                        "plan": "autoregressive",
                        "new_tokens": ar[0],
                        "seconds": ar[1],
                        "block_efficiency": 1.0,
                    },
                    "hf_assisted": {
                        "plan": "hf_assisted",
                        "new_tokens": hf[0],
                        "seconds": hf[1],
                        "block_efficiency": None,
                    },
                },
                "results": [
                    {"plan": "chain:2/block", "new_tokens": plan[0], "seconds": plan[1], "block_efficiency": plan[2]}
                ],
            }
        }
    }


def test_summary_pools_tokens_and_seconds():
    summary = spec_bench.summarise(
        {
            "qa": _report((100, 4.0), (100, 2.0, 2.0), (100, 5.0)),
            "rag": _report((300, 6.0), (300, 2.0, 3.0), (300, 3.0)),
        }
    )["0"]
    chain = summary["chain:2/block"]
    assert chain["qa"]["speedup_vs_ar"] == pytest.approx(2.0)
    assert chain["rag"]["speedup_vs_ar"] == pytest.approx(3.0)
    # overall pools every prompt: 400 tokens in 4 s against 400 in 10 s, not the mean of the ratios (2.5)
    assert chain["overall"]["tokens_per_s"] == pytest.approx(100.0)
    assert chain["overall"]["speedup_vs_ar"] == pytest.approx(2.5) and chain["overall"]["new_tokens"] == 400
    assert chain["overall"]["mean_accepted_tokens"] == pytest.approx(400 / (50 + 100))
    assert summary["hf_assisted"]["overall"]["mean_accepted_tokens"] is None
    assert summary["hf_assisted"]["rag"]["speedup_vs_ar"] == pytest.approx(2.0)
    assert summary["autoregressive"]["overall"]["speedup_vs_ar"] == pytest.approx(1.0)


def test_command_on_the_built_in_pair(tmp_path, capsys):
    out = tmp_path / "sb"
    argv = [
        "bench",
        "spec-bench",
        "--per-category",
        "1",
        "--max-new-tokens",
        "6",
        "--temperatures",
        "0",
        "--plans",
        "chain:2/block,lookup:4/block",
        "--device",
        "cpu",
        "--out",
        str(out),
        "--no-progress",
    ]
    assert main(argv) == 0
    report = json.loads((out / "spec_bench.json").read_text())
    assert (out / "spec_bench.png").stat().st_size > 1000
    summary = report["summary"]["0"]
    assert set(summary) == {"autoregressive", "hf_assisted", "hf_prompt_lookup", "chain:2/block", "lookup:4/block"}
    measured = set(report["categories"])
    assert {"mt_bench", "translation", "qa", "math_reasoning"} <= measured  # short enough for a 256-token window
    assert report["categories"]["mt_bench"]["num_prompts"] == 2  # both turns of the one question
    for method, cells in summary.items():
        assert set(cells) == measured | {"overall"}
        for cell in cells.values():
            assert cell["new_tokens"] > 0 and math.isfinite(cell["tokens_per_s"]) and cell["speedup_vs_ar"] > 0
        if method.startswith(("chain", "lookup")):
            assert cells["overall"]["mean_accepted_tokens"] >= 1.0
    printed = capsys.readouterr().out
    assert "speedup over autoregressive decoding" in printed and "overall" in printed
