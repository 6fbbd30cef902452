"""A fused kernel (Triton) for drafting: a level of an EAGLE-style tree with i.i.d. children in one launch.

:func:`~adaptive_spec.engine.drafting.draft_eagle_iid_on_device`'s torch code numbers a level's new nodes, merges
each row's draws by token, copies the ancestors, chooses the next frontier (the top k of path probabilities) and
builds the fed rows' mask in some 45 small ops a level (launches on a GPU, where the level's draft forward costs
about as much). :func:`eagle_iid_level` does the same in one program, with the same arithmetic (float64 path
probabilities; ties: the first made), writing the tree's tables in place: the tree, its draws and its feeds are
the torch code's. Gated like the verifiers' kernels (:func:`~adaptive_spec.verifiers.kernels.fused_on`: CUDA, or a
CPU in Triton's interpreter for the tests and ``bench overhead --syncs``); a failure logs one line, turns the fused
kernels off and raises :class:`KernelFailedError`, and the caller grows the tree again with the torch code.
"""

from __future__ import annotations

import torch

from adaptive_spec.verifiers import kernels

#: The entry points ``bench overhead --syncs`` counts as one op (a launch) each.
LAUNCHES = ("eagle_iid_level",)


class KernelFailedError(RuntimeError):
    """A fused drafting kernel failed (logged, the kernels turned off): draft the tree again with the torch code."""


def eagle_iid_level(
    rows: torch.Tensor,
    cand: torch.Tensor,
    work: torch.Tensor,
    pp: torch.Tensor,
    ancestors: torch.Tensor,
    allowed: torch.Tensor | None,
    shape: tuple[int, int, int, int, int, int],
    offsets: tuple[int, ...],
    pending: int,
) -> None:
    """One level of :func:`~adaptive_spec.engine.drafting.draft_eagle_iid_on_device` in one launch, in place.

    ``rows`` [F, V] the frontier's draft rows, ``cand`` [F, W] their draws; ``work`` (long) the tree's tables, fed
    nodes and counters at ``offsets`` (``_IidFused``' layout); ``pp`` (float64) the frontier's path probabilities
    and the next one's (ping-pong at ``offsets[-2:]``); ``ancestors`` bool [M + 1, M + 1], rows written for the new
    nodes; ``allowed`` bool [G, pending + fed so far + G], the next level's mask (None: the last level).
    ``shape``: ``(F, W, G, depth, M, top_k)``. The blocks are set by the policy's ``top_k`` and ``W`` (every level's
    ``F`` and ``G`` are at most ``top_k``), not by the level's or the tree's: a plan's levels and its trees cut short
    near a request's end run one compiled kernel.
    """
    from adaptive_spec.engine import _triton_draft

    f, w, g, depth, m, top_k = shape
    nxt = _triton_draft.triton.next_power_of_2
    try:
        _triton_draft.eagle_iid_level_kernel[(1,)](
            rows,
            rows.stride(0),
            cand,
            work,
            pp,
            ancestors,
            allowed if allowed is not None else ancestors,
            f,
            w,
            g,
            depth,
            m,
            top_k,
            *offsets,
            pending,
            int(allowed is None),
            BE=max(16, nxt(top_k * w)),
            BG=max(16, nxt(top_k)),
            BC=64,
        )
    except Exception as exc:  # any failure: the torch code drafts instead
        kernels.failed("eagle iid level", exc)
        raise KernelFailedError(str(exc)) from exc
