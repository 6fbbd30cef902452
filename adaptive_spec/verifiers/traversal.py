"""Traversal verification, TV (Weng et al., arXiv 2505.12398), reference §4.

Post-order traversal of the tree, bottom-up. Each surviving node n carries a target row
Mb[n] (initially p(·|n)), a draft row Ms[n] (initially q(·|n)) and a weight
w[c] = min(1, w[n] · Mb[n][t_c] / Ms[n][t_c]) for each child c. The first leaf in drafting
order is accepted whole with probability w[leaf]; otherwise it is deleted and its parent n
is updated as one step of sequence-level RRSw over an augmented vocabulary:

    r = (w[n] · Mb[n] − Ms[n])_+,  S = Σ r,
    w[n] ← S / (S + 1 − w[n]),  Mb[n] ← r / S,  Ms[n][t] ← 0 then renormalise,

and the weights of n's remaining subtrees are recomputed top-down. The node that is
finally accepted emits a token from its current Mb row (the bonus token if it was never
touched, a recovered token otherwise).

Lossless for chains (where it equals BV), for trees drawn without replacement, and for
i.i.d. trees with duplicates merged (children in order of first appearance).

All rows are kept in float64 and w is never clamped with an epsilon (reference §4).
"""

from __future__ import annotations

import torch

from adaptive_spec.rng import Sampler
from adaptive_spec.trees import DraftTree
from adaptive_spec.verifiers.base import VerifyResult, edge_probs, result_for


def verify_traversal(tree: DraftTree, target_probs: torch.Tensor, sampler: Sampler) -> VerifyResult:
    """Traversal verification of a chain, an i.i.d./delayed tree or a without-replacement tree."""
    return traversal_impl(tree, target_probs, sampler)


def traversal_impl(
    tree: DraftTree,
    target_probs: torch.Tensor,
    sampler: Sampler,
    *,
    zero_rejected: bool = True,
    parent_rule: str = "residual",
) -> VerifyResult:
    """Traversal verification with switches for the reference's negative controls.

    Only the defaults are lossless. ``zero_rejected=False`` (not removing the rejected token
    from the parent's draft row) and ``parent_rule="remaining_mass"`` (w ← min(1, S / the
    remaining draft mass)) are the lossy variants of reference §14 item 5, kept so the
    exact tests can show that they are caught.
    """
    n_nodes = tree.num_nodes
    parents, tokens = tree.parents, tree.tokens
    p_edge = edge_probs(tree, target_probs)
    q_edge = edge_probs(tree, tree.draft_probs)
    # Original ratio p/q on every edge; a q = 0 edge cannot have been drafted, its weight is 0.
    ratio = [p / q if q > 0 else 0.0 for p, q in zip(p_edge, q_edge, strict=True)]
    children = [list(c) for c in tree.children]
    w = [1.0] * n_nodes
    for i in range(1, n_nodes):  # parents precede children
        w[i] = min(1.0, w[parents[i]] * ratio[i])
    # Rows changed by rejections, kept as scale * raw float64 vector so that a rejection
    # costs four passes over the vocabulary: Mb = cb * rb, Ms = cs * rs, sum_rs = Σ rs.
    mb: dict[int, tuple[torch.Tensor, float]] = {}
    ms: dict[int, tuple[torch.Tensor, float, float]] = {}

    while True:
        leaf = 0
        while children[leaf]:
            leaf = children[leaf][0]
        if leaf == 0 or sampler.flip(w[leaf]):
            if leaf in mb:
                return result_for(tree, leaf, sampler.categorical(mb[leaf][0]), bonus=False)
            return result_for(tree, leaf, sampler.categorical(target_probs[leaf]), bonus=True)

        # Reject the leaf: delete it and update its parent n.
        n, t = parents[leaf], tokens[leaf]
        children[n].pop(0)
        rb, cb = mb[n] if n in mb else (target_probs[n].double(), 1.0)
        if n in ms:
            rs, cs, sum_rs = ms[n]
        else:
            rs = tree.draft_probs[n].to(torch.float64, copy=True)  # zeroed in place below
            cs, sum_rs = 1.0, float(rs.sum())
        r = rb * (w[n] * cb)
        r.sub_(rs, alpha=cs).clamp_(min=0.0)  # r = (w · Mb − Ms)_+
        s = float(r.sum())
        if parent_rule == "residual":
            new_w = s / (s + (1.0 - w[n])) if s > 0 else 0.0
        elif parent_rule == "remaining_mass":  # negative control, lossy
            remaining = cs * (sum_rs - float(rs[t]))
            new_w = min(1.0, s / remaining) if remaining > 0 else 0.0
        else:
            raise ValueError(f"unknown parent_rule {parent_rule!r}")
        w[n] = new_w
        if s > 0:
            rb, cb = r, 1.0 / s
        if zero_rejected:
            sum_rs -= float(rs[t])
            rs[t] = 0.0
            if sum_rs > 0:
                cs = 1.0 / sum_rs
        mb[n], ms[n] = (rb, cb), (rs, cs, sum_rs)

        # Recompute the weights of n's remaining subtrees, top-down.
        kids = children[n]
        if kids:
            idx = torch.tensor([tokens[c] for c in kids], device=rb.device)
            num, den = (rb[idx] * cb).tolist(), (rs[idx] * cs).tolist()
            stack = []
            for c, a, b in zip(kids, num, den, strict=True):
                w[c] = min(1.0, w[n] * a / b) if b > 0 else 0.0
                stack.extend(children[c])
            while stack:
                d = stack.pop()
                w[d] = min(1.0, w[parents[d]] * ratio[d])
                stack.extend(children[d])
