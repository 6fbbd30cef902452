"""The exact harness must catch the lossy variants of docs/algorithms.md §9."""

from __future__ import annotations

import pytest

from adaptive_spec.analysis.exact import completed_tv, output_law
from adaptive_spec.analysis.instances import random_instance, toy_instance
from adaptive_spec.trees import TreeShape
from adaptive_spec.verifiers import REGISTRY
from adaptive_spec.verifiers.specinfer import verify_specinfer
from adaptive_spec.verifiers.traversal import traversal_impl

CAUGHT = 1e-3  # far above the 1e-9 tolerance; the reference measures 0.03 and more


def _max_tv(fn, shape, instances):
    worst = 0.0
    for inst in instances:
        law = output_law(fn, shape, inst.draft_fn, inst.target_fn)
        tv, mass = completed_tv(law, inst.target_fn, inst.vocab, shape.depth + 1)
        assert abs(mass - 1) < 1e-12
        worst = max(worst, tv)
    return worst


INSTANCES = [random_instance(s, 3, zero_frac=0.0) for s in range(6)]


@pytest.mark.parametrize("shape", [TreeShape.iid(2, 2), TreeShape.without_replacement((2, 2))], ids=str)
def test_traversal_without_zeroing_rejected_draft_token_is_caught(shape):
    def fn(tree, p, s):
        return traversal_impl(tree, p, s, zero_rejected=False)

    assert _max_tv(fn, shape, INSTANCES) > CAUGHT


def test_traversal_with_remaining_mass_parent_rule_is_caught():
    def fn(tree, p, s):
        return traversal_impl(tree, p, s, parent_rule="remaining_mass")

    assert _max_tv(fn, TreeShape.iid(2, 2), INSTANCES) > CAUGHT


def test_with_replacement_rrs_on_without_replacement_tree_is_caught():
    assert _max_tv(verify_specinfer, TreeShape.without_replacement((2, 1)), INSTANCES) > CAUGHT


def test_hsd_clever_is_lossy_as_the_reference_measures():
    toy = toy_instance()
    law = output_law(REGISTRY["hsd"].fn, TreeShape.chain(2), toy.draft_fn, toy.target_fn)
    tv, _ = completed_tv(law, toy.target_fn, 2, 3)
    assert tv == pytest.approx(1 / 9, abs=1e-12)  # docs/algorithms.md §7: TV = 1/9 on the toy
    assert _max_tv(REGISTRY["hsd"].fn, TreeShape.chain(2), INSTANCES) > CAUGHT
    assert _max_tv(REGISTRY["hsd"].fn, TreeShape.chain(3), INSTANCES[:3]) > CAUGHT
