"""``adaptive-spec tune selector``: a tiny study with the real Lightning module, pruning on val/agg_rel_tps."""

from __future__ import annotations

import json

import optuna
import pytest
import yaml

from adaptive_spec.cli import main
from adaptive_spec.formats.label_table import write_labels
from adaptive_spec.tuning.space import SELECTOR_KNOWN_GOOD
from adaptive_spec.tuning.storage import open_study
from tests.helpers.synthetic_labels import synthetic_labels


@pytest.mark.slow
def test_tune_selector_prunes_on_the_validation_metric_and_writes_the_best_config(tmp_path):
    labels = tmp_path / "labels"
    write_labels(synthetic_labels(num_prompts=12, steps=8, seed=1), labels / "labels.parquet")
    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    argv = [
        "tune",
        "selector",
        "--labels",
        str(labels),
        "--storage",
        url,
        "--study",
        "sel",
        "--max-epochs",
        "4",
        "--batch-size",
        "32",
        "--accelerator",
        "cpu",
        "--pruner-startup-trials",
        "1",
        "--pruner-warmup-epochs",
        "0",
        "--report",
        str(tmp_path / "report"),
        "--no-progress",
    ]
    assert main([*argv, "--n-trials", "1"]) == 0  # the enqueued defaults, trained to the end
    # A hopeless learning rate next: it falls below the first trial's curve and is pruned.
    study = open_study("sel", url)
    study.enqueue_trial({**SELECTOR_KNOWN_GOOD, "lr": 1e-4, "width": 32, "depth": 1, "ce_weight": 0.05})
    assert main([*argv, "--n-trials", "2"]) == 0

    trials = optuna.load_study(study_name="sel", storage=url).trials
    assert len(trials) == 3
    first, slow, sampled = trials
    assert first.state == optuna.trial.TrialState.COMPLETE and first.user_attrs["enqueued"]
    assert sorted(first.intermediate_values) == [0, 1, 2, 3]  # one report per epoch
    assert first.value == pytest.approx(max(first.intermediate_values.values()))
    assert first.value == pytest.approx(max(first.user_attrs["curve"]))
    assert 0 < first.value <= 1.5
    assert slow.state == optuna.trial.TrialState.PRUNED and len(slow.intermediate_values) < 4
    assert sampled.state in (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)

    best = yaml.safe_load((tmp_path / "report" / "best-selector.yaml").read_text())["model"]
    assert set(best) == {"hidden_sizes", "dropout", "lr", "weight_decay", "ce_weight", "tail_weight"}
    from adaptive_spec.selector.lit import SelectorDataModule, SelectorModule

    SelectorModule(data_spec=SelectorDataModule(str(labels)).spec, **best)  # the fragment is a valid config
    summary = json.loads((tmp_path / "report" / "summary.json").read_text())
    assert summary["study"]["states"]["PRUNED"] >= 1
    for name in ("optimization_history", "intermediate_values"):
        assert (tmp_path / "report" / summary["plots"][name]).read_bytes()[:4] == b"\x89PNG"
