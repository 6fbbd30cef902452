"""Lossless verifiers for draft trees, one module per algorithm, and one registry.

``verify(name, tree, target_probs, generator)`` is the entry point; ``REGISTRY`` records
which drafting laws each verifier is lossless for; ``lp_limit`` gives the best block
efficiency any lossless verifier can reach for a drafting law (small vocabularies).
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
    "lp_limit",
    "verify",
]


def __getattr__(name: str):
    # scipy is imported only when the LP is used.
    if name == "lp_limit":
        from adaptive_spec.verifiers.lp import lp_limit

        return lp_limit
    raise AttributeError(name)
