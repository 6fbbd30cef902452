"""Fused kernels (Triton) for the verifiers' device paths: a launch where the torch code takes a few ops a column.

The torch code of :func:`~adaptive_spec.verifiers.traversal.traversal_states` rejects a node's children one column
after another, about 25 small ops a column over all the level's rows (some 600 launches a step for a 48-node tree,
milliseconds of a GPU's time spent launching), and :func:`~adaptive_spec.verifiers.rrs.rrs_states` 8 a candidate
column. Here a launch does a level (:func:`traversal_level`) or every row (:func:`rrs_rows`): a program per row, its
columns in a loop, each pass over the vocabulary in blocks, with the torch code's arithmetic (rows in their dtype,
sums and scalars in float64).

Taken where Triton runs: on CUDA when ``triton`` imports, or on a CPU in Triton's interpreter (``TRITON_INTERPRET=1``
and :data:`ON_CPU`: how the tests check the kernels against the torch code, which the exact tests hold to the
reference's law, and how ``bench overhead --syncs`` counts their path). A kernel that fails logs one line and none
is tried again in the process: the torch code runs. ``ADAPTIVE_SPEC_FUSED=0`` turns them off (the comparison).
"""

from __future__ import annotations

import functools
import importlib.util
import logging
import os

import torch

_log = logging.getLogger("adaptive_spec.verifiers")

#: The fused kernels' entry points (``bench overhead --syncs`` counts a call to one as one op, a launch).
LAUNCHES = ("traversal_level", "traversal_search_level", "rrs_rows")
#: ``FUSED[0]``: whether the fused kernels may run (set False after a failure, or by a caller that wants the
#: torch code). ``ON_CPU[0]``: whether they run on a CPU too, in Triton's interpreter (the tests' switch; from the
#: environment, ``ADAPTIVE_SPEC_FUSED_ON_CPU=1`` with ``TRITON_INTERPRET=1``: how ``bench overhead --syncs`` counts
#: the fused path on a CPU).
FUSED = [os.environ.get("ADAPTIVE_SPEC_FUSED", "1") != "0"]
ON_CPU = [os.environ.get("ADAPTIVE_SPEC_FUSED_ON_CPU", "0") == "1"]


def interpreting() -> bool:
    """Whether Triton runs its kernels in its interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def fused_on(device: torch.device) -> bool:
    """Whether the fused kernels run on ``device``: not turned off, Triton installed, and a CUDA device (or a CPU with
    :data:`ON_CPU` set, in Triton's interpreter).
    """
    if not FUSED[0]:
        return False
    if device.type == "cuda" or (device.type == "cpu" and ON_CPU[0] and interpreting()):
        return _has_triton()
    return False


@functools.cache
def _has_triton() -> bool:
    return importlib.util.find_spec("triton") is not None


def failed(what: str, exc: BaseException) -> None:
    """Turn the fused kernels off for the process, with one log line saying why."""
    FUSED[0] = False
    _log.warning("fused %s kernel failed (%s: %s); the torch code runs instead", what, type(exc).__name__, exc)


def traversal_level(
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    parents: torch.Tensor | None,
    cand: torch.Tensor,
    tok: torch.Tensor,
    act: torch.Tensor,
    nodes: torch.Tensor | None,
    w_all: torch.Tensor,
    out: torch.Tensor,
    row0: int,
    rows: int,
    zero_rejected: bool,
    merge: bool = False,
) -> None:
    """One level of :func:`~adaptive_spec.verifiers.traversal.traversal_states` in one launch, in place.

    ``target_probs`` and ``draft_probs`` [N, V] (one dtype, contiguous); ``rows`` parents: ``parents`` [rows], or
    the slots ``row0 .. row0 + rows - 1`` when None; their children, tokens and activity: rows ``row0 ..`` of
    ``cand``, ``tok``, ``act`` [*, K] (:func:`~adaptive_spec.verifiers.traversal._device_levels`' or a slot tree's
    whole tables). ``nodes`` (BoolTensor[N + 1], a slot tree's): which slots are nodes, the root's set; a parent
    that is not one has no active child, and an active child is set; ``merge``: a column is active only if no
    earlier active column of its row drew its token (a slot tree's walkers that drew one token stand on one node).
    ``w_all`` float64 [N + 1, 1], read at the
    parents, written at their active children (each one's weight when reached) and at the parents (each one's
    weight when tested as a leaf); ``out`` [N, V], the target's rows to start with: a parent's is rewritten, to
    its final ``Mb``.
    """
    from adaptive_spec.verifiers import _triton

    v = target_probs.shape[1]
    block = min(4096, _triton.triton.next_power_of_2(v))
    _triton.traversal_level_kernel[(rows,)](
        target_probs,
        draft_probs,
        parents if parents is not None else cand,
        cand,
        tok,
        act,
        nodes if nodes is not None else act,
        w_all,
        out,
        row0,
        cand.stride(0),
        tok.stride(0),
        act.stride(0),
        v,
        cand.shape[1],
        ZERO=zero_rejected,
        PARENTS=parents is not None,
        NODES=nodes is not None,
        MERGE=merge,
        BLOCK=block,
        num_warps=_warps(block),
    )


def traversal_search_level(
    parents: torch.Tensor | None,
    cand: torch.Tensor,
    tok: torch.Tensor,
    act: torch.Tensor,
    found: torch.Tensor,
    first: torch.Tensor,
    row0: int,
    rows: int,
    merge: bool = False,
) -> None:
    """One level of :func:`~adaptive_spec.verifiers.traversal.traversal_on_device`'s bottom-up search in one launch,
    in place (parents and tables as in :func:`traversal_level`): each parent's first flagged node in post-order
    (``first``, LongTensor[N + 1]: the first active child, in drafting order, with a flagged node under it gives it,
    else the parent itself) and whether it has one (``found``, BoolTensor[N + 1], each node's own flip to start
    with). Called for the deepest level first.
    """
    from adaptive_spec.verifiers import _triton

    _triton.traversal_search_kernel[(rows,)](
        parents if parents is not None else cand,
        cand,
        tok,
        act,
        found,
        first,
        row0,
        cand.stride(0),
        tok.stride(0),
        act.stride(0),
        cand.shape[1],
        PARENTS=parents is not None,
        MERGE=merge,
    )


def rrs_rows(
    p: torch.Tensor, q: torch.Tensor, x: torch.Tensor, active: torch.Tensor, without_replacement: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`~adaptive_spec.verifiers.rrs.rrs_states` in one launch: ``(accept float64 [M, K], residual [M, V])``.

    ``p`` and ``q`` [M, V] (one dtype), ``x`` and ``active`` [M, K]: a program per row, its candidates in a loop.
    """
    from adaptive_spec.verifiers import _triton

    m, k = x.shape
    v = p.shape[1]
    p, q = p.contiguous(), q.contiguous()
    accept = torch.empty(m, k, dtype=torch.float64, device=p.device)
    frozen = torch.empty(m, k, dtype=torch.float64, device=p.device) if without_replacement else accept
    residual = torch.empty_like(p)
    block = min(4096, _triton.triton.next_power_of_2(v))
    _triton.rrs_rows_kernel[(m,)](
        p,
        q,
        x,
        active,
        accept,
        frozen,
        residual,
        x.stride(0),
        active.stride(0),
        v,
        k,
        WOR=without_replacement,
        BLOCK=block,
        num_warps=_warps(block),
    )
    return accept, residual


def _warps(block: int) -> int:
    """Warps of a program over ``block`` entries a pass."""
    return 8 if block >= 2048 else 4
