"""Instance and shape grids shared by the verifier tests (docs/algorithms.md §9)."""

from __future__ import annotations

import random

from adaptive_spec.analysis.instances import Instance, one_hot_target, random_instance, toy_instance
from adaptive_spec.trees import DraftLaw, DraftTree, TreeShape
from adaptive_spec.trees.lookup import lookup_trie, ngram_candidates
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


class TrieDrafter:
    """The deterministic law: the lookup trie of a random context's continuations (no draws).

    The context is made of repeats so that its last token recurs several times with different
    continuations; the trie is what the engine's ``lookup:WxL`` step would draft from it.
    """

    def __init__(self, seed: int | list[int], vocab: int, paths: int, depth: int) -> None:
        if isinstance(seed, list):
            self.context = list(seed)
        else:
            rng = random.Random(seed)
            self.context = [rng.randrange(vocab) for _ in range(10)]
        self.vocab, self.paths, self.depth = vocab, paths, depth
        self.shape = TreeShape.lookup(paths, depth)  # the law's envelope (what tests read off a shape)

    def __call__(self, _sampler) -> DraftTree:
        cands = ngram_candidates(self.context, self.paths, self.depth, max_ngram=2)
        return lookup_trie(cands, self.vocab, self.paths)

    def __str__(self) -> str:
        return f"trie:{self.paths}x{self.depth} of {self.context}"


# (V, W, L) of the deterministic tries
TRIES = [(2, 2, 2), (3, 2, 2), (3, 3, 2), (4, 3, 2), (3, 2, 3), (4, 4, 3)]


def trie_cases(n_random: int = N_RANDOM) -> list[tuple[Instance, TrieDrafter]]:
    """Random instances with a lookup trie of a random context each (every one with two or more paths)."""
    out = []
    for i in range(n_random):
        vocab, paths, depth = TRIES[i % len(TRIES)]
        seed = 7000 + 100 * i
        while len(TrieDrafter(seed, vocab, paths, depth)(None).children[0]) < 2:  # not branching: another context
            seed += 1
        drafter = TrieDrafter(seed, vocab, paths, depth)
        out.append((random_instance(9000 + i, vocab), drafter))
    return out


def cases_for(law: DraftLaw, n_random: int = N_RANDOM) -> list[tuple[Instance, TreeShape | TrieDrafter]]:
    """The toy plus ``n_random`` random context-dependent instances with exact zeros."""
    if law is DraftLaw.DETERMINISTIC:
        return [(toy_instance(), TrieDrafter(1, 2, 2, 2)), *trie_cases(n_random)]
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
