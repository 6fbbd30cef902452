"""Measured and predicted tokens/s of a plan, and the objective's trial records."""

from __future__ import annotations

import numpy as np
import optuna
import pytest

from adaptive_spec.engine import SpecEngine
from adaptive_spec.files import default_prompts
from adaptive_spec.formats.features import SCHEMA
from adaptive_spec.formats.label_table import read_labels
from adaptive_spec.planner.plan import Plan
from adaptive_spec.tuning.objectives import MeasuredTokensPerSecond, PlanObjective, PredictedTokensPerSecond

optuna.logging.set_verbosity(optuna.logging.WARNING)


def test_predicted_is_the_mean_over_the_contexts_at_the_temperature(labels_dir):
    table = read_labels(labels_dir)
    pred = PredictedTokensPerSecond(table, 1.0)
    j = table.actions.index("delayed:2x3x3/traversal")
    t_col = SCHEMA.names.index("temperature")
    rows = table.features[:, t_col] == 1.0
    got = pred(Plan.parse("delayed:2x3x3/traversal"))
    assert got["tokens_per_s"] == pytest.approx(float(np.mean(table.tokens_per_s[rows, j])), rel=1e-6)
    assert got["contexts"] == rows.sum() == 6
    # At temperature 0 a greedy plan reads the table's greedy column for its shape.
    greedy = PredictedTokensPerSecond(table, 0.0)(Plan.parse("chain:4/greedy"))
    j0 = table.actions.index("chain:4/greedy")
    assert greedy["tokens_per_s"] == pytest.approx(float(np.mean(table.tokens_per_s[~rows, j0])), rel=1e-6)
    with pytest.raises(ValueError, match=r"no contexts at temperature 0.5 \(temperatures in it: 0, 1\)"):
        PredictedTokensPerSecond(table, 0.5)


def test_an_action_missing_from_the_table_prunes_the_trial_with_a_reason(labels_dir):
    table = read_labels(labels_dir).subset(np.arange(12))
    keep = [i for i, a in enumerate(table.actions) if a.startswith("chain:")]
    table.actions = [table.actions[i] for i in keep]
    table.block_efficiency, table.step_time_s = table.block_efficiency[:, keep], table.step_time_s[:, keep]
    objective = PlanObjective(PredictedTokensPerSecond(table, 1.0), 1.0)
    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.RandomSampler(seed=0))
    study.enqueue_trial({"family": "iid", "iid_paths": 2, "iid_len": 3, "tree_verifier": "specinfer"})
    study.enqueue_trial({"family": "chain", "chain_len": 3, "chain_verifier": "block"})
    study.optimize(objective, n_trials=2)
    missing, present = study.trials
    assert missing.state == optuna.trial.TrialState.PRUNED
    assert missing.user_attrs["fail_reason"] == "plan iid:2x3/specinfer is not among the label table's actions"
    assert present.state == optuna.trial.TrialState.COMPLETE and present.user_attrs["plan"] == "chain:3/block"


def test_measured_is_the_median_of_repeats_on_fixed_seeds(tiny_pair):
    engine = SpecEngine.from_pretrained(device="cpu")
    prompts = default_prompts()
    measure = MeasuredTokensPerSecond(engine, prompts, temperature=1.0, max_new_tokens=8, repeats=3, seed=5)
    got = measure(Plan.parse("chain:3/block"))
    assert len(got["tokens_per_s_repeats"]) == 3
    assert got["tokens_per_s"] == sorted(got["tokens_per_s_repeats"])[1] > 0
    assert got["new_tokens"] == 8 * len(prompts)
    assert 1.0 <= got["block_efficiency"] <= 4.0
    ar = measure(None)
    assert ar["block_efficiency"] == 1.0
    # Same seeds: the same plan draws the same tokens on every call.
    a = engine.generate(prompts[0], max_new_tokens=8, temperature=1.0, plan="chain:3/block", seed=5).token_ids
    b = engine.generate(prompts[0], max_new_tokens=8, temperature=1.0, plan="chain:3/block", seed=5).token_ids
    assert a == b
    with pytest.raises(ValueError, match="repeats must be >= 1"):
        MeasuredTokensPerSecond(engine, prompts, 1.0, repeats=0)


def test_objective_records_the_plan_and_the_measurement(tiny_pair):
    engine = SpecEngine.from_pretrained(device="cpu")
    measure = MeasuredTokensPerSecond(engine, default_prompts(), temperature=0.0, max_new_tokens=6, repeats=2)
    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.TPESampler(seed=0))
    study.enqueue_trial({"family": "chain", "chain_len": 2})
    study.optimize(PlanObjective(measure, 0.0, worker=3), n_trials=1)
    trial = study.trials[0]
    assert trial.user_attrs["plan"] == "chain:2/greedy" and trial.user_attrs["worker"] == 3
    assert trial.value == pytest.approx(float(np.median(trial.user_attrs["tokens_per_s_repeats"])))
    assert trial.user_attrs["block_efficiency"] >= 1.0


def test_greedy_plans_fall_back_to_the_shapes_columns_when_the_table_has_no_greedy_one(labels_dir):
    table = read_labels(labels_dir)
    keep = [i for i, a in enumerate(table.actions) if not a.endswith("/greedy")]
    table.actions = [table.actions[i] for i in keep]
    table.block_efficiency, table.step_time_s = table.block_efficiency[:, keep], table.step_time_s[:, keep]
    rows = table.features[:, SCHEMA.names.index("temperature")] == 0.0
    cols = [j for j, a in enumerate(table.actions) if a.startswith("chain:4/")]
    assert len(cols) == 8  # token, block, traversal + the tree verifiers on a chain
    got = PredictedTokensPerSecond(table, 0.0)(Plan.parse("chain:4/greedy"))
    assert got["tokens_per_s"] == pytest.approx(float(np.mean(table.tokens_per_s[rows][:, cols])), rel=1e-6)
