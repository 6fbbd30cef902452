"""E[τ+1] on a fixed tree by the collapsing enumerator equals the full enumeration (docs/algorithms.md §9)."""

from __future__ import annotations

import pytest
import torch

from adaptive_spec.analysis.exact import draw_tree, fixed_tree_law, target_rows
from adaptive_spec.analysis.expected import expected_block_efficiency, greedy_block_efficiency
from adaptive_spec.rng import TorchSampler
from adaptive_spec.trees import DraftLaw, TreeShape, sample_tree
from adaptive_spec.verifiers import REGISTRY
from tests.helpers.verifier_cases import cases_for, instance_for, lossless_pairs


def _full_expectation(name, tree, rows) -> float:
    law = fixed_tree_law(REGISTRY[name].fn, tree, rows)
    return sum((tree.depths[node] + 1) * prob for (node, _), prob in law.items())


@pytest.mark.parametrize(
    ("name", "law"), [p for p in lossless_pairs() if p[0] != "greedy"], ids=lambda x: getattr(x, "value", x)
)
def test_collapsed_enumeration_is_exact(name, law):
    gen = torch.Generator().manual_seed(0)
    checked = 0
    for base, shape in cases_for(law)[:12]:
        inst = instance_for(name, base)
        tree = draw_tree(shape, inst.draft_fn, TorchSampler(gen))
        rows = target_rows(tree, inst.target_fn)
        value, exact = expected_block_efficiency(name, tree, rows)
        assert exact
        assert value == pytest.approx(_full_expectation(name, tree, rows), abs=1e-12), (inst.name, str(shape))
        checked += 1
    assert checked == 12


def test_monte_carlo_fallback_is_close():
    base, shape = next((b, s) for b, s in cases_for(DraftLaw.IID) if s.max_nodes >= 5)
    inst = instance_for("hsd", base)  # no closed form: the enumerator, or Monte Carlo past its budget
    shape = TreeShape.chain(3)
    tree = sample_tree(shape, inst.draft_fn, torch.Generator().manual_seed(1))
    rows = target_rows(tree, inst.target_fn)
    exact_value, exact = expected_block_efficiency("hsd", tree, rows)
    assert exact
    mc_value, exact = expected_block_efficiency("hsd", tree, rows, max_runs=1, mc_runs=4000)
    assert not exact
    assert mc_value == pytest.approx(exact_value, abs=0.06)  # 4000 runs: sd <= 1.5/63


def test_greedy_follows_the_argmax():
    base, shape = next((b, s) for b, s in cases_for(DraftLaw.DELAYED) if s.max_nodes >= 5)
    inst = instance_for("greedy", base)
    tree = sample_tree(shape, inst.draft_fn, torch.Generator().manual_seed(2))
    rows = target_rows(tree, inst.target_fn)
    one_hot = torch.nn.functional.one_hot(rows.argmax(-1), rows.shape[-1]).double()
    assert greedy_block_efficiency(tree, rows) == pytest.approx(_full_expectation("greedy", tree, one_hot))
