"""The exploring planner: reproducible random actions, epsilon-greedy around a base, propensities."""

from __future__ import annotations

from collections import Counter

import pytest

from adaptive_spec.planner import ActionSpace, ExplorePlanner, Plan, StepState

SPACE = ActionSpace(["chain:1/token", "chain:3/block", "iid:2x2/specinfer", "delayed:1x2x2/gbv", "wor:2x1/rrsw"])


def state(step: int = 0) -> StepState:
    return StepState(step=step, context_length=10 + step, generated=step, remaining=100, temperature=1.0)


def picks(planner: ExplorePlanner, n: int) -> list[str]:
    return [str(planner.choose(state(i))) for i in range(n)]


def test_uniform_is_seeded_reproducible_and_covers_the_space():
    a, b, c = ExplorePlanner(SPACE, seed=1), ExplorePlanner(SPACE, seed=1), ExplorePlanner(SPACE, seed=2)
    seq = picks(a, 500)
    assert seq == picks(b, 500)
    assert seq != picks(c, 500)
    counts = Counter(seq)
    assert set(counts) == set(SPACE.names)
    assert all(60 <= k <= 140 for k in counts.values())  # 100 expected each; 4+ sigma bounds
    assert a.last_explored and a.last_propensity == pytest.approx(1 / len(SPACE))
    a.reset()
    assert picks(a, 500) == seq


class CountingPlanner:
    needs_features = True

    def __init__(self) -> None:
        self.observed = 0

    def choose(self, state: StepState) -> str:
        return "chain:3/block" if state.step % 2 else "chain:1/token"

    def observe(self, result) -> None:
        self.observed += 1


def test_epsilon_greedy_follows_the_base_except_for_random_steps():
    base = CountingPlanner()
    planner = ExplorePlanner(SPACE, mode="epsilon", epsilon=0.25, base=base, seed=0)
    assert planner.needs_features and not planner.needs_hidden
    n_explored = 0
    for i in range(400):
        plan = planner.choose(state(i))
        exploit = Plan.parse(base.choose(state(i)))
        if planner.last_explored:
            n_explored += 1
            p = 0.25 / len(SPACE) + (0.75 if plan == exploit else 0.0)
        else:
            assert plan == exploit
            p = 0.75 + 0.25 / len(SPACE)
        assert planner.last_propensity == pytest.approx(p)
    assert 60 <= n_explored <= 140  # 100 expected
    planner.observe(object())
    assert base.observed == 1


def test_epsilon_limits_and_a_base_plan_outside_the_space():
    always = ExplorePlanner(SPACE, mode="epsilon", epsilon=0.0, base="chain:8/traversal", seed=0)
    assert {str(always.choose(state(i))) for i in range(50)} == {"chain:8/traversal"}
    assert always.last_propensity == pytest.approx(1.0)
    never = ExplorePlanner(SPACE, mode="epsilon", epsilon=1.0, base=Plan.parse("chain:8/traversal"), seed=0)
    seq = picks(never, 200)
    assert "chain:8/traversal" not in seq and set(seq) == set(SPACE.names)
    assert never.last_propensity == pytest.approx(1 / len(SPACE))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"mode": "greedy"}, "unknown explore mode"),
        ({"mode": "epsilon", "epsilon": 1.5, "base": "chain:2/token"}, "epsilon must be in"),
        ({"mode": "epsilon"}, "needs a base"),
        ({"mode": "epsilon", "base": "iid:2x2/block"}, "not lossless"),
    ],
)
def test_bad_arguments_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ExplorePlanner(SPACE, **kwargs)


def test_explore_planner_drives_the_engine_reproducibly():
    import torch

    from adaptive_spec.engine import SpecEngine
    from tests.helpers.tiny import perturbed, tiny_model

    target = tiny_model("llama", vocab=48, seed=3, eos=None)
    engine = SpecEngine(target, perturbed(target, 0.2, seed=4), device="cpu")

    class Recording(ExplorePlanner):
        def choose(self, state):
            plan = super().choose(state)
            self.chosen.append(plan.truncated(state.remaining - 1))  # what the engine runs near the budget
            return plan

    runs = []
    for _ in range(2):
        planner = Recording(SPACE, seed=7)
        planner.chosen = []
        res = engine.generate(torch.tensor([5, 6, 7]), max_new_tokens=24, plan=planner, seed=0)
        runs.append(([str(s.plan) for s in res.steps], res.token_ids))
        assert [s.plan for s in res.steps] == planner.chosen
        assert sum(s.plan in SPACE for s in res.steps) >= len(res.steps) - 2
    assert runs[0] == runs[1]
    assert len(set(runs[0][0])) >= 3
