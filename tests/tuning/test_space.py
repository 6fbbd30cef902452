"""The plan search space: params <-> plan both ways, every sampled plan lossless, the selector space."""

from __future__ import annotations

import optuna
import pytest

from adaptive_spec.planner.plan import Plan
from adaptive_spec.trees import DraftLaw
from adaptive_spec.tuning import space
from adaptive_spec.verifiers import check_compatible

optuna.logging.set_verbosity(optuna.logging.WARNING)


def _assert_lossless(plan: Plan, temperature: float) -> None:
    if temperature == 0:
        assert plan.verifier == space.GREEDY
    else:
        assert plan.verifier != space.GREEDY
        check_compatible(plan.verifier, plan.shape.law)  # raises for a lossy pairing
    assert plan.shape.max_nodes <= space.MAX_NODES


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_every_plan_of_the_space_round_trips(temperature):
    plans = list(space.iter_plans(temperature))
    assert len({str(p) for p in plans}) == len(plans)
    for plan in plans:
        _assert_lossless(plan, temperature)
        params = space.plan_to_params(plan, temperature)
        assert space.params_to_plan(params, temperature) == plan
        assert Plan.parse(str(plan)) == plan
    laws = {p.shape.law for p in plans}
    assert laws == {
        law for law in DraftLaw if not law.dynamic and law is not DraftLaw.DETERMINISTIC
    }  # the static plan space
    # At temperature 0 the verifier is not searched: one plan per shape.
    if temperature == 0:
        assert len({p.shape for p in plans}) == len(plans)


@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_sampled_plans_are_lossless_and_rebuild_from_their_params(temperature):
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=3), direction="maximize")
    seen, over = set(), 0
    for _ in range(300):
        trial = study.ask()
        try:
            plan = space.suggest_plan(trial, temperature)
        except space.OverBudgetError:
            over += 1
            study.tell(trial, state=optuna.trial.TrialState.PRUNED)
            continue
        _assert_lossless(plan, temperature)
        assert space.params_to_plan(trial.params, temperature) == plan
        assert space.params_to_plan(space.plan_to_params(plan, temperature), temperature) == plan
        seen.add(plan.shape.law)
        study.tell(trial, 1.0)
    assert seen == {law for law in DraftLaw if not law.dynamic and law is not DraftLaw.DETERMINISTIC}
    assert 0 < over < 100  # wide without-replacement trees exceed the node budget, the rest do not


def test_known_good_plans_are_in_the_space_and_collapse_at_temperature_zero():
    sampling = space.known_good_params(1.0)
    assert [str(space.params_to_plan(p, 1.0)) for p in sampling] == list(space.KNOWN_GOOD_PLANS)
    greedy = space.known_good_params(0.0)
    assert all("chain_verifier" not in p and "tree_verifier" not in p for p in greedy)
    assert str(space.params_to_plan(greedy[0], 0.0)) == "chain:4/greedy"
    assert len(greedy) == len({str(space.params_to_plan(p, 0.0)) for p in greedy})


def test_chains_verified_by_tree_verifiers_map_to_delayed_without_branch():
    params = space.plan_to_params("chain:3/gbv", 1.0)
    assert params == {
        "family": "delayed",
        "delayed_trunk": 3,
        "delayed_paths": 2,
        "delayed_branch": 0,
        "tree_verifier": "gbv",
    }
    assert str(space.params_to_plan(params, 1.0)) == "chain:3/gbv"


@pytest.mark.parametrize(
    ("plan", "temperature", "message"),
    [
        ("chain:9/block", 1.0, "chain_len=9 is outside"),
        ("iid:5x2/traversal", 1.0, "iid_paths=5"),
        ("wor:1x3/traversal", 1.0, "branching levels"),
        ("wor:4x3x3x1x1/rrsw", 1.0, "node"),
        ("chain:4/greedy", 1.0, "temperature 0 only"),
        ("wor:2x2/nss", 1.0, "wor_verifier='nss'"),
        ("chain:4/hsd", 1.0, "not lossless"),
    ],
)
def test_plans_outside_the_space_are_refused_with_the_reason(plan, temperature, message):
    with pytest.raises(ValueError, match=message):
        space.plan_to_params(plan, temperature)
    assert not space.plan_in_space(plan, temperature)


def test_bad_parameters_name_the_problem():
    with pytest.raises(ValueError, match="'family' must be one of"):
        space.params_to_plan({"family": "beam"}, 1.0)
    with pytest.raises(ValueError, match="missing 'chain_verifier'"):
        space.params_to_plan({"family": "chain", "chain_len": 2}, 1.0)
    with pytest.raises(ValueError, match="temperature must be >= 0"):
        space.params_to_plan({"family": "chain", "chain_len": 2}, -1.0)


def test_selector_space_gives_selector_module_arguments_within_bounds():
    import inspect

    from adaptive_spec.selector.lit import SelectorModule

    accepted = set(inspect.signature(SelectorModule).parameters)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    for _ in range(30):
        trial = study.ask()
        hp = space.suggest_selector_hparams(trial)
        assert set(hp) <= accepted
        assert set(hp) == {"hidden_sizes", "dropout", "lr", "weight_decay", "ce_weight", "tail_weight"}
        assert len(hp["hidden_sizes"]) == trial.params["depth"] and set(hp["hidden_sizes"]) == {trial.params["width"]}
        assert 0.0 <= hp["dropout"] <= 0.3 and 1e-4 <= hp["lr"] <= 3e-2 and 0.05 <= hp["ce_weight"] <= 2.0
        assert space.selector_kwargs(trial.params) == hp
        study.tell(trial, 0.0)
