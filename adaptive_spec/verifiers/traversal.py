"""Traversal verification, TV (Weng et al., arXiv 2505.12398), docs/algorithms.md §4.

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

w is never clamped with an epsilon (docs/algorithms.md §4). Speed at large vocabularies:
rows are never copied up front. A node's Mb row is the target's own row until its first
rejection, then the residual vector; its Ms row is the draft's own row plus the set of tokens
zeroed so far and a scale. A rejection costs three passes over the vocabulary in the rows'
dtype (a fused ``Mb − α·Ms``, the clamp, and a float64-accumulated sum), and Ms is touched
only at nodes that still have children. The reference keeps Mb and Ms in float64: the
exact tests run on float64 rows, so they check this code in float64; the engine's rows are
the models' float32 probabilities, whose own rounding is of the same order as float32
arithmetic on them, and every sum is accumulated in float64.
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
    remaining draft mass)) are the lossy variants the exact test (docs/algorithms.md §9) rejects, kept so the
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
    # Lazy rows (see the module docstring): Mb[n] = cb * rb with rb a vector in the rows' dtype
    # (the target's own row until n's first rejection, no copy); Ms[n] = cs * q[n] with the
    # rejected tokens ``zeroed`` (q[n] itself until then, cs = 1). Scalars are float64.
    mb: dict[int, tuple[torch.Tensor, float]] = {}
    ms: dict[int, tuple[float, set[int]]] = {}

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
        rb, cb = mb.get(n, (target_probs[n], 1.0))
        q = tree.draft_probs[n]
        cs, zeroed = ms.get(n, (1.0, set()))
        r, r_sum = _residual(rb, w[n] * cb, q, cs, zeroed)  # r = (w · Mb − Ms)_+ / (w · cb)
        s = w[n] * cb * r_sum  # S = Σ (w · Mb − Ms)_+
        if parent_rule == "residual":
            new_w = s / (s + (1.0 - w[n])) if s > 0 else 0.0
        elif parent_rule == "remaining_mass":  # negative control, lossy
            remaining = cs * (_mass(q, zeroed) - float(q[t]))
            new_w = min(1.0, s / remaining) if remaining > 0 else 0.0
        else:
            raise ValueError(f"unknown parent_rule {parent_rule!r}")
        w[n] = new_w
        if s > 0:
            rb, cb = r, 1.0 / r_sum  # Mb ← r / Σ r
        mb[n] = (rb, cb)
        kids = children[n]
        if zero_rejected and kids:  # Ms[n] is read again only if n has children left
            zeroed = zeroed | {t}
            total = _mass(q, zeroed)
            if total > 0:
                cs = 1.0 / total
            ms[n] = (cs, zeroed)

        # Recompute the weights of n's remaining subtrees, top-down.
        if kids:
            idx = torch.tensor([tokens[c] for c in kids], device=rb.device)
            num = (rb[idx].double() * cb).tolist()
            den = [0.0 if tokens[c] in zeroed else cs * x for c, x in zip(kids, q[idx].double().tolist(), strict=True)]
            stack = []
            for c, a, b in zip(kids, num, den, strict=True):
                w[c] = min(1.0, w[n] * a / b) if b > 0 else 0.0
                stack.extend(children[c])
            while stack:
                d = stack.pop()
                w[d] = min(1.0, w[parents[d]] * ratio[d])
                stack.extend(children[d])


def _mass(q: torch.Tensor, zeroed: set[int]) -> float:
    """Σ q over the tokens not in ``zeroed`` (float64 accumulation)."""
    total = float(q.sum(dtype=torch.float64))
    if zeroed:
        total -= float(q[torch.tensor(sorted(zeroed), device=q.device)].double().sum())
    return max(total, 0.0)


def _residual(
    rb: torch.Tensor, scale_b: float, q: torch.Tensor, cs: float, zeroed: set[int]
) -> tuple[torch.Tensor, float]:
    """``r = (scale_b·rb − cs·q_zeroed)_+ / scale_b`` and ``Σ r`` (float64).

    Three passes over the vocabulary in the rows' dtype (one fused ``rb − α q``, the clamp,
    the float64-accumulated sum); the tokens in ``zeroed`` have Ms = 0.
    """
    if scale_b <= 0.0:
        return torch.zeros_like(rb), 0.0
    alpha = cs / scale_b
    if alpha < 1e30:
        r = torch.sub(rb, q, alpha=alpha)
    else:  # a tiny weight: avoid overflowing alpha·q in float32
        r = rb * (scale_b / cs) - q
        r.mul_(cs / scale_b)
    if zeroed:
        idx = torch.tensor(sorted(zeroed), device=rb.device)
        r[idx] = rb[idx]
    r.clamp_(min=0.0)
    return r, float(r.sum(dtype=torch.float64))
