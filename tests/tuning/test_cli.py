"""``adaptive-spec tune plans`` end to end: predicted objective with report, measured on a tiny pair."""

from __future__ import annotations

import json

import optuna
import pytest

from adaptive_spec.cli import main
from adaptive_spec.planner.presets import load_best_static, read_best_static

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
def test_predicted_study_writes_best_static_and_report_and_resumes(labels_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # default storage, configs/ and report are relative to the working directory
    argv = ["tune", "plans", "--objective", "predicted", "--labels", str(labels_dir), "--no-progress"]
    assert main([*argv, "--n-trials", "12", "--temperature", "1"]) == 0
    db = tmp_path / "data" / "tuning" / "optuna.db"
    assert db.exists()
    report = tmp_path / "data" / "tuning" / "reports" / "plans"
    summary = json.loads((report / "summary.json").read_text())
    section = summary["temperatures"]["1"]
    assert section["study"]["n_trials"] == 12 and len(section["study"]["top"]) == 10
    plots = section["plots"]
    for name in ("optimization_history", "comparison"):
        assert (report / plots[name]).read_bytes()[:8] == PNG
    drawn = [f for f in plots.values() if f.endswith(".png")]
    assert len(drawn) >= 5
    for f in drawn:
        assert (report / f).read_bytes()[:8] == PNG

    # Temperature 0 in a second run: best-static gains an entry, the T=1 one is kept.
    assert main([*argv, "--n-trials", "10", "--temperature", "0", "--no-report"]) == 0
    entries = read_best_static(tmp_path / "configs" / "plans" / "best-static.yaml")
    assert set(entries) == {"0", "1"}
    assert entries["0"]["plan"].endswith("/greedy") and not entries["1"]["plan"].endswith("/greedy")
    assert section["study"]["best"]["plan"] == entries["1"]["plan"]
    for key, entry in entries.items():
        study = optuna.load_study(study_name=f"plans-T{key}", storage=f"sqlite:///{db}")
        assert entry["plan"] == study.best_trial.user_attrs["plan"]
        assert entry["tokens_per_s"] == pytest.approx(study.best_value, rel=1e-3)
        assert entry["objective"] == "predicted" and entry["study"] == f"plans-T{key}"
        # The defaults are in the comparison, and the best is at least as good as each of them.
        assert {"chain:4/block", "delayed:2x3x3/traversal", "wor:3x2x1/traversal"} <= set(entry["comparison"])
        assert max(entry["comparison"].values()) == pytest.approx(entry["comparison"][entry["plan"]], rel=1e-6)
    assert str(load_best_static(1.0)) == entries["1"]["plan"]

    # Resume: the same study goes on from where it was.
    assert main([*argv, "--n-trials", "3", "--temperature", "1", "--no-report"]) == 0
    assert optuna.load_study(study_name="plans-T1", storage=f"sqlite:///{db}").trials[-1].number == 14
    # Another objective setting on the same study is refused, and nothing is written.
    other = tmp_path / "other"
    other.mkdir()
    (other / "labels.parquet").write_bytes((labels_dir / "labels.parquet").read_bytes())
    before = (tmp_path / "configs" / "plans" / "best-static.yaml").read_text()
    with pytest.raises(SystemExit, match=r"was run with other settings.*labels"):
        main(
            [
                "tune",
                "plans",
                "--objective",
                "predicted",
                "--labels",
                str(other),
                "--n-trials",
                "1",
                "--temperature",
                "1",
                "--no-progress",
            ]
        )
    assert (tmp_path / "configs" / "plans" / "best-static.yaml").read_text() == before


def test_bad_arguments_fail_with_a_message(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit, match="needs a label table"):
        main(["tune", "plans", "--objective", "predicted", "--no-progress"])
    with pytest.raises(SystemExit, match="no label file"):
        main(["tune", "plans", "--objective", "predicted", "--labels", str(tmp_path / "none"), "--no-progress"])
    with pytest.raises(SystemExit, match="not a SQLAlchemy URL"):
        main(["tune", "plans", "--storage", "not a url", "--objective", "predicted", "--labels", "x"])


@pytest.mark.slow
def test_measured_smoke_study_on_a_tiny_pair(tiny_pair, tmp_path):
    out = tmp_path / "run"
    argv = [
        "tune",
        "plans",
        "--storage",
        f"sqlite:///{out / 'optuna.db'}",
        "--study",
        "smoke",
        "--n-trials",
        "2",
        "--temperature",
        "0",
        "1",
        "--num-prompts",
        "2",
        "--max-new-tokens",
        "6",
        "--repeats",
        "2",
        "--config-out",
        str(out / "configs"),
        "--report",
        str(out / "report"),
        "--device",
        "cpu",
        "--no-progress",
    ]
    assert main(argv) == 0
    entries = read_best_static(out / "configs" / "plans" / "best-static.yaml")
    assert set(entries) == {"0", "1"}
    summary = json.loads((out / "report" / "summary.json").read_text())
    for key in ("0", "1"):
        study = optuna.load_study(study_name=f"smoke-T{key}", storage=f"sqlite:///{out / 'optuna.db'}")
        trials = [t for t in study.trials if t.state != optuna.trial.TrialState.WAITING]  # the rest wait
        # Two trials: the first two known-good plans, measured.
        assert [t.user_attrs["plan"].split("/")[0] for t in trials] == ["chain:4", "delayed:2x3x3"]
        for t in trials:
            assert t.state == optuna.trial.TrialState.COMPLETE
            assert len(t.user_attrs["tokens_per_s_repeats"]) == 2 and t.user_attrs["block_efficiency"] >= 1
        rows = {r["plan"]: r for r in summary["temperatures"][key]["comparison"]}
        # Finalists and defaults, measured interleaved; at T=0 a plan is its shape (greedy verification).
        verifiers = ("greedy",) * 3 if key == "0" else ("block", "traversal", "traversal")
        defaults = {f"{s}/{v}" for s, v in zip(("chain:4", "delayed:2x3x3", "wor:3x2x1"), verifiers, strict=True)}
        assert {"autoregressive", *defaults} == set(rows)
        assert rows["autoregressive"]["speedup_vs_ar"] == pytest.approx(1.0)
        assert all(r["tokens_per_s"] > 0 and len(r["tokens_per_s_repeats"]) == 2 for r in rows.values())
        fastest = max((r for r in rows.values() if r["plan"] != "autoregressive"), key=lambda r: r["tokens_per_s"])
        assert entries[key]["plan"] == fastest["plan"]
        assert entries[key]["tokens_per_s"] == pytest.approx(fastest["tokens_per_s"], rel=1e-3)
        assert entries[key]["selected_by"].startswith("interleaved re-measurement of the top 2 plans")
        assert entries[key]["settings"]["max_new_tokens"] == 6
        assert entries[key]["comparison"]["autoregressive"] > 0


def test_rank_plans_groups_repeated_plans_by_their_median():
    from adaptive_spec.tuning.plans import rank_plans

    study = optuna.create_study(direction="maximize")
    for plan, value in [
        ("chain:4/block", 10.0),
        ("iid:2x3/gbv", 30.0),
        ("chain:4/block", 50.0),
        ("chain:4/block", 40.0),
        ("wor:2x2/rrsw", 35.0),
    ]:
        trial = study.ask()
        trial.set_user_attr("plan", plan)
        trial.set_user_attr("block_efficiency", 2.0)
        study.tell(trial, value)
    ranked = rank_plans(study)
    assert [(r["plan"], r["median"], r["trials"]) for r in ranked] == [
        ("chain:4/block", 40.0, [0, 2, 3]),
        ("wor:2x2/rrsw", 35.0, [4]),
        ("iid:2x3/gbv", 30.0, [1]),
    ]
