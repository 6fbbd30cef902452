"""Deprecated location: plans and planners live in :mod:`adaptive_spec.planner.plan`."""

from adaptive_spec.planner.plan import *  # noqa: F403
from adaptive_spec.planner.plan import __all__  # noqa: F401
