"""adaptive-spec: lossless speculative decoding with adaptive tree shapes and verifiers."""

from adaptive_spec.trees import DraftLaw, DraftTree, TreeShape, sample_tree
from adaptive_spec.verifiers import REGISTRY, VERIFIER_NAMES, VerifyResult, verify

__version__ = "0.1.0"

__all__ = [
    "REGISTRY",
    "VERIFIER_NAMES",
    "DraftLaw",
    "DraftTree",
    "TreeShape",
    "VerifyResult",
    "sample_tree",
    "verify",
]
