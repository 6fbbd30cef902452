"""The verifier registry: which drafting laws each verifier is lossless for."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from adaptive_spec.rng import Sampler, as_sampler
from adaptive_spec.trees import DraftLaw, DraftTree
from adaptive_spec.verifiers.base import VerifyResult, ride_first
from adaptive_spec.verifiers.block import verify_block
from adaptive_spec.verifiers.gbv import verify_gbv
from adaptive_spec.verifiers.greedy import verify_greedy
from adaptive_spec.verifiers.hsd import verify_hsd
from adaptive_spec.verifiers.naive import verify_naive
from adaptive_spec.verifiers.nss import verify_nss
from adaptive_spec.verifiers.rrsw import verify_rrsw
from adaptive_spec.verifiers.specinfer import verify_specinfer
from adaptive_spec.verifiers.spectr import verify_spectr
from adaptive_spec.verifiers.token import verify_token
from adaptive_spec.verifiers.traversal import verify_traversal

VerifyFn = Callable[[DraftTree, torch.Tensor, Sampler], VerifyResult]

# Each set is backed by the exact tests: static laws in tests/verifiers/test_exact.py, the
# dynamic (policy-grown) laws in tests/verifiers/test_dynamic_exact.py, which also checks that
# every dynamic law left out of a set is lossy for that verifier or has no meaning for it.
_ALL = frozenset(DraftLaw)
# Drawn from the draft rows: every law but a deterministic trie's (whose rows carry no
# information; only NSS, which ignores the rows, and greedy verify it).
_DRAWN = _ALL - {DraftLaw.DETERMINISTIC}
_DYN_CHAIN = frozenset({DraftLaw.DYNAMIC_CHAIN})
_CHAIN = frozenset({DraftLaw.CHAIN}) | _DYN_CHAIN
_IID = frozenset({DraftLaw.CHAIN, DraftLaw.IID, DraftLaw.DELAYED, DraftLaw.DYNAMIC_CHAIN, DraftLaw.DYNAMIC_IID})
# GBV's skewed law is that of the best of K i.i.d. paths of a fixed shape: no dynamic law.
_GBV = frozenset({DraftLaw.CHAIN, DraftLaw.IID, DraftLaw.DELAYED})


@dataclass(frozen=True)
class VerifierSpec:
    """A registered verifier.

    Attributes:
        name: registry name.
        fn: ``(tree, target_probs, sampler) -> VerifyResult``.
        laws: drafting laws the verifier is lossless for (the exact tests check each one).
        lossless: False for verifiers that the exact test shows to be lossy.
        greedy_only: lossless only for a one-hot (temperature 0) target.
        reference: the section that derives it, e.g. ``"docs/algorithms.md §3"``.
        rides: ``fn`` takes a ``ride`` tensor and reads it with its own first host read (so that a caller's
            checks cost no read of their own); other verifiers get it read before they run.
    """

    name: str
    fn: VerifyFn
    laws: frozenset[DraftLaw]
    lossless: bool = True
    greedy_only: bool = False
    reference: str = ""
    rides: bool = False


REGISTRY: dict[str, VerifierSpec] = {
    s.name: s
    for s in [
        VerifierSpec("token", verify_token, _CHAIN, reference="docs/algorithms.md §2"),
        VerifierSpec("greedy", verify_greedy, _ALL, greedy_only=True, reference="docs/algorithms.md §2", rides=True),
        VerifierSpec("block", verify_block, _CHAIN, reference="docs/algorithms.md §3", rides=True),
        VerifierSpec("traversal", verify_traversal, _DRAWN, reference="docs/algorithms.md §4", rides=True),
        VerifierSpec("specinfer", verify_specinfer, _IID, reference="docs/algorithms.md §5", rides=True),
        VerifierSpec("rrsw", verify_rrsw, _DRAWN, reference="docs/algorithms.md §5", rides=True),
        VerifierSpec("spectr", verify_spectr, _IID, reference="docs/algorithms.md §5"),
        VerifierSpec("nss", verify_nss, _ALL, reference="docs/algorithms.md §5", rides=True),
        VerifierSpec("naive", verify_naive, _DRAWN, reference="docs/algorithms.md §5"),
        VerifierSpec("gbv", verify_gbv, _GBV, reference="docs/algorithms.md §6"),
        VerifierSpec("hsd", verify_hsd, frozenset({DraftLaw.CHAIN}), lossless=False, reference="docs/algorithms.md §7"),
    ]
}

VERIFIER_NAMES: tuple[str, ...] = tuple(REGISTRY)


class IncompatibleTreeError(ValueError):
    """A verifier was asked to verify a tree whose drafting law it is not lossless for."""


def get_verifier(name: str) -> VerifierSpec:
    """Look a verifier up by name; raise a ValueError listing the known names otherwise."""
    try:
        return REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown verifier {name!r}; known verifiers: {', '.join(VERIFIER_NAMES)}") from None


def check_compatible(name: str, law: DraftLaw, *, allow_lossy: bool = False) -> VerifierSpec:
    """Raise unless verifier ``name`` is lossless for drafting law ``law``."""
    spec = get_verifier(name)
    if not spec.lossless and not allow_lossy:
        raise IncompatibleTreeError(
            f"verifier {name!r} is not lossless (its exact test fails, see {spec.reference}); "
            "pass allow_lossy=True to use it anyway"
        )
    if law not in spec.laws:
        ok = ", ".join(sorted(x.value for x in spec.laws))
        good = [n for n, s in REGISTRY.items() if law in s.laws and s.lossless and not s.greedy_only]
        raise IncompatibleTreeError(
            f"verifier {name!r} is not lossless for trees drafted as {law.value!r} (it accepts: {ok}); "
            f"verifiers for {law.value!r} trees: {', '.join(good)}"
        )
    return spec


def verify(
    name: str,
    tree: DraftTree,
    target_probs: torch.Tensor,
    generator: torch.Generator | Sampler,
    *,
    allow_lossy: bool = False,
    check_inputs: bool = True,
    ride: torch.Tensor | None = None,
) -> VerifyResult:
    """Verify a draft tree against the target with the named verifier.

    Args:
        name: one of :data:`VERIFIER_NAMES`.
        tree: the draft tree, with its draft distributions.
        target_probs: Tensor[num_nodes, V]; row i is the target's next-token distribution
            after ``tree.prefixes[i]``.
        generator: the caller's ``torch.Generator`` (every random draw comes from it).
        allow_lossy: allow a verifier registered as lossy (``hsd``).
        check_inputs: check shapes and that the target rows are finite probabilities (one
            pass over ``target_probs``); the engine, which checks its logits, turns it off.
        ride: a 1-D integer tensor on the rows' device whose values come back as the result's ``ride``:
            read with the verifier's own first host read when it ``rides``, else before it runs. The
            engine's finiteness checks travel this way (and a tree's tokens still on the device with them).

    Returns:
        The accepted node, the number of accepted tokens and the emitted tokens.

    Raises:
        IncompatibleTreeError: the verifier is not lossless for the tree's drafting law.
        ValueError: malformed ``target_probs``.
    """
    spec = check_compatible(name, tree.law, allow_lossy=allow_lossy)
    if target_probs.dim() != 2 or target_probs.shape != tree.draft_probs.shape:
        raise ValueError(
            f"target_probs must be [num_nodes, V] = {tuple(tree.draft_probs.shape)} to match the tree, "
            f"got {tuple(target_probs.shape)}"
        )
    if check_inputs:
        total = target_probs.sum(dim=-1)
        if not bool(torch.isfinite(total).all()):
            raise ValueError("target_probs contains NaN or inf")
        if bool((target_probs < 0).any()) or bool(((total - 1).abs() > 1e-3).any()):
            raise ValueError("target_probs rows must be probability distributions (non-negative, summing to 1)")
    sampler = as_sampler(generator)
    if ride is None:
        return spec.fn(tree, target_probs, sampler)
    if spec.rides:
        return spec.fn(tree, target_probs, sampler, ride=ride)
    return ride_first(tree, ride, lambda: spec.fn(tree, target_probs, sampler))
