"""The Triton kernels of :mod:`adaptive_spec.verifiers.kernels` (imported on first use: ``triton`` is imported here,
and ``TRITON_INTERPRET`` is read when the kernels are made).
"""

import triton
import triton.language as tl

F64_TINY = tl.constexpr(1e-300)

# Triton compiles a kernel again for every new pattern of its integer arguments (equal to 1, a multiple of 16) and its
# pointers' alignment, unless told not to: the arguments that change from level to level, step to step or plan to plan
# are not specialised on (one compile per kernel and flags, made in a bench's warm-up, not one per level inside its
# timed runs). The vocabulary's size and the rows' pointers, which decide the blocks' vector loads, still are.
_PER_LEVEL = ("row0", "cand_stride", "tok_stride", "act_stride", "K")


@triton.jit(do_not_specialize=_PER_LEVEL, do_not_specialize_on_alignment=("par_ptr",))
def traversal_level_kernel(
    p_ptr,
    q_ptr,
    par_ptr,
    cand_ptr,
    tok_ptr,
    act_ptr,
    node_ptr,
    w_ptr,
    out_ptr,
    row0,
    cand_stride,
    tok_stride,
    act_stride,
    V,
    K,
    ZERO: tl.constexpr,
    PARENTS: tl.constexpr,
    NODES: tl.constexpr,
    MERGE: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """A program per parent row: its children rejected in order (traversal_states' column loop).

    The parent: ``par_ptr[pid]`` (PARENTS), else slot ``row0 + pid``; its candidates: row ``row0 + pid`` of the
    tables. NODES: ``node_ptr`` flags the slots that are nodes (a slot tree's merge): a parent that is not one has
    no active child, and an active child is flagged. ``out_ptr``: every node's row, the target's to start with;
    a parent's is rewritten in place, to its final Mb.
    """
    trow = row0 + tl.program_id(0)
    tok_row, act_row = tok_ptr + trow * tok_stride, act_ptr + trow * act_stride  # the row's candidates
    if PARENTS:  # noqa: SIM108 - a static branch, as Triton compiles it
        node = tl.load(par_ptr + tl.program_id(0))
    else:
        node = trow.to(tl.int64)
    is_node = True
    if NODES:
        is_node = tl.load(node_ptr + node) != 0
    q_row = q_ptr + node * V
    o_row = out_ptr + node * V
    dtype = p_ptr.dtype.element_ty
    w = tl.load(w_ptr + node)
    left = tl.zeros((), dtype=tl.float64)  # L: the draft's total
    for start in range(0, V, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        left += tl.sum(tl.load(q_row + offs, mask=offs < V, other=0.0).to(tl.float64))
    cb = tl.full((), 1.0, tl.float64)
    cs = tl.full((), 1.0, tl.float64)
    for j in range(K):
        t = tl.load(tok_row + j)
        on = (tl.load(act_row + j) != 0) & is_node
        if MERGE:
            on = _first_with_token(on, t, tok_row, act_row, j)
        if on:  # an inactive column changes nothing
            child = tl.load(cand_ptr + trow * cand_stride + j)
            scale = w * cb
            ratio = scale / cs
            at = tl.load(o_row + t).to(tl.float64)  # Mb's entry at the child's token when it is reached
            q_t = tl.load(q_row + t).to(tl.float64)
            alpha = tl.minimum(cs / scale, 3e38).to(dtype)  # w = 0: r is rb where Ms is 0, and S = 0
            r_sum = tl.zeros((), dtype=tl.float64)
            for start in range(0, V, BLOCK):
                offs = start + tl.arange(0, BLOCK)
                r = _rejected(o_row, q_row, offs, offs < V, alpha, tok_row, act_row, j, ZERO)
                r_sum += tl.sum(r.to(tl.float64))
            s = scale * r_sum
            w = s / tl.maximum(s + (1.0 - w), tl.full((), F64_TINY, tl.float64))
            if s > 0:  # Mb ← r / Σ r: the row rewritten (else an all-zero residual: Mb stays)
                for start in range(0, V, BLOCK):
                    offs = start + tl.arange(0, BLOCK)
                    m = offs < V
                    tl.store(o_row + offs, _rejected(o_row, q_row, offs, m, alpha, tok_row, act_row, j, ZERO), mask=m)
                tl.debug_barrier()  # the row rewritten, seen by every thread of the program
                cb = 1.0 / r_sum
            if ZERO:  # Ms loses the rejected token's mass (read again only if a child is left)
                left = left - q_t
                if (j + 1 < K) & (left > 0):
                    cs = 1.0 / left
            # the child's weight when reached: min(1, w · Mb(t) / Ms(t)); a q = 0 edge cannot have been drafted
            tl.store(w_ptr + child, tl.where(q_t > 0, tl.minimum(ratio * at / q_t, 1.0), 0.0))
            if NODES:
                tl.store(node_ptr + child, on)
    tl.store(w_ptr + node, w)


@triton.jit(do_not_specialize=("x_stride", "act_stride", "K"))
def rrs_rows_kernel(
    p_ptr,
    q_ptr,
    x_ptr,
    act_ptr,
    accept_ptr,
    frozen_ptr,
    out_ptr,
    x_stride,
    act_stride,
    V,
    K,
    WOR: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """A program per row: its candidates tried in order (rrs_states' column loop), the residual in one form."""
    row = tl.program_id(0)
    p_row = p_ptr + row.to(tl.int64) * V
    q_row = q_ptr + row.to(tl.int64) * V
    o_row = out_ptr + row.to(tl.int64) * V
    x_row, act_row, frozen_row = x_ptr + row * x_stride, act_ptr + row * act_stride, frozen_ptr + row * K
    dtype = p_ptr.dtype.element_ty
    c = tl.zeros((), dtype=tl.float64)  # p' ∝ (p − c q)_+, N its mass: p' = p
    n = tl.full((), 1.0, tl.float64)
    ell = tl.full((), 1.0, tl.float64)  # L: the draft mass left (1 with replacement)
    if WOR:
        ell = tl.zeros((), dtype=tl.float64)
        for start in range(0, V, BLOCK):
            offs = start + tl.arange(0, BLOCK)
            ell += tl.sum(tl.load(q_row + offs, mask=offs < V, other=0.0).to(tl.float64))
    for j in range(K):
        x = tl.load(x_row + j)
        on = tl.load(act_row + j) != 0
        px = tl.load(p_row + x).to(tl.float64)
        qx = tl.load(q_row + x).to(tl.float64)
        inc = tl.where(on, 1.0 / tl.maximum(ell, tl.full((), F64_TINY, tl.float64)), 0.0)
        # accepted with probability min(1, p'(x) / q'(x)) when tried: (p − c q)_+(x) / (N q(x) / L)
        num = tl.maximum(px - c * qx, 0.0)
        den = n * qx * inc
        tl.store(accept_ptr + row * K + j, tl.where(den > 0, tl.minimum(num / den, 1.0), 0.0))
        c2 = c + n * inc
        c2r = c2.to(dtype)
        n2 = tl.zeros((), dtype=tl.float64)
        for start in range(0, V, BLOCK):
            offs = start + tl.arange(0, BLOCK)
            m = offs < V
            r = tl.maximum(
                tl.load(p_row + offs, mask=m, other=0.0) - c2r * tl.load(q_row + offs, mask=m, other=0.0), 0.0
            )
            if WOR:  # the rejected candidates before this one: frozen at p'(x) then, q'(x) = 0
                r = _frozen(r, offs, x_row, act_row, frozen_row, j)
            n2 += tl.sum(r.to(tl.float64))
        keep = n2 > 0  # else the residual is all zero: keep p'
        c = tl.where(keep, c2, c)
        n = tl.where(keep, n2, n)
        if WOR:
            tl.store(frozen_row + j, tl.maximum(px - c * qx, 0.0))
            tl.debug_barrier()  # stored (by one thread) before any warp reads it back in _frozen
            ell = ell - tl.where(on, qx, 0.0)
    cr = c.to(dtype)
    for start in range(0, V, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        m = offs < V
        r = tl.maximum(tl.load(p_row + offs, mask=m, other=0.0) - cr * tl.load(q_row + offs, mask=m, other=0.0), 0.0)
        if WOR:  # the last candidate's entry is (p − c q)_+ as it is
            r = _frozen(r, offs, x_row, act_row, frozen_row, K - 1)
        tl.store(o_row + offs, r, mask=m)


@triton.jit(do_not_specialize=_PER_LEVEL, do_not_specialize_on_alignment=("par_ptr",))
def traversal_search_kernel(
    par_ptr,
    cand_ptr,
    tok_ptr,
    act_ptr,
    found_ptr,
    first_ptr,
    row0,
    cand_stride,
    tok_stride,
    act_stride,
    K,
    PARENTS: tl.constexpr,
    MERGE: tl.constexpr,
):
    """A program per parent row of a level (deepest level first): the first flagged node in post-order under it
    (parents and tables as in traversal_level_kernel; a parent that is not a node gets values never read).
    """
    trow = row0 + tl.program_id(0)
    if PARENTS:  # noqa: SIM108 - a static branch, as Triton compiles it
        node = tl.load(par_ptr + tl.program_id(0))
    else:
        node = trow.to(tl.int64)
    tok_row, act_row = tok_ptr + trow * tok_stride, act_ptr + trow * act_stride
    hit = tl.full((), 0, tl.int1)
    best = node
    for j in range(K):
        c = tl.load(cand_ptr + trow * cand_stride + j)
        on = tl.load(act_row + j) != 0
        if MERGE:  # a token's first active column only
            on = _first_with_token(on, tl.load(tok_row + j), tok_row, act_row, j)
        f = on & (tl.load(found_ptr + c) != 0)
        best = tl.where(f & (hit == 0), tl.load(first_ptr + c), best)
        hit = hit | f
    tl.store(first_ptr + node, best)
    tl.store(found_ptr + node, (tl.load(found_ptr + node) != 0) | hit)


@triton.jit
def _first_with_token(on, t, tok_row, act_row, j):
    """``on``, unless an active column of the row before ``j`` drew token ``t`` (the merge: one node a token)."""
    for jj in range(j):
        on = on & ~((tl.load(tok_row + jj) == t) & (tl.load(act_row + jj) != 0))
    return on


@triton.jit
def _rejected(o_row, q_row, offs, m, alpha, tok_row, act_row, j, ZERO: tl.constexpr):
    """A block of ``(Mb − α · Ms)_+`` (unnormalised), Ms zero at the tokens of the row's active children before
    ``j`` (ZERO: the rejected tokens leave Ms).
    """
    qz = tl.load(q_row + offs, mask=m, other=0.0)
    if ZERO:
        for jj in range(j):
            qz = tl.where((offs == tl.load(tok_row + jj)) & (tl.load(act_row + jj) != 0), 0.0, qz)
    return tl.maximum(tl.load(o_row + offs, mask=m, other=0.0) - alpha * qz, 0.0)


@triton.jit
def _frozen(r, offs, x_row, act_row, frozen_row, count):
    """The block ``r`` with the row's first ``count`` active candidates' tokens at their frozen values."""
    for jj in range(count):
        hit = (offs == tl.load(x_row + jj)) & (tl.load(act_row + jj) != 0)
        r = tl.where(hit, tl.load(frozen_row + jj).to(r.dtype), r)
    return r
