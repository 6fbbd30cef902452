"""Tuning with Optuna: static plans per temperature (``tune plans``) and the selector (``tune selector``).

- :mod:`~adaptive_spec.tuning.space`: every search space (plans, selector hyper-parameters);
- :mod:`~adaptive_spec.tuning.storage`: study storage (any SQLAlchemy URL), heartbeats, seeded samplers;
- :mod:`~adaptive_spec.tuning.objectives`: measured and predicted tokens/s of a plan;
- :mod:`~adaptive_spec.tuning.plans`: the plan tuner; :mod:`~adaptive_spec.tuning.report`: reports.

The tuned plan files (``configs/plans/best-static.yaml``, ``in-draft.yaml``) are read and written by
:mod:`adaptive_spec.planner.presets`, below the engine.

Importing this package imports neither Optuna nor torch; the names below load on first use.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "PlanTuningConfig": "plans",
    "tune_plans": "plans",
    "compare_plans": "plans",
    "make_storage": "storage",
    "open_study": "storage",
    "suggest_plan": "space",
    "params_to_plan": "space",
    "plan_to_params": "space",
    "MeasuredTokensPerSecond": "objectives",
    "PredictedTokensPerSecond": "objectives",
    "PlanObjective": "objectives",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"adaptive_spec.tuning.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
