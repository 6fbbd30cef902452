"""Expected block efficiency E[τ + 1] of a verifier on a *fixed* draft tree.

Used to label logged contexts offline (``adaptive-spec label``): the verifier's randomness is
integrated out exactly by running the shipped verifier under a collapsing enumerator, and by
Monte Carlo only when the enumeration would be too long.

The collapsing enumerator is the exact test's :class:`~adaptive_spec.analysis.exact.Chooser`
(docs/algorithms.md §9) with one
change: a categorical draw branches only over the tokens that appear in the tree, plus one
representative of all other tokens carrying their total mass. τ depends on a drawn token only
through which tree node (if any) carries it, so the law of τ is unchanged, while the number of
runs drops from O(V) per draw to O(tree size). For the top-down walks (SpecInfer, SpecTr, RRSw,
NSS, naive) this gives exactly DDTE's Σ_nodes Π B(f, children, t) (docs/algorithms.md §8); for
token-level, block, traversal and GBV verification the final draw never changes τ.
"""

from __future__ import annotations

import torch

from adaptive_spec.analysis.exact import Chooser, EnumerationBudgetError, enumerate_law
from adaptive_spec.rng import TorchSampler
from adaptive_spec.trees import DraftTree
from adaptive_spec.verifiers.base import edge_probs
from adaptive_spec.verifiers.naive import naive_solver
from adaptive_spec.verifiers.nss import nss_solver
from adaptive_spec.verifiers.registry import REGISTRY
from adaptive_spec.verifiers.rrsw import rrsw_solver
from adaptive_spec.verifiers.specinfer import specinfer_solver
from adaptive_spec.verifiers.spectr import spectr_rho, spectr_solve
from adaptive_spec.verifiers.traversal import traversal_impl

__all__ = ["expected_block_efficiency", "greedy_block_efficiency"]


class _CollapsingChooser(Chooser):
    """A :class:`Chooser` whose categorical draws branch over tree tokens plus one 'other' token."""

    def __init__(self, forced: list[int], in_tree: torch.Tensor) -> None:
        super().__init__(forced)
        self.in_tree = in_tree  # BoolTensor[V] on the CPU

    def categorical(self, weights: torch.Tensor) -> int:
        w = weights.detach().double().cpu()
        total = float(w.sum())
        if not total > 0.0:
            raise ValueError("categorical draw from all-zero weights")
        kept = torch.where(self.in_tree, w, torch.zeros_like(w))
        idx = torch.nonzero(kept).flatten().tolist()
        options = list(zip(idx, (kept[idx] / total).tolist(), strict=True))
        other = torch.where(self.in_tree, torch.zeros_like(w), w)
        rest = float(other.sum())
        if rest > 0.0:
            options.append((int(other.argmax()), rest / total))
        return int(self._choose(options))


# Top-down walks: (node solver, distinct children) as in each verifier's module.
_WALKS = {
    "specinfer": (specinfer_solver, False),
    "rrsw": (rrsw_solver, True),
    "spectr": (spectr_solve, False),
    "nss": (nss_solver, True),
    "naive": (naive_solver, False),
}


class _RejectAll:
    """A sampler that records every acceptance probability and rejects (the spine of a caterpillar)."""

    def __init__(self) -> None:
        self.probs: list[float] = []

    def flip(self, prob: float) -> bool:
        self.probs.append(float(prob))
        return False

    def flip_bounded(self, bound: float, prob) -> bool:  # noqa: ARG002
        return self.flip(prob())

    def categorical(self, weights: torch.Tensor) -> int:
        return int(weights.argmax())


def _caterpillar(probs: list[float], depths: list[int]) -> float:
    """E[τ+1] when test k accepts depth ``depths[k]`` w.p. ``probs[k]`` and all rejected means τ = 0."""
    alive, total = 1.0, 0.0
    for w, d in zip(probs, depths, strict=True):
        total += alive * w * (d + 1)
        alive *= 1.0 - w
    return total + alive


def _token_be(tree: DraftTree, target_probs: torch.Tensor) -> float:
    p, q = edge_probs(tree, target_probs), edge_probs(tree, tree.draft_probs)
    total, run = 1.0, 1.0
    for i in range(1, tree.num_nodes):
        run *= min(1.0, p[i] / q[i]) if q[i] > 0 else 0.0
        total += run
    return total


def _traversal_be(tree: DraftTree, target_probs: torch.Tensor) -> float:
    # Traversal tests the leaves of a shrinking tree in post-order (children in drafting order), so
    # the k-th flip of an all-reject run tests the k-th node of the post-order: one run gives the law.
    order: list[int] = []

    def post(n: int) -> None:
        for c in tree.children[n]:
            post(c)
        order.append(n)

    post(0)
    rec = _RejectAll()
    traversal_impl(tree, target_probs, rec)
    depths = [tree.depths[n] for n in order[:-1]]
    if len(rec.probs) != len(depths):  # pragma: no cover - guards the post-order argument
        raise AssertionError("traversal tested nodes outside post-order")
    return _caterpillar(rec.probs, depths)


def _gbv_be(tree: DraftTree, target_probs: torch.Tensor) -> float:
    # GBV picks its path deterministically, then runs BV's backward scan along it: flip w_γ at
    # depth γ, then h_i for i = γ-1 .. 1, skipping the i with w_i = 0. Zero weights form a
    # suffix of the path (w_i = 0 makes every deeper w zero), so the flips after the first are
    # at depths m .. 1, and the first tests depth m + 1 whenever its probability is not zero.
    rec = _RejectAll()
    REGISTRY["gbv"].fn(tree, target_probs, rec)
    if not rec.probs:
        return 1.0
    m = len(rec.probs) - 1
    return _caterpillar(rec.probs, [m + 1, *range(m, 0, -1)])


def _walk_be(tree: DraftTree, target_probs: torch.Tensor, verifier: str) -> float:
    # DDTE eq. 1-3: E[τ+1] = Σ_nodes P(reach node); the branching law of each node's solver is
    # enumerated exactly over its own candidates (plus one 'other' token).
    solver, distinct = _WALKS[verifier]
    reach = [0.0] * tree.num_nodes
    reach[0] = 1.0
    V = target_probs.shape[-1]
    for node in range(tree.num_nodes):  # parents precede children
        if reach[node] == 0.0 or not tree.child_draws[node]:
            continue
        if verifier == "nss":  # Y ~ p: branch to each child with its target probability
            row = target_probs[node].double()
            for child in tree.children[node]:
                reach[child] = reach[node] * float(row[tree.tokens[child]])
            continue
        draws = tree.children[node] if distinct else tree.child_draws[node]
        candidates = [tree.tokens[c] for c in draws]
        in_tree = torch.zeros(V, dtype=torch.bool)
        in_tree[torch.tensor(candidates, dtype=torch.long)] = True
        p, q = target_probs[node], tree.draft_probs[node]
        if verifier == "spectr":  # ρ* depends on (p, q, k) only: solve it once, not once per run
            rho = spectr_rho(p, q, len(candidates))
            solver = lambda p, q, c, ch, rho=rho: spectr_solve(p, q, c, ch, rho=rho)  # noqa: E731
        law = enumerate_law(
            lambda ch, p=p, q=q, candidates=candidates, solver=solver: solver(p, q, candidates, ch)[0],
            chooser=lambda forced, in_tree=in_tree: _CollapsingChooser(forced, in_tree),
        )
        for child in tree.children[node]:
            reach[child] = reach[node] * law.get(tree.tokens[child], 0.0)
    return sum(reach)


def greedy_block_efficiency(tree: DraftTree, target_probs: torch.Tensor) -> float:
    """E[τ + 1] of greedy verification (temperature 0): follow the target's argmax down the tree."""
    node, length = 0, 1
    while True:
        child = tree.child_with_token(node, int(target_probs[node].argmax()))
        if child is None:
            return float(length)
        node, length = child, length + 1


def expected_block_efficiency(
    verifier: str,
    tree: DraftTree,
    target_probs: torch.Tensor,
    *,
    max_runs: int = 4096,
    mc_runs: int = 256,
    generator: torch.Generator | None = None,
) -> tuple[float, bool]:
    """E[τ + 1] of ``verifier`` on ``tree``, integrating out the verifier's randomness.

    Args:
        verifier: a registry name; ``"greedy"`` follows the argmax (temperature 0).
        tree: the fixed draft tree (with its draft rows).
        target_probs: Tensor[N, V], the target row at every node.
        max_runs: enumeration budget; beyond it, fall back to Monte Carlo.
        mc_runs: number of verifier runs of the Monte Carlo fallback.
        generator: randomness of the fallback (a fresh seeded one if None).

    Returns:
        ``(value, exact)``: the expectation, and whether it was computed exactly.
    """
    if verifier == "greedy":
        return greedy_block_efficiency(tree, target_probs), True
    if verifier == "token":
        return _token_be(tree, target_probs), True
    if verifier in ("traversal", "block"):  # block = traversal on a chain (same law, docs/algorithms.md §4)
        if verifier == "block" and any(len(c) > 1 for c in tree.children):
            raise ValueError("block verification needs a chain")
        return _traversal_be(tree, target_probs), True
    if verifier in _WALKS:
        return _walk_be(tree, target_probs, verifier), True
    if verifier == "gbv":
        return _gbv_be(tree, target_probs), True
    fn = REGISTRY[verifier].fn
    in_tree = torch.zeros(target_probs.shape[-1], dtype=torch.bool)
    in_tree[torch.tensor(tree.tokens[1:], dtype=torch.long)] = True
    try:
        law = enumerate_law(
            lambda ch: fn(tree, target_probs, ch).num_accepted,
            chooser=lambda forced: _CollapsingChooser(forced, in_tree),
            max_runs=max_runs,
        )
        return sum((tau + 1) * prob for tau, prob in law.items()), True
    except EnumerationBudgetError:
        pass
    if generator is None:
        generator = torch.Generator(device=target_probs.device).manual_seed(0)
    sampler = TorchSampler(generator)
    total = sum(fn(tree, target_probs, sampler).num_accepted + 1 for _ in range(mc_runs))
    return total / mc_runs, False
