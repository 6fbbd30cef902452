"""Planning: what each speculative step drafts and how it verifies it.

:mod:`adaptive_spec.planner.plan` holds the :class:`Plan` (tree shape + verifier), the planner
protocol and the step records the engine passes to planners. The planner depends on trees and
verifiers only; the engine depends on the planner.
"""

from adaptive_spec.planner.plan import (
    DEFAULT_VERIFIER,
    Plan,
    Planner,
    StaticPlanner,
    StepResult,
    StepState,
    as_plan,
    truncate_shape,
)

__all__ = [
    "DEFAULT_VERIFIER",
    "Plan",
    "Planner",
    "StaticPlanner",
    "StepResult",
    "StepState",
    "as_plan",
    "truncate_shape",
]
