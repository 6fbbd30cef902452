"""Instance and shape grids shared by the verifier tests (docs/algorithms.md §9)."""

from __future__ import annotations

from adaptive_spec.analysis.instances import Instance, one_hot_target, random_instance, toy_instance
from adaptive_spec.trees import DraftLaw, TreeShape
from adaptive_spec.verifiers import REGISTRY

# (V, shape) per drafting law; V in {2,3,4}, depth 2-3, K 1-3, sized so that exact
# enumeration over every draw stays cheap.
SHAPES: dict[DraftLaw, list[tuple[int, TreeShape]]] = {
    DraftLaw.CHAIN: [
        (2, TreeShape.chain(2)),
        (3, TreeShape.chain(2)),
        (4, TreeShape.chain(2)),
        (2, TreeShape.chain(3)),
        (3, TreeShape.chain(3)),
        (4, TreeShape.chain(3)),
    ],
    DraftLaw.IID: [
        (2, TreeShape.iid(2, 2)),
        (3, TreeShape.iid(2, 2)),
        (4, TreeShape.iid(2, 2)),
        (2, TreeShape.iid(3, 2)),
        (3, TreeShape.iid(3, 2)),
        (2, TreeShape.iid(2, 3)),
        (2, TreeShape.iid(3, 3)),
    ],
    DraftLaw.DELAYED: [
        (2, TreeShape.delayed(1, 2, 1)),
        (3, TreeShape.delayed(1, 2, 1)),
        (4, TreeShape.delayed(1, 2, 1)),
        (3, TreeShape.delayed(1, 3, 1)),
        (2, TreeShape.delayed(1, 2, 2)),
        (3, TreeShape.delayed(2, 2, 1)),
    ],
    DraftLaw.WITHOUT_REPLACEMENT: [
        (3, TreeShape.without_replacement((2, 1))),
        (4, TreeShape.without_replacement((2, 1))),
        (3, TreeShape.without_replacement((2, 2))),
        (3, TreeShape.without_replacement((3, 1))),
        (2, TreeShape.without_replacement((2, 2, 1))),
        (3, TreeShape.without_replacement((1, 2))),
    ],
}

N_RANDOM = 50


def cases_for(law: DraftLaw, n_random: int = N_RANDOM) -> list[tuple[Instance, TreeShape]]:
    """The toy plus ``n_random`` random context-dependent instances with exact zeros."""
    grid = SHAPES[law]
    out: list[tuple[Instance, TreeShape]] = []
    toy_shape = {
        DraftLaw.CHAIN: TreeShape.chain(2),
        DraftLaw.IID: TreeShape.iid(2, 2),
        DraftLaw.DELAYED: TreeShape.delayed(1, 2, 1),
        DraftLaw.WITHOUT_REPLACEMENT: TreeShape.without_replacement((2, 1)),
    }[law]
    out.append((toy_instance(), toy_shape))
    for i in range(n_random):
        vocab, shape = grid[i % len(grid)]
        out.append((random_instance(1000 * (list(DraftLaw).index(law) + 1) + i, vocab), shape))
    return out


def lossless_pairs() -> list[tuple[str, DraftLaw]]:
    """Every (verifier, static drafting law) pair the registry declares lossless."""
    return [
        (name, law) for name, spec in REGISTRY.items() if spec.lossless for law in sorted(spec.laws) if not law.dynamic
    ]


def instance_for(name: str, inst: Instance) -> Instance:
    """Greedy verification is lossless for the temperature-0 (one-hot) target."""
    return one_hot_target(inst) if REGISTRY[name].greedy_only else inst
