"""The Triton kernels of :mod:`adaptive_spec.verifiers.kernels` (imported on first use: ``triton`` is imported here,
and ``TRITON_INTERPRET`` is read when the kernels are made).
"""

import triton
import triton.language as tl

F64_TINY = tl.constexpr(1e-300)


@triton.jit
def traversal_level_kernel(
    p_ptr,
    q_ptr,
    par_ptr,
    cand_ptr,
    tok_ptr,
    act_ptr,
    w_ptr,
    out_ptr,
    row0,
    cand_stride,
    tok_stride,
    act_stride,
    V: tl.constexpr,
    K: tl.constexpr,
    ZERO: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """A program per parent row: its children rejected in order (traversal_states' column loop)."""
    row = tl.program_id(0)
    node = tl.load(par_ptr + row)
    p_row = p_ptr + node * V
    q_row = q_ptr + node * V
    o_row = out_ptr + (row0 + row).to(tl.int64) * V
    dtype = p_ptr.dtype.element_ty
    w = tl.load(w_ptr + node)
    # Mb starts as the target's row (kept in the output row, rewritten at each move); L: the draft's total
    left = tl.zeros((), dtype=tl.float64)
    for start in range(0, V, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        m = offs < V
        tl.store(o_row + offs, tl.load(p_row + offs, mask=m, other=0.0), mask=m)
        left += tl.sum(tl.load(q_row + offs, mask=m, other=0.0).to(tl.float64))
    cb = tl.full((), 1.0, tl.float64)
    cs = tl.full((), 1.0, tl.float64)
    for j in tl.static_range(K):
        t = tl.load(tok_ptr + row * tok_stride + j)
        on = tl.load(act_ptr + row * act_stride + j) != 0
        child = tl.load(cand_ptr + row * cand_stride + j)
        scale = w * cb
        ratio = scale / cs
        at = tl.load(o_row + t).to(tl.float64)  # Mb's entry at the child's token when it is reached
        q_t = tl.load(q_row + t).to(tl.float64)
        alpha = tl.minimum(cs / scale, 3e38).to(dtype)  # w = 0: r is rb where Ms is 0, and S = 0
        r_sum = tl.zeros((), dtype=tl.float64)
        for start in range(0, V, BLOCK):
            offs = start + tl.arange(0, BLOCK)
            m = offs < V
            rb = tl.load(o_row + offs, mask=m, other=0.0)
            qz = tl.load(q_row + offs, mask=m, other=0.0)
            if ZERO:  # the earlier children's tokens, rejected: Ms = 0 there
                for jj in tl.static_range(j):
                    tz = tl.load(tok_ptr + row * tok_stride + jj)
                    az = tl.load(act_ptr + row * act_stride + jj) != 0
                    qz = tl.where((offs == tz) & az, 0.0, qz)
            r = tl.maximum(rb - alpha * qz, 0.0)
            r_sum += tl.sum(r.to(tl.float64))
        s = scale * r_sum
        moved = on & (s > 0)
        w = tl.where(on, s / tl.maximum(s + (1.0 - w), tl.full((), F64_TINY, tl.float64)), w)
        if moved:  # Mb ← r / Σ r: the row rewritten
            for start in range(0, V, BLOCK):
                offs = start + tl.arange(0, BLOCK)
                m = offs < V
                rb = tl.load(o_row + offs, mask=m, other=0.0)
                qz = tl.load(q_row + offs, mask=m, other=0.0)
                if ZERO:
                    for jj in tl.static_range(j):
                        tz = tl.load(tok_ptr + row * tok_stride + jj)
                        az = tl.load(act_ptr + row * act_stride + jj) != 0
                        qz = tl.where((offs == tz) & az, 0.0, qz)
                tl.store(o_row + offs, tl.maximum(rb - alpha * qz, 0.0), mask=m)
            tl.debug_barrier()
            cb = 1.0 / r_sum
        if ZERO and j + 1 < K:  # noqa: SIM102 - a static condition around a runtime one: Ms loses the token's mass
            if on:
                left = left - q_t
                if left > 0:
                    cs = 1.0 / left
        # the child's weight when reached: min(1, w · Mb(t) / Ms(t)); a q = 0 edge cannot have been drafted
        w_child = tl.where(q_t > 0, tl.minimum(ratio * at / q_t, 1.0), 0.0)
        tl.store(w_ptr + child, w_child)
    tl.store(w_ptr + node, w)
