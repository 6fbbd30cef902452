"""The planner protocol: declared hooks with defaults, and what generate(plan=...) turns into a planner."""

from __future__ import annotations

import pytest

from adaptive_spec.planner import Plan, Planner, StaticPlanner, as_planner


def test_declared_hooks_have_defaults() -> None:
    class Mine(Planner):
        def choose(self, state):
            return "chain:2/block"

    p = Mine()
    assert as_planner(p) is p
    assert p.observe(None) is None and p.last_propensity is None
    assert p.needs_features_for(1.0) is False and p.needs_hidden is False
    with pytest.raises(NotImplementedError):
        Planner().choose(None)


def test_duck_planners_are_seen_through_the_declared_hooks() -> None:
    seen = []

    class Duck:
        needs_features = True
        last_propensity = 0.25

        def choose(self, state):
            return "chain:3/block"

        def observe(self, result):
            seen.append(result)

    duck = Duck()
    p = as_planner(duck)
    assert isinstance(p, Planner) and p.needs_features and p.needs_features_for(0.7)
    assert p.choose(None) == "chain:3/block" and p.last_propensity == 0.25
    p.observe("r")
    assert seen == ["r"]
    duck.last_propensity = 0.5  # read at each step, not copied
    assert p.last_propensity == 0.5


def test_plans_autoregressive_and_degenerate_plans() -> None:
    assert as_planner(None) is None and as_planner("autoregressive") is None
    s = as_planner("chain:2/block")
    assert isinstance(s, StaticPlanner) and s.choose(None) == Plan.parse("chain:2/block")
    with pytest.raises(ValueError, match="drafts no token"):
        as_planner("chain:0")
