"""adaptive-spec: lossless speculative decoding with adaptive tree shapes and verifiers."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

__version__ = "0.1.0"

if TYPE_CHECKING:
    from adaptive_spec.trees import DraftLaw, DraftTree, TreeShape, sample_tree
    from adaptive_spec.verifiers import REGISTRY, VERIFIER_NAMES, VerifyResult, verify

# Every name is imported on first use, so that ``import adaptive_spec`` (and ``adaptive-spec
# --help``, which imports ``adaptive_spec.cli``) loads neither torch nor transformers.
_FROM_TREES = ("DraftLaw", "DraftTree", "TreeShape", "sample_tree")
_FROM_VERIFIERS = ("REGISTRY", "VERIFIER_NAMES", "VerifyResult", "verify")


def __getattr__(name: str):
    if name in _FROM_TREES:
        return getattr(importlib.import_module("adaptive_spec.trees"), name)
    if name in _FROM_VERIFIERS:
        return getattr(importlib.import_module("adaptive_spec.verifiers"), name)
    if name in ("SpecEngine", "GenerationResult"):
        from adaptive_spec import engine

        return getattr(engine, name)
    if name in ("Plan", "DraftPolicy", "parse_policy"):
        from adaptive_spec.planner import plan as _plan
        from adaptive_spec.trees import policy as _policy

        return getattr(_plan, name, None) or getattr(_policy, name)
    if name == "custom_generate_dir":
        from adaptive_spec.hf import custom_generate_dir

        return custom_generate_dir
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "REGISTRY",
    "VERIFIER_NAMES",
    "DraftLaw",
    "DraftPolicy",
    "DraftTree",
    "GenerationResult",
    "Plan",
    "SpecEngine",
    "TreeShape",
    "VerifyResult",
    "custom_generate_dir",
    "parse_policy",
    "sample_tree",
    "verify",
]
