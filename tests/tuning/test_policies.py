"""`adaptive-spec tune policies`: the in-draft planner chosen on measured speedup, grid and Optuna."""

from __future__ import annotations

import json

import pytest
import yaml

import adaptive_spec.files as files
from adaptive_spec.cli import main
from adaptive_spec.planner import Plan
from adaptive_spec.planner.presets import load_in_draft
from adaptive_spec.tuning.policies import choose
from tests.helpers.tiny import save_tiny_pair


@pytest.fixture
def tiny_pair(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    root = save_tiny_pair(tmp_path / "pair", eos=1)
    monkeypatch.setattr(files, "default_pair_path", lambda: root)
    (tmp_path / "tune.txt").write_text("w5 w6 w7\nw9 w3\n")
    return root


def test_grid_writes_the_best_policy_per_temperature(tiny_pair, tmp_path):
    rc = main(
        [
            "tune",
            "policies",
            "--prompts",
            "tune.txt",
            "--temperatures",
            "0,1",
            "--max-new-tokens",
            "8",
            "--grid",
            "conf-chain:4:0.2/block,cum-chain:4:0.1/block",
            "--static",
            "chain:2/block",
            "--json",
            "out.json",
            "--no-progress",
        ]
    )
    assert rc == 0
    data = yaml.safe_load((tmp_path / "configs/plans/in-draft.yaml").read_text())
    assert set(data["plans"]) == {"0", "1"}
    report = json.loads((tmp_path / "out.json").read_text())
    for k, entry in data["plans"].items():
        rows = report["runs"][k]["results"]
        dyn = [r for r in rows if Plan.parse(r["plan"]).dynamic]
        assert entry["plan"] == max(dyn, key=lambda r: r["speedup_vs_ar"])["plan"]  # the measured best
        assert entry["best_static_in_run"]["plan"] == "chain:2/block"
    assert Plan.parse(data["plans"]["1"]["plan"]) == load_in_draft(1.0, tmp_path / "configs/plans/in-draft.yaml")
    assert load_in_draft(0.7, tmp_path / "configs/plans/in-draft.yaml").dynamic  # nearest sampling temperature


def test_optuna_search_runs_trials_and_resumes(tiny_pair, tmp_path):
    args = [
        "tune",
        "policies",
        "--prompts",
        "tune.txt",
        "--temperatures",
        "1",
        "--max-new-tokens",
        "6",
        "--optuna",
        "3",
        "--storage",
        f"sqlite:///{tmp_path}/o.db",
        "--no-progress",
    ]
    assert main(args) == 0
    import optuna

    study = optuna.load_study(study_name="policies-T1", storage=f"sqlite:///{tmp_path}/o.db")
    assert len(study.trials) == 3 and all(t.user_attrs["plan"] for t in study.trials)
    assert study.trials[0].user_attrs["plan"].startswith("conf-chain:12:0.3")  # the enqueued known-good plan
    assert main(args) == 0  # resumes the same study
    assert len(optuna.load_study(study_name="policies-T1", storage=f"sqlite:///{tmp_path}/o.db").trials) == 6


def test_choose_ignores_static_rows():
    rows = [
        {"plan": "chain:4/block", "speedup_vs_ar": 3.0, "block_efficiency": 4.0},
        {"plan": "conf-chain:8:0.3/block", "speedup_vs_ar": 2.0, "block_efficiency": 3.0},
    ]
    runs = {"0": {"results": rows}}
    out = choose(runs)
    assert out["0"]["plan"] == "conf-chain:8:0.3/block" and out["0"]["best_static_in_run"]["speedup_vs_ar"] == 3.0


def test_missing_file_says_how_to_make_one(tmp_path):
    with pytest.raises(FileNotFoundError, match="adaptive-spec tune policies"):
        load_in_draft(0.0, tmp_path / "nope.yaml")
