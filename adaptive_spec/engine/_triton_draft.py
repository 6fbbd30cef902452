"""The Triton kernel of :mod:`adaptive_spec.engine.draft_kernels` (imported on first use: ``triton`` is imported here,
and ``TRITON_INTERPRET`` is read when the kernel is made).
"""

import triton
import triton.language as tl

# Every integer argument but the rows' stride changes from level to level or plan to plan: none is specialised on (see
# adaptive_spec.verifiers._triton), and whether the level is the last is an argument too, so that a plan's levels run
# one compiled kernel (its block sizes are the policy's, not the level's: draft_kernels.eagle_iid_level). Its rows are
# read at drawn tokens only, so their pointer's alignment (a slice of the root's rows, whatever the vocabulary) is not
# specialised on either.
_INTS = ("F", "W", "G", "depth", "M", "top_k", "tok_off", "par_off", "depth_off", "draw_off", "child_off")
_INTS += ("state_off", "fed_off", "fr_off", "next_off", "feed_off", "pp_in", "pp_out", "P", "is_last")


@triton.jit(do_not_specialize=_INTS, do_not_specialize_on_alignment=("r_ptr",))
def eagle_iid_level_kernel(
    r_ptr,
    r_stride,
    cand_ptr,
    work_ptr,
    pp_ptr,
    anc_ptr,
    allowed_ptr,
    F,
    W,
    G,
    depth,
    M,
    top_k,
    tok_off,
    par_off,
    depth_off,
    draw_off,
    child_off,
    state_off,
    fed_off,
    fr_off,
    next_off,
    feed_off,
    pp_in,
    pp_out,
    P,
    is_last,
    BE: tl.constexpr,
    BG: tl.constexpr,
    BC: tl.constexpr,
):
    """One program: a level of draft_eagle_iid_on_device's bookkeeping (draws e = row * W + column, rows the
    frontier's, on axis 0; the same draws on axis 1 for the pairwise rules). Offsets are into ``work_ptr`` (the
    tree's tables, its fed nodes and its counters, :class:`_IidFused`'s layout).
    """
    FW = F * W
    e = tl.arange(0, BE)
    inr = e < FW
    row = e // W
    e2 = e[None, :]
    nxt = tl.load(work_ptr + state_off)  # the next node id less one
    left = tl.load(work_ptr + state_off + 1)  # the budget left
    fed = tl.load(work_ptr + state_off + 2)  # the fed rows of this level's frontier
    bad = tl.load(work_ptr + state_off + 3)  # a drawn child of probability 0 so far
    c = tl.load(cand_ptr + e, mask=inr, other=-1)
    q = tl.load(r_ptr + row * r_stride + tl.maximum(c, 0), mask=inr, other=0.0).to(tl.float64)
    drawn = tl.minimum(left, fed * W)  # the fed rows' draws, within the budget (spent in frontier order)
    valid = inr & (e < drawn)
    same = (row[:, None] == row[None, :]) & (c[:, None] == c[None, :]) & (e2 < FW)  # a row's draws of one token
    first = tl.min(tl.where(same & (e2 <= e[:, None]), e2, BE), axis=1)  # its token's first draw at the row
    new = valid & (first == e)  # a token's first valid draw at its row
    new_i = new.to(tl.int64)
    ids = tl.where(new, tl.cumsum(new_i, axis=0) + nxt, M)  # new nodes numbered in the order made
    count = tl.sum(new_i, axis=0)
    left = left - drawn
    par = tl.load(work_ptr + fr_off + row, mask=inr, other=M)
    tl.store(work_ptr + tok_off + ids, c, mask=new)
    tl.store(work_ptr + par_off + ids, par, mask=new)
    tl.store(work_ptr + depth_off + ids, tl.zeros_like(ids) + depth, mask=new)
    # each valid draw's node (its token's first draw's), and each row's distinct children in order made
    child = tl.where(valid, tl.sum(tl.where(e2 == first[:, None], ids[None, :], 0), axis=1), M)
    real = inr & (par < M)
    tl.store(work_ptr + draw_off + par * W + (e - row * W), child, mask=real)
    kth = tl.sum((new[None, :] & (row[:, None] == row[None, :]) & (e2 < e[:, None])).to(tl.int64), axis=1)
    tl.store(work_ptr + child_off + par * W + kth, ids, mask=new)
    # a new node's ancestors: its parent's, and itself (the parents' rows are earlier levels': no row is read here
    # that this program writes)
    for c0 in range(0, M + 1, BC):
        cols = c0 + tl.arange(0, BC)
        on = new[:, None] & (cols < M + 1)[None, :]
        a = tl.load(anc_ptr + par[:, None] * (M + 1) + cols[None, :], mask=on, other=0) != 0
        tl.store(anc_ptr + ids[:, None] * (M + 1) + cols[None, :], a | (cols[None, :] == ids[:, None]), mask=on)
    bad = tl.maximum(bad, tl.minimum(tl.sum((valid & (q <= 0)).to(tl.int64), axis=0), 1))  # a row of zeros drawn
    # every warp has read the counters before any writes them (the program's warps are not in lockstep)
    tl.debug_barrier()
    tl.store(work_ptr + state_off + 3, bad)
    tl.store(work_ptr + state_off, nxt + count)
    tl.store(work_ptr + state_off + 1, left)
    if is_last == 0:
        # the next frontier: the top_k new nodes of highest path probability (float64 products; ties: the first
        # made), in the order made, padding (node M) after them; nothing is fed once the budget is spent
        fed = tl.where(left > 0, tl.minimum(count, top_k), 0)
        tl.store(work_ptr + state_off + 2, fed)
        pp_row = tl.load(pp_ptr + pp_in + row, mask=inr, other=0.0)
        pp = tl.where(depth == 1, 1.0, pp_row) * q
        key = tl.where(new, pp, -1.0)
        ahead = (key[None, :] > key[:, None]) | ((key[None, :] == key[:, None]) & (e2 < e[:, None]))
        rank = tl.sum((ahead & (e2 < FW)).to(tl.int64), axis=1)
        sel = new & (rank < tl.minimum(fed, G))
        slot = tl.sum((sel[None, :] & (e2 < e[:, None])).to(tl.int64), axis=1)
        s = tl.arange(0, BG)
        hit = sel[None, :] & (slot[None, :] == s[:, None])  # [slot, draw]
        has = tl.sum(hit.to(tl.int32), axis=1) > 0
        last = e2 == FW - 1  # a padding row feeds the level's last draw, with its path probability
        node_s = tl.where(has, tl.sum(tl.where(hit, ids[None, :], 0), axis=1), M)
        par_s = tl.where(has, tl.sum(tl.where(hit, par[None, :], 0), axis=1), M)
        tok_s = tl.sum(tl.where(hit | (~has[:, None] & last), c[None, :], 0), axis=1)
        pp_s = tl.sum(tl.where(hit | (~has[:, None] & last), pp[None, :], 0.0), axis=1)
        sm = s < G
        tl.store(work_ptr + next_off + s, node_s, mask=sm)
        tl.store(work_ptr + feed_off + s, tok_s, mask=sm)
        tl.store(pp_ptr + pp_out + s, pp_s, mask=sm)
        # the fed rows' mask over the pending rows, every fed node so far and the new level: a node sees the pending
        # rows, its parent's ancestors and itself (a padding row: the pending rows and the root)
        old = next_off - fed_off
        ncols = P + old + G
        for c0 in range(0, ncols, BC):
            cols = c0 + tl.arange(0, BC)
            k = cols - P
            before = (k >= 0) & (k < old)
            node_k = tl.load(work_ptr + fed_off + k, mask=before, other=0)
            a = tl.load(
                anc_ptr + par_s[:, None] * (M + 1) + node_k[None, :], mask=sm[:, None] & before[None, :], other=0
            )
            own = has[:, None] & (k[None, :] - old == s[:, None])
            tl.store(
                allowed_ptr + s[:, None] * ncols + cols[None, :],
                (cols[None, :] < P) | (a != 0) | own,
                mask=sm[:, None] & (cols < ncols)[None, :],
            )
