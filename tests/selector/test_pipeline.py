"""`adaptive-spec selector pipeline` end to end on a tiny pair: collect -> label -> train -> export -> bench."""

from __future__ import annotations

import json

import pytest

from adaptive_spec.cli import main
from adaptive_spec.formats.features import SCHEMA
from adaptive_spec.formats.label_table import read_labels
from adaptive_spec.selector.export import run_report_path
from adaptive_spec.selector.runtime import SelectorRuntime
from tests.helpers.profiles import synthetic_profile


@pytest.mark.slow
def test_pipeline_runs_end_to_end(tiny_pair, tmp_path, monkeypatch):
    monkeypatch.setenv("ADAPTIVE_SPEC_HOME", str(tmp_path / "home"))
    prompts = tmp_path / "train.txt"
    prompts.write_text("\n".join(["w5 w6 w7", "w9 w3", "w10 w11 w2", "w12 w4", "w8 w13 w14", "w15 w16"]))
    greedy = tmp_path / "greedy.txt"
    greedy.write_text("\n".join(["w7 w8 w9", "w3 w4", "w13 w2 w5"]))
    profile = tmp_path / "profile.json"
    profile.write_text(json.dumps(synthetic_profile()))
    out = tmp_path / "sel"
    code = main(
        [
            "selector",
            "pipeline",
            "--out",
            str(out),
            "--prompts",
            str(prompts),
            "--temperatures",
            "0,1",
            "--max-new-tokens",
            "8",
            "--every",
            "1",
            "--samples",
            "1",
            "--epochs",
            "2",
            "--profile",
            str(profile),
            "--bench-plans",
            "adaptive,best-static,chain:2/block",
            "--bench-tokens",
            "6",
            "--greedy-prompts-file",
            str(greedy),
            "--greedy-every",
            "1",
            "--train-seeds",
            "0,1",
            "--install",
        ]
    )
    assert code == 0
    labels = read_labels(out / "log" / "labels.parquet")
    assert len(labels) >= 6 and len(labels.actions) == 309 and (labels.block_efficiency >= 1).all()
    greedy_labels = read_labels(out / "log_t0" / "labels.parquet")
    assert len(greedy_labels) >= 3 and set(greedy_labels.features[:, SCHEMA.names.index("temperature")]) == {0.0}
    # Two seeds trained; the kept one (best validation) trained on both label sets, and its report
    # says what it plays at each temperature.
    assert len(list((out / "runs").glob("version_*"))) == 2
    runtime = SelectorRuntime(out / "selector.onnx")
    report = json.loads(run_report_path(runtime.training["checkpoint"]).read_text())
    others = [json.loads(p.read_text()) for p in (out / "runs").glob("version_*/report/report.json")]
    assert report["scores"]["adaptive"]["agg_rel_tps"] == max(r["scores"]["adaptive"]["agg_rel_tps"] for r in others)
    assert report["split"]["train_rows"] + report["split"]["val_rows"] == len(labels) + len(greedy_labels)
    assert set(report["groups"]) == {"T=0,top_p=1", "T=1,top_p=1"}
    # the best static plan at T=0 is the report's (chosen on the training labels), one of the labelled actions
    assert str(runtime.best_static(0.0)) == report["best_static"]["T=0,top_p=1"] in labels.actions
    assert runtime.static_group_names == report["static_groups"]
    # the acceptance model of learned-chain plans, from the same command
    from adaptive_spec.planner.acceptance import AcceptanceModel

    acceptance = AcceptanceModel(out / "acceptance" / "acceptance.onnx")
    assert acceptance.training["rows_train"] > 0
    assert (out / "acceptance" / "report" / "calibration.json").is_file()
    # --install: both models into the user data folder, nothing into the package's pair folder
    # The selector carries the latency profile its labels were made with, installed copy included.
    assert (out / "selector.profile.json").read_bytes() == profile.read_bytes()
    assert (tmp_path / "home" / "default" / "selector.profile.json").read_bytes() == profile.read_bytes()
    for name in ("selector.onnx", "acceptance.onnx"):
        assert (tmp_path / "home" / "default" / name).is_file(), name
        assert not (tiny_pair / name).exists(), name
    bench = json.loads((out / "bench_e2e.json").read_text())
    assert set(bench["runs"]) == {"0", "1"}
    for run in bench["runs"].values():
        plans = [r["plan"] for r in run["results"]]
        assert "adaptive" in plans and any(p.startswith("best-static") for p in plans)


def test_the_profile_stage_writes_the_profile_file_the_pipeline_was_given(tmp_path, monkeypatch):
    """``profile --out`` is a folder; the pipeline's ``--profile`` is a file, of any name."""
    import adaptive_spec.cli.call
    from adaptive_spec.cli.selector_pipeline import _profile

    calls = []

    def fake_call(module, **options):
        calls.append((module, options["out"]))
        (options["out"] / "profile.json").write_text('{"measured": true}')
        (options["out"] / "profile.png").write_bytes(b"png")
        return 0

    monkeypatch.setattr(adaptive_spec.cli.call, "call_command", fake_call)
    (tmp_path / "data").mkdir()
    _profile(tmp_path / "data" / "profile.json")  # the default name: profile into its folder
    assert calls == [("adaptive_spec.cli.profile", tmp_path / "data")]
    mine = tmp_path / "profiles" / "mine.json"
    _profile(mine)  # another name: measured in a temporary folder beside it, then moved there
    assert json.loads(mine.read_text()) == {"measured": True} and mine.with_suffix(".png").read_bytes() == b"png"
    assert sorted(p.name for p in mine.parent.iterdir()) == ["mine.json", "mine.png"]
