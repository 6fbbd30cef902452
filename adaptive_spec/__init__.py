"""adaptive-spec: lossless speculative decoding with adaptive tree shapes and verifiers."""

from adaptive_spec.trees import DraftLaw, DraftTree, TreeShape, sample_tree
from adaptive_spec.verifiers import REGISTRY, VERIFIER_NAMES, VerifyResult, verify

__version__ = "0.1.0"


def __getattr__(name: str):  # lazy, so that ``import adaptive_spec`` does not load transformers
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
