"""Exploring planners: random actions for data collection.

:class:`ExplorePlanner` picks, before each step, either a uniformly random action of an
:class:`~adaptive_spec.planner.actions.ActionSpace` (``mode="uniform"``) or, epsilon-greedily,
a random action with probability ``epsilon`` and the base planner's choice otherwise
(``mode="epsilon"``). It records the probability with which it chose each action
(``last_propensity``), which off-policy estimates need. Randomness comes from its own seeded
``random.Random``, so a run is reproducible and never disturbs the engine's generator.
"""

from __future__ import annotations

import random
from typing import Any

from adaptive_spec.planner.actions import ActionSpace
from adaptive_spec.planner.plan import Plan, Planner, StepResult, StepState, as_plan, as_planner

__all__ = ["EXPLORE_MODES", "ExplorePlanner"]

EXPLORE_MODES = ("uniform", "epsilon")


class ExplorePlanner(Planner):
    """A planner that explores an action space at random.

    Args:
        space: the actions to explore.
        mode: ``"uniform"`` (every step a uniformly random action) or ``"epsilon"``
            (epsilon-greedy around ``base``).
        epsilon: probability of a uniformly random action in ``"epsilon"`` mode (0..1).
        base: the exploited choice in ``"epsilon"`` mode: a :class:`Plan`, a plan string, or a
            planner with ``choose(state)`` (its ``observe`` and ``needs_features``/``needs_hidden``
            are passed through). Required in ``"epsilon"`` mode, ignored in ``"uniform"`` mode.
        seed: seed of the planner's own random generator.

    Attributes:
        last_explored: whether the latest choice was a random action.
        last_propensity: probability with which the latest action was chosen
            (``1 / len(space)`` when uniform; ``epsilon / len(space)`` plus ``1 - epsilon`` for
            the base planner's choice).

    Raises:
        ValueError: unknown mode, epsilon outside [0, 1], or no base in ``"epsilon"`` mode.
    """

    def __init__(
        self,
        space: ActionSpace,
        mode: str = "uniform",
        epsilon: float = 0.2,
        base: Plan | str | Any = None,
        seed: int = 0,
    ) -> None:
        if mode not in EXPLORE_MODES:
            raise ValueError(f"unknown explore mode {mode!r}; use one of {', '.join(EXPLORE_MODES)}")
        if not 0.0 <= float(epsilon) <= 1.0:
            raise ValueError(f"epsilon must be in [0, 1], got {epsilon!r}")
        if not isinstance(space, ActionSpace):
            raise ValueError(f"space must be an ActionSpace, got {type(space).__name__}")
        self.space = space
        self.mode = mode
        self.epsilon = float(epsilon)
        self.seed = seed
        self.base: Any = None
        if mode == "epsilon":
            if base is None:
                raise ValueError("mode='epsilon' needs a base plan or planner to exploit")
            self.base = as_planner(base)
            if self.base is None:
                raise ValueError("mode='epsilon' needs a speculative base plan or planner, not autoregressive decoding")
        self.needs_features = self.base is not None and self.base.needs_features
        self.needs_hidden = self.base is not None and self.base.needs_hidden
        self._rng = random.Random(seed)
        self.last_explored = False
        self.last_propensity = 1.0

    def reset(self, seed: int | None = None) -> None:
        """Restart the random sequence (from ``seed``, else from the constructor's seed)."""
        self._rng = random.Random(self.seed if seed is None else seed)

    def choose(self, state: StepState) -> Plan:
        """A random action, or (epsilon mode, with probability ``1 - epsilon``) the base planner's."""
        n = len(self.space)
        if self.mode == "uniform":
            self.last_explored, self.last_propensity = True, 1.0 / n
            return self.space[self._rng.randrange(n)]
        # Draw both numbers every step so that the sequence does not depend on the base planner.
        explore = self._rng.random() < self.epsilon
        pick = self._rng.randrange(n)
        exploit = as_plan(self.base.choose(state))
        chosen = self.space[pick] if explore else exploit
        p_random = self.epsilon / n if chosen in self.space else 0.0
        self.last_explored = explore
        self.last_propensity = p_random + (1.0 - self.epsilon) * (chosen == exploit)
        return chosen

    def observe(self, result: StepResult) -> None:
        """Pass the step's result on to the base planner."""
        if self.base is not None:
            self.base.observe(result)

    def __repr__(self) -> str:
        base = f", epsilon={self.epsilon}, base={self.base!r}" if self.mode == "epsilon" else ""
        return f"ExplorePlanner({self.space!r}, mode={self.mode!r}{base}, seed={self.seed})"
