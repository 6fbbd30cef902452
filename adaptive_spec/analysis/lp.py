"""The physical limit: the exact LP for the best lossless verifier (docs/algorithms.md §10).

For every draft outcome ω (the ordered sequence of draws, which gives a verifier at least
as much information as the merged tree) with probability π(ω), and every output
o = (node of ω's tree, Y), a variable z(ω, o) ≥ 0 is the joint probability of drafting ω
and emitting o::

    Σ_o z(ω, o) = π(ω)                                  for every ω
    Σ_{ω,o} z(ω, o) · C(o → s) = p^n(s)                  for every s ∈ V^n, n = depth + 1
    C(o → s) = 1{s starts with o} · Π_{j>|o|} p(s_j | s_<j)   (completion with target samples)
    maximise Σ z(ω, o) · |o|  (= E[τ + 1])

Solved with scipy's HiGHS. Feasible for V ≤ 3 and a few thousand draft outcomes.
"""

from __future__ import annotations

import itertools

import numpy as np
import scipy.sparse as sp
from scipy.optimize import linprog

from adaptive_spec.analysis.exact import ProbsFn, tree_law
from adaptive_spec.trees import TreeShape

MAX_OUTCOMES = 50_000


def lp_limit(shape: TreeShape, draft_fn: ProbsFn, target_fn: ProbsFn, vocab_size: int) -> float:
    """Best block efficiency E[τ + 1] any lossless verifier can reach for this drafting law.

    Args:
        shape: the drafting recipe (any law).
        draft_fn / target_fn: ``prefix -> Tensor[V]`` for the draft and the target.
        vocab_size: V (small: the LP has V^(depth+1) equality rows).

    Raises:
        ValueError: the instance is too large to enumerate.
        RuntimeError: HiGHS did not find the optimum.
    """
    if vocab_size ** (shape.num_draws) > MAX_OUTCOMES:
        raise ValueError(
            f"lp_limit: {vocab_size}^{shape.num_draws} draft outcomes is too many to enumerate; "
            "use a smaller vocabulary or tree"
        )
    n = shape.depth + 1
    strings = list(itertools.product(range(vocab_size), repeat=n))
    s_index = {s: i for i, s in enumerate(strings)}
    rows: dict[tuple[int, ...], list[float]] = {}

    def row(seq: tuple[int, ...]) -> list[float]:
        if seq not in rows:
            rows[seq] = target_fn(seq).double().tolist()
        return rows[seq]

    completions: dict[tuple[int, ...], list[tuple[int, float]]] = {}

    def completion(o: tuple[int, ...]) -> list[tuple[int, float]]:
        if o not in completions:
            frontier = [(o, 1.0)]
            for _ in range(n - len(o)):
                frontier = [(seq + (y,), c * py) for seq, c in frontier for y, py in enumerate(row(seq)) if py > 0]
            completions[o] = [(s_index[seq], c) for seq, c in frontier]
        return completions[o]

    outcomes = tree_law(shape, draft_fn)
    n_omega = len(outcomes)
    data, ri, ci, cost = [], [], [], []
    b_eq = np.zeros(n_omega + len(strings))
    col = 0
    for w, (tree, prob) in enumerate(outcomes):
        b_eq[w] = prob
        for prefix in tree.prefixes:
            for y in range(vocab_size):
                o = prefix + (y,)
                ri.append(w)
                ci.append(col)
                data.append(1.0)
                for s, c in completion(o):
                    ri.append(n_omega + s)
                    ci.append(col)
                    data.append(c)
                cost.append(-float(len(o)))
                col += 1
    joint = np.ones(len(strings))
    for i, s in enumerate(strings):
        for j in range(n):
            joint[i] *= row(s[:j])[s[j]]
    b_eq[n_omega:] = joint
    a_eq = sp.csr_matrix((data, (ri, ci)), shape=(n_omega + len(strings), col))
    res = linprog(np.array(cost), A_eq=a_eq, b_eq=b_eq, bounds=(0, None), method="highs")
    if res.status != 0:
        raise RuntimeError(f"lp_limit: HiGHS failed: {res.message}")
    return float(-res.fun)
