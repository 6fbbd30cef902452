"""Expected block efficiency E[τ + 1] of a verifier on a *fixed* draft tree.

Used to label logged contexts offline (``adaptive-spec label``): the verifier's randomness is
integrated out exactly by running the shipped verifier under a collapsing enumerator, and by
Monte Carlo only when the enumeration would be too long.

The collapsing enumerator is the §14 :class:`~adaptive_spec.verifiers.exact.Chooser` with one
change: a categorical draw branches only over the tokens that appear in the tree, plus one
representative of all other tokens carrying their total mass. τ depends on a drawn token only
through which tree node (if any) carries it, so the law of τ is unchanged, while the number of
runs drops from O(V) per draw to O(tree size). For the top-down walks (SpecInfer, SpecTr, RRSw,
NSS, naive) this gives exactly DDTE's Σ_nodes Π B(f, children, t) (reference §10); for
token-level, block, traversal and GBV verification the final draw never changes τ.
"""

from __future__ import annotations

import torch

from adaptive_spec.rng import TorchSampler
from adaptive_spec.trees import DraftTree
from adaptive_spec.verifiers.exact import Chooser, EnumerationBudgetError, enumerate_law
from adaptive_spec.verifiers.registry import REGISTRY

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
