"""Planning: what each speculative step drafts and how it verifies it.

:mod:`adaptive_spec.planner.plan` holds the :class:`Plan` (tree shape + verifier), the planner
protocol and the step records the engine passes to planners;
:mod:`~adaptive_spec.planner.actions` the action space (a YAML grid of plans);
:mod:`~adaptive_spec.planner.explore` random planners for data collection;
:mod:`~adaptive_spec.planner.latency` the latency model that predicts a step's time from a
profile (``adaptive-spec profile``); :mod:`~adaptive_spec.planner.presets` the default plans and
the tuned plan files (``configs/plans/best-static.yaml``, ``in-draft.yaml``);
:mod:`~adaptive_spec.planner.sources` the per-step choice of the draft source by rule, and
:mod:`~adaptive_spec.planner.gate` the learned one. The planner depends
on trees, verifiers and the bottom helpers (:mod:`adaptive_spec.files`,
:mod:`adaptive_spec.temperatures`) only; the engine depends on the planner.
"""

from adaptive_spec.planner.actions import (
    DEFAULT_ACTIONS_PATH,
    ActionSpace,
    PlanStructure,
    draft_level_sizes,
    parse_plans,
    plan_structure,
)
from adaptive_spec.planner.explore import ExplorePlanner
from adaptive_spec.planner.latency import LatencyModel, StepTimePrediction, default_profile_path
from adaptive_spec.planner.plan import (
    DEFAULT_VERIFIER,
    Plan,
    Planner,
    StaticPlanner,
    StepResult,
    StepState,
    as_plan,
    as_planner,
    truncate_shape,
)

__all__ = [
    "DEFAULT_ACTIONS_PATH",
    "DEFAULT_VERIFIER",
    "ActionSpace",
    "ExplorePlanner",
    "LatencyModel",
    "Plan",
    "PlanStructure",
    "Planner",
    "StaticPlanner",
    "StepResult",
    "StepState",
    "StepTimePrediction",
    "as_plan",
    "as_planner",
    "default_profile_path",
    "draft_level_sizes",
    "parse_plans",
    "plan_structure",
    "truncate_shape",
]
