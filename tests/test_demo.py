"""`adaptive-spec demo` and `bench e2e` without model arguments, on a tiny stand-in for the built-in pair."""

from __future__ import annotations

import json
import shutil

import pytest

from adaptive_spec.cli import main
from tests.helpers.tiny_selector import ACTIONS, BEST_STATIC, restamp, tiny_selector


@pytest.fixture(scope="module")
def selector(tmp_path_factory):
    return tiny_selector(tmp_path_factory.mktemp("selector") / "selector.onnx")


def test_demo_prints_the_table_and_writes_the_report(tiny_pair, tmp_path, capsys):
    out = tmp_path / "report"
    rc = main(
        [
            "demo",
            "--pair",
            "builtin",
            "--out",
            str(out),
            "--max-new-tokens",
            "8",
            "--plans",
            "chain:3/block,iid:2x2/traversal",
            "--no-progress",
        ]
    )
    assert rc == 0
    printed = capsys.readouterr().out
    assert "temperature 0" in printed and "temperature 1" in printed and "chain:3/block" in printed
    report = json.loads((out / "results.json").read_text())
    assert set(report["runs"]) == {"0", "1"}
    for run in report["runs"].values():
        assert {r["plan"] for r in run["results"]} == {"chain:3/block", "iid:2x2/traversal"}
        assert run["baselines"]["autoregressive"]["speedup_vs_ar"] == pytest.approx(1.0)
        assert all(r["block_efficiency"] >= 1.0 for r in run["results"])
    for png in ("speedup.png", "accepted_lengths.png", "block_efficiency_vs_tree_size.png", "depth_and_timeline.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert png in (out / "summary.md").read_text()
    # The timeline of the first generation: one [tree nodes, accepted] pair per step, accepted < nodes.
    for run in report["runs"].values():
        line = run["results"][0]["timeline"]
        assert line and all(0 <= a < n for n, a in line)
    # What a user sees of the text: a sample per temperature, the loop figures, the T=0 identity check.
    assert printed.count("sample completion") == 2 and "whitespace-only lines" in printed
    for name in ("chain:3/block", "iid:2x2/traversal"):
        assert f"{name}: 2/2 identical to autoregressive decoding" in printed
        assert report["text"]["0"]["identical"][name] == [2, 2]
    for t in ("0", "1"):
        q = report["text"][t]["quality"]
        assert q["tokens"] > 0 and 0 <= q["either_share"] <= 1
    assert "identical to autoregressive decoding" in (out / "summary.md").read_text()
    # No selector installed: the summary says how to build one.
    assert "No learned selector is installed" in printed
    assert "adaptive-spec selector pipeline" in (out / "summary.md").read_text()
    assert report["config"]["selector"] is None


def test_demo_adds_the_installed_selector(tiny_pair, selector, tmp_path, capsys):
    shutil.copyfile(selector, tiny_pair / "selector.onnx")  # what `make selector` installs
    out = tmp_path / "report"
    rc = main(
        [
            "demo",
            "--pair",
            "builtin",
            "--out",
            str(out),
            "--max-new-tokens",
            "8",
            "--plans",
            "chain:3/block",
            "--no-hf",
            "--no-progress",
        ]
    )
    assert rc == 0
    printed = capsys.readouterr().out
    report = json.loads((out / "results.json").read_text())
    assert report["config"]["selector"] == str(tiny_pair / "selector.onnx")
    for t, run in report["runs"].items():
        rows = {r["plan"]: r for r in run["results"]}
        assert list(rows) == ["adaptive", "best-static", "chain:3/block"]
        assert rows["best-static"]["static_plan"] == BEST_STATIC[f"T={t},top_p=1"]
        assert rows["adaptive"]["chosen_actions"]["decisions"] == sum(rows["adaptive"]["accept_histogram"].values())
    summary = (out / "summary.md").read_text()
    assert "adaptive" in printed and "`adaptive`: the learned selector" in summary and "most chosen" in summary
    assert f"best-static (`{BEST_STATIC['T=0,top_p=1']}`)" in summary
    assert "No learned selector" not in summary


def test_bench_e2e_defaults_to_the_builtin_pair_and_prompts(tiny_pair, tmp_path):
    out = tmp_path / "e2e.json"
    rc = main(
        [
            "bench",
            "e2e",
            "--plans",
            "chain:2/token",
            "--max-new-tokens",
            "6",
            "--no-hf",
            "--json",
            str(out),
            "--no-progress",
        ]
    )
    assert rc == 0
    report = json.loads(out.read_text())
    assert report["config"]["num_prompts"] == 2
    assert report["runs"]["0"]["results"][0]["plan"] == "chain:2/token"
    assert report["runs"]["0"]["results"][0]["new_tokens"] > 0


def test_bench_e2e_adaptive_and_best_static_at_two_temperatures(tiny_pair, selector, tmp_path, capsys):
    shutil.copyfile(selector, tiny_pair / "selector.onnx")  # found without --selector
    out = tmp_path / "e2e.json"
    rc = main(
        [
            "bench",
            "e2e",
            "--plans",
            "adaptive,best-static,chain:2/block",
            "--temperatures",
            "0,1",
            "--max-new-tokens",
            "10",
            "--no-hf",
            "--json",
            str(out),
            "--no-progress",
        ]
    )
    assert rc == 0
    printed = capsys.readouterr().out
    assert "temperature 0," in printed and "temperature 1," in printed and "decisions, median" in printed
    report = json.loads(out.read_text())
    assert report["config"]["temperatures"] == [0.0, 1.0]
    assert report["config"]["selector"] == str(tiny_pair / "selector.onnx")
    assert report["config"]["best_static"]["source"].startswith("selector metadata")
    assert set(report["runs"]) == {"0", "1"}
    for t, run in report["runs"].items():
        assert run["baselines"]["autoregressive"]["speedup_vs_ar"] == pytest.approx(1.0)
        rows = {r["plan"]: r for r in run["results"]}
        assert list(rows) == ["adaptive", "best-static", "chain:2/block"]
        for row in rows.values():
            assert row["tokens_per_s"] > 0 and row["speedup_vs_ar"] > 0 and row["block_efficiency"] >= 1.0
        assert rows["best-static"]["static_plan"] == BEST_STATIC[f"T={t},top_p=1"]
        adaptive = rows["adaptive"]
        chosen = adaptive["chosen_actions"]
        steps = sum(adaptive["accept_histogram"].values())  # one decision per speculative step, warm-up excluded
        assert (
            chosen["decisions"]
            == steps
            == sum(a["count"] for a in chosen["top"])
            == adaptive["decision_latency_us"]["n"]
        )
        assert 1 <= chosen["distinct"] == len(chosen["top"]) <= min(10, len(ACTIONS))
        assert {a["action"] for a in chosen["top"]} <= set(ACTIONS)
        assert sum(a["share"] for a in chosen["top"]) == pytest.approx(1.0)
        assert adaptive["decision_latency_us"]["median"] > 0


def test_bench_e2e_best_static_without_a_selector_reads_the_tuned_file(tiny_pair, tmp_path):
    from adaptive_spec.planner.presets import write_best_static

    out = tmp_path / "e2e.json"
    argv = [
        "bench",
        "e2e",
        "--plans",
        "best-static",
        "--temperatures",
        "0,1",
        "--max-new-tokens",
        "4",
        "--no-hf",
        "--limit",
        "1",
        "--json",
        str(out),
        "--no-progress",
    ]
    tuned = tmp_path / "best-static.yaml"
    argv += ["--best-static-file", str(tuned)]
    with pytest.raises(SystemExit, match=r"no selector was found.*tune plans.*make selector"):
        main(argv)
    write_best_static(0.0, {"plan": "chain:2/block"}, tuned)
    write_best_static(1.0, {"plan": "iid:2x2/traversal"}, tuned)
    assert main(argv) == 0
    report = json.loads(out.read_text())
    assert report["config"]["selector"] is None and "best-static.yaml" in report["config"]["best_static"]["source"]
    assert [r["static_plan"] for t in ("0", "1") for r in report["runs"][t]["results"]] == [
        "chain:2/block",
        "iid:2x2/traversal",
    ]


def test_bench_e2e_adaptive_errors(tiny_pair, selector, tmp_path):
    argv = ["bench", "e2e", "--plans", "adaptive", "--max-new-tokens", "4", "--no-hf", "--no-progress"]
    with pytest.raises(SystemExit, match=r"no selector found \(looked at .*selector pipeline"):
        main(argv)
    with pytest.raises(SystemExit, match="no selector at"):
        main([*argv, "--selector", str(tmp_path / "missing.onnx")])
    with pytest.raises(SystemExit, match="repeated temperature"):
        main([*argv, "--selector", str(selector), "--temperatures", "0,0.0"])
    # A selector without best static actions for this temperature kind, and no best-static.yaml.
    greedy_only = restamp(selector, tmp_path / "g.onnx", training={"best_static": {"T=0,top_p=1": "chain:3/block"}})
    with pytest.raises(SystemExit, match=r"no best static action for T=1"):
        main(["bench", "e2e", "--plans", "best-static", "--temperatures", "1", "--selector", str(greedy_only)])


def test_bench_overhead_separates_forwards_from_engine_time(tiny_pair, tmp_path):
    out = tmp_path / "ovh.json"
    rc = main(
        [
            "bench",
            "overhead",
            "--plans",
            "iid:3x5/specinfer",
            "--max-new-tokens",
            "12",
            "--limit",
            "2",
            "--json",
            str(out),
        ]
    )
    assert rc == 0
    row = json.loads(out.read_text())["rows"][0]
    assert row["plan"] == "iid:3x5/specinfer"
    assert 0 < row["target_forward_s"] < row["wall_s"] and 0 < row["draft_forward_s"] < row["wall_s"]
    assert 0 < row["overhead_fraction"] < 1
