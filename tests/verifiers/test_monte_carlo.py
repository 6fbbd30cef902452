"""The shipped samplers (torch.Generator) produce the exact law on fixed trees (chi-square)."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from scipy.stats import chisquare

from adaptive_spec.analysis.exact import draw_tree, enumerate_law, fixed_tree_law, target_rows, tree_law
from adaptive_spec.analysis.instances import Instance, one_hot_target
from adaptive_spec.rng import TorchSampler
from adaptive_spec.trees import DraftLaw, TreeShape, sample_tree
from adaptive_spec.verifiers import REGISTRY, verify
from tests.helpers.verifier_cases import TrieDrafter, lossless_pairs

SHAPE_FOR = {
    DraftLaw.CHAIN: TreeShape.chain(4),
    DraftLaw.IID: TreeShape.iid(3, 3),
    DraftLaw.DELAYED: TreeShape.delayed(1, 3, 2),
    DraftLaw.WITHOUT_REPLACEMENT: TreeShape.without_replacement((3, 2)),
    DraftLaw.DETERMINISTIC: TrieDrafter([1, 2, 3, 1, 4, 5, 7, 1, 2, 6, 1], 12, 3, 3),  # 1 -> 2 6 1 | 4 5 7 | 2 3 1
}


def _instance(vocab: int, seed: int) -> Instance:
    """Softmax rows of random logits: realistic, no exact zeros, draft close to target."""

    def row(model: int, c: tuple[int, ...]) -> torch.Tensor:
        g = torch.Generator().manual_seed(hash((seed, len(c), *c)) % (2**31))
        base = torch.randn(vocab, generator=g, dtype=torch.float64) * 2
        noise = torch.randn(vocab, generator=g, dtype=torch.float64)
        return torch.softmax(base + model * noise, dim=0)

    return Instance(f"softmax(V={vocab})", vocab, lambda c: row(0, c), lambda c: row(1, c))


def _chi2_pvalue(exact: dict, samples: list, n: int) -> float:
    counts = Counter(samples)
    assert set(counts) <= set(exact), "sampled an outcome the exact law gives probability 0"
    # Pool outcomes with a small expected count into one cell.
    obs, exp, pool_o, pool_e = [], [], 0, 0.0
    for key, prob in exact.items():
        if prob * n >= 5:
            obs.append(counts.get(key, 0))
            exp.append(prob * n)
        else:
            pool_o += counts.get(key, 0)
            pool_e += prob * n
    if pool_e > 0:
        obs.append(pool_o)
        exp.append(pool_e)
    if len(obs) == 1:  # a deterministic outcome, and every sample hit it
        return 1.0
    exp_total = sum(exp)
    exp = [e * sum(obs) / exp_total for e in exp]
    return float(chisquare(obs, exp).pvalue)


@pytest.mark.parametrize(("name", "law"), lossless_pairs(), ids=lambda x: getattr(x, "value", x))
def test_verifier_sampling_matches_exact_law_on_a_fixed_tree(name, law):
    inst = _instance(12, seed=7)
    if REGISTRY[name].greedy_only:
        inst = one_hot_target(inst)
    tree = draw_tree(SHAPE_FOR[law], inst.draft_fn, TorchSampler(torch.Generator().manual_seed(3)))
    rows = target_rows(tree, inst.target_fn)
    exact = fixed_tree_law(REGISTRY[name].fn, tree, rows)
    n = 3000
    gen = torch.Generator().manual_seed(12345)
    samples = []
    for _ in range(n):
        res = verify(name, tree, rows, gen)
        samples.append((res.node, res.tokens))
    assert _chi2_pvalue(exact, samples, n) > 1e-3


def test_large_vocab_rows_smoke():
    """Larger rows (V = 500): the empirical law of the emitted tokens matches exactly."""
    inst = _instance(500, seed=1)
    tree = sample_tree(TreeShape.iid(2, 2), inst.draft_fn, torch.Generator().manual_seed(0))
    rows = target_rows(tree, inst.target_fn)
    for name in ["traversal", "gbv", "spectr"]:
        exact = fixed_tree_law(REGISTRY[name].fn, tree, rows)
        # Compare the law of the accepted node (the recovered token has 500 values).
        node_law: dict = Counter()
        for (node, _), prob in exact.items():
            node_law[node] += prob
        gen = torch.Generator().manual_seed(99)
        samples = [verify(name, tree, rows, gen, check_inputs=False).node for _ in range(2500)]
        assert _chi2_pvalue(dict(node_law), samples, 2500) > 1e-3, name


TREE_LAW_SHAPES = [
    TreeShape.chain(3),
    TreeShape.iid(3, 2),
    TreeShape.delayed(1, 2, 2),
    TreeShape.without_replacement((2, 2)),
]


@pytest.mark.parametrize("shape", TREE_LAW_SHAPES, ids=str)
def test_sample_tree_with_a_generator_matches_the_enumerated_tree_law(shape):
    inst = _instance(3, seed=5)

    def key(tree):
        return tuple(tree.prefixes), tuple(tuple(d) for d in tree.child_draws)

    exact: dict = Counter()
    for tree, prob in tree_law(shape, inst.draft_fn):
        exact[key(tree)] += prob
    gen = torch.Generator().manual_seed(2024)
    sampler = TorchSampler(gen)
    n = 3000
    samples = [key(sample_tree(shape, inst.draft_fn, sampler)) for _ in range(n)]
    assert _chi2_pvalue(dict(exact), samples, n) > 1e-3


def test_enumerate_law_sums_to_one_and_matches_simple_program():
    def program(ch):
        a = ch.flip(0.25)
        b = ch.categorical(torch.tensor([0.5, 0.0, 0.5]))
        return a, b

    law = enumerate_law(program)
    assert law == pytest.approx({(True, 0): 0.125, (True, 2): 0.125, (False, 0): 0.375, (False, 2): 0.375})
