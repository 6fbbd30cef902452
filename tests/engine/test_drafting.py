"""Batched drafting has the law of the reference ``sample_tree`` (Monte-Carlo two-sample chi-square)."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from scipy.stats import chi2_contingency

from adaptive_spec.engine.drafting import draft_tree
from adaptive_spec.engine.logits import ProbsFn, SamplingConfig, build_logits_processor
from adaptive_spec.engine.runner import ModelRunner
from adaptive_spec.trees import DraftTree, TreeShape, sample_tree
from tests.helpers.tiny import tiny_model

V = 3
CONTEXT = [0, 2, 1]


def tree_key(tree: DraftTree) -> tuple:
    """The tree up to node numbering: each used node's prefix with its child draws (tokens, in order).

    A slot tree's unused slots (duplicates, dropped draws) are not part of the tree.
    """
    nodes = [i for i in range(tree.num_nodes) if tree.used[i]]
    return tuple(sorted((tree.prefixes[i], tuple(tree.tokens[c] for c in tree.child_draws[i])) for i in nodes))


@pytest.fixture(scope="module")
def setup():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny models: threads only add overhead
    model = tiny_model("llama", vocab=V, hidden=16, init_range=0.4, seed=3, layers=1, eos=None)
    probs_fn = ProbsFn(build_logits_processor(SamplingConfig(temperature=1.0).generation_config()), V, one_hot=False)
    memo: dict[tuple[int, ...], torch.Tensor] = {}

    def reference_row(prefix: tuple[int, ...]) -> torch.Tensor:
        if prefix not in memo:
            with torch.inference_mode():
                logits = model(input_ids=torch.tensor([CONTEXT + list(prefix)])).logits[0, -1:]
            memo[prefix] = probs_fn(logits)[0]
        return memo[prefix]

    runner = ModelRunner(model)
    with torch.inference_mode():
        runner.chain_forward(torch.tensor(CONTEXT[:-1]), logits_to_keep=1)
    yield runner, probs_fn, reference_row
    torch.set_num_threads(threads)


def engine_trees(setup, shape: TreeShape, runs: int, seed: int, deterministic: bool = False) -> list[DraftTree]:
    runner, probs_fn, _ = setup
    g = torch.Generator().manual_seed(seed)
    out = []
    with torch.inference_mode():
        for _ in range(runs):
            base = runner.cached
            out.append(draft_tree(runner, torch.tensor(CONTEXT[-1:]), shape, probs_fn, g, deterministic).tree)
            runner.rollback(base)
    return out


@pytest.mark.parametrize("text", ["iid:2x2", "delayed:1x2x1", "wor:2x1"])
def test_drafted_tree_law_matches_sample_tree(setup, text: str) -> None:
    shape = TreeShape.parse(text)
    runs = 1500
    ours = Counter(tree_key(t) for t in engine_trees(setup, shape, runs, seed=0))
    g = torch.Generator().manual_seed(1)
    ref = Counter(tree_key(sample_tree(shape, setup[2], g)) for _ in range(runs))
    keys = sorted(set(ours) | set(ref))
    table = torch.tensor([[ours[k] for k in keys], [ref[k] for k in keys]], dtype=torch.float64)
    small = table.sum(0) < 10  # pool rare outcomes
    pooled = torch.cat([table[:, ~small], table[:, small].sum(1, keepdim=True)], dim=1)
    pooled = pooled[:, pooled.sum(0) > 0]
    assert chi2_contingency(pooled.numpy()).pvalue > 1e-3


@pytest.mark.parametrize("text", ["iid:3x2", "delayed:1x2x2", "wor:2x2"])
def test_drafted_tree_structure_and_rows(setup, text: str) -> None:
    shape = TreeShape.parse(text)
    reference_row = setup[2]
    for tree in engine_trees(setup, shape, runs=20, seed=5):
        assert tree.shape == shape and tree.max_depth == shape.depth
        assert sum(len(d) for d in tree.child_draws) == shape.num_draws or shape.law.value == "without_replacement"
        for i in range(tree.num_nodes):
            if tree.depths[i] < shape.depth:
                torch.testing.assert_close(tree.draft_probs[i], reference_row(tree.prefixes[i]), atol=1e-5, rtol=1e-4)
            else:
                assert not tree.child_draws[i]
        if shape.law.value == "without_replacement":
            for i in range(tree.num_nodes):
                toks = [tree.tokens[c] for c in tree.child_draws[i]]
                assert len(toks) == len(set(toks))
                if tree.depths[i] < shape.depth:
                    assert len(toks) == min(shape.widths[tree.depths[i]], V)


def test_deterministic_drafting_is_argmax(setup) -> None:
    reference_row = setup[2]
    (tree,) = engine_trees(setup, TreeShape.chain(3), runs=1, seed=0, deterministic=True)
    for i in range(1, tree.num_nodes):
        assert tree.tokens[i] == int(reference_row(tree.prefixes[tree.parents[i]]).argmax())
    (tree,) = engine_trees(setup, TreeShape.without_replacement((2, 1)), runs=1, seed=0, deterministic=True)
    top2 = reference_row(()).topk(2).indices.tolist()
    assert [tree.tokens[c] for c in tree.child_draws[0]] == top2


@pytest.mark.parametrize("n", [1, 7, 8, 9, 70])
def test_policy_builder_unpacks_the_ancestor_matrix_from_its_bit_masks(n):
    """The host path's ancestor matrix, unpacked in bulk, is the one its per-level mask rows read entry by entry."""
    import random

    from adaptive_spec.engine.drafting.policy import _Builder
    from adaptive_spec.trees.tree import ancestor_rows

    rng, b = random.Random(n), _Builder()
    for i in range(1, n):
        b.new_node(rng.randrange(i), i)
    every = list(range(n))
    matrix = b.ancestor_matrix()
    assert matrix.shape == (n, n) and matrix.reshape(-1).tolist() == b.mask_rows(every, every)
    assert matrix.astype(bool).tolist() == ancestor_rows(b.parents)  # node i and its ancestors, by the parents
