"""Lossless verifiers for draft trees, one module per algorithm, and one registry.

``verify(name, tree, target_probs, generator)`` is the entry point; ``REGISTRY`` records
which drafting laws each verifier is lossless for. Offline analysis (exact enumeration,
expected block efficiency, the LP limit) lives in :mod:`adaptive_spec.analysis`.
"""

from adaptive_spec.verifiers.base import VerifyResult
from adaptive_spec.verifiers.registry import (
    REGISTRY,
    VERIFIER_NAMES,
    IncompatibleTreeError,
    VerifierSpec,
    check_compatible,
    get_verifier,
    verify,
)

__all__ = [
    "REGISTRY",
    "VERIFIER_NAMES",
    "IncompatibleTreeError",
    "VerifierSpec",
    "VerifyResult",
    "check_compatible",
    "get_verifier",
    "verify",
]
