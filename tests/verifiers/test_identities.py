"""Block-efficiency identities, closed forms and LP cross-checks.

The LP limit: docs/algorithms.md §10; the exact test: docs/algorithms.md §9.
"""

from __future__ import annotations

import pytest
import torch

from adaptive_spec.analysis import lp_limit
from adaptive_spec.analysis.exact import block_efficiency, output_law, tree_law
from adaptive_spec.analysis.instances import random_instance, toy_instance
from adaptive_spec.trees import TreeShape
from adaptive_spec.verifiers import REGISTRY
from adaptive_spec.verifiers.gbv import rank_cdf, skewed_draft
from adaptive_spec.verifiers.spectr import spectr_rho

INSTANCES = [toy_instance()] + [random_instance(s, v) for s, v in [(11, 2), (12, 3), (13, 3), (14, 4), (15, 2)]]


def law_of(name, shape, inst):
    return output_law(REGISTRY[name].fn, shape, inst.draft_fn, inst.target_fn)


def assert_same_law(a, b, tol=1e-12):
    keys = set(a) | set(b)
    assert max(abs(a.get(k, 0.0) - b.get(k, 0.0)) for k in keys) < tol


@pytest.mark.parametrize("inst", INSTANCES, ids=lambda i: i.name)
@pytest.mark.parametrize("length", [2, 3])
def test_bv_equals_traversal_on_a_chain(inst, length):
    shape = TreeShape.chain(length)
    assert_same_law(law_of("block", shape, inst), law_of("traversal", shape, inst))


@pytest.mark.parametrize("inst", INSTANCES, ids=lambda i: i.name)
def test_gbv_with_one_path_equals_bv(inst):
    shape = TreeShape.iid(1, 3)  # canonical chain
    assert_same_law(law_of("gbv", shape, inst), law_of("block", shape, inst))


@pytest.mark.parametrize("inst", INSTANCES, ids=lambda i: i.name)
def test_gbv_skew_with_k1_is_the_draft(inst):
    p, q = inst.target_fn(()), inst.draft_fn(())
    cdf = rank_cdf(p, q)
    assert torch.allclose(skewed_draft(q, cdf, 0.0, 1.0, 1), q, atol=1e-15)
    # Mid-path masses change nothing for K = 1 either.
    assert torch.allclose(skewed_draft(q, cdf, 0.3, 0.2, 1), q, atol=1e-15)


@pytest.mark.parametrize("inst", INSTANCES, ids=lambda i: i.name)
@pytest.mark.parametrize("length", [2, 3])
def test_bv_block_efficiency_is_one_plus_sum_of_expected_weights(inst, length):
    shape = TreeShape.chain(length)
    expected = 1.0
    for tree, prob in tree_law(shape, inst.draft_fn):
        w = 1.0
        for node in range(1, tree.num_nodes):
            par, tok = tree.parents[node], tree.tokens[node]
            p = float(inst.target_fn(tree.prefixes[par])[tok])
            q = float(tree.draft_probs[par, tok])
            w = min(1.0, w * p / q) if q > 0 else 0.0
            expected += prob * w
    assert block_efficiency(law_of("block", shape, inst)) == pytest.approx(expected, abs=1e-12)


@pytest.mark.parametrize("name", ["specinfer", "rrsw", "spectr", "naive"])
@pytest.mark.parametrize("inst", INSTANCES, ids=lambda i: i.name)
def test_node_solvers_with_one_child_equal_token_level(name, inst):
    shape = TreeShape.chain(3)
    assert_same_law(law_of(name, shape, inst), law_of("token", shape, inst))


def test_toy_block_efficiencies_match_the_reference():
    toy = toy_instance()
    expected = {  # exact enumeration rows (the enumerator of docs/algorithms.md §9)
        ("token", 1): 19 / 9,
        ("block", 1): 20 / 9,
        ("specinfer", 2): 2.3333,
        ("spectr", 2): 2.4055,
        ("traversal", 2): 2.4198,
        ("gbv", 2): 2.6173,
        ("specinfer", 3): 2.4911,
        ("traversal", 3): 2.5583,
        ("spectr", 3): 2.5933,
        ("gbv", 3): 2.7682,
    }
    for (name, k), value in expected.items():
        be = block_efficiency(law_of(name, TreeShape.iid(k, 2), toy))
        assert be == pytest.approx(value, abs=1e-4), name


def test_lp_limit_on_the_toy():
    toy = toy_instance()
    assert lp_limit(TreeShape.chain(2), toy.draft_fn, toy.target_fn, 2) == pytest.approx(20 / 9, abs=1e-7)
    assert lp_limit(TreeShape.iid(2, 2), toy.draft_fn, toy.target_fn, 2) == pytest.approx(2.6173, abs=1e-4)
    assert lp_limit(TreeShape.iid(3, 2), toy.draft_fn, toy.target_fn, 2) == pytest.approx(2.8532, abs=1e-4)


@pytest.mark.parametrize("inst", INSTANCES[1:4], ids=lambda i: i.name)
def test_lp_bounds_every_verifier_and_equals_bv_for_one_path(inst):
    chain = TreeShape.chain(2)
    bv = block_efficiency(law_of("block", chain, inst))
    assert lp_limit(chain, inst.draft_fn, inst.target_fn, inst.vocab) == pytest.approx(bv, abs=1e-6)
    for shape in [TreeShape.iid(2, 2), TreeShape.delayed(1, 2, 1)]:
        limit = lp_limit(shape, inst.draft_fn, inst.target_fn, inst.vocab)
        for name, spec in REGISTRY.items():
            if spec.lossless and not spec.greedy_only and shape.law in spec.laws:
                assert block_efficiency(law_of(name, shape, inst)) <= limit + 1e-6, name


def _acceptance(name, k, inst):
    law = law_of(name, TreeShape.iid(k, 1), inst)
    return sum(prob for out, prob in law.items() if len(out) == 2)


def _specinfer_closed_form(p, q, k):  # DDTE App. C Alg. 9, restated in docs/algorithms.md §5
    rej, m = 1.0, torch.ones_like(p)
    for _ in range(k):
        r = float(torch.minimum(p, q).sum())
        rej *= 1 - r
        m = m * (1 - (q - p).clamp_min(0) / (1 - r))
        p = (p - q).clamp_min(0)
        p = p / p.sum()
    return (1 - rej) + rej * float((p * (1 - m)).sum())


def _spectr_closed_form(p, q, k):  # DDTE App. C Alg. 8, restated in docs/algorithms.md §5
    rho = spectr_rho(p, q, k)
    mins = torch.minimum(p / rho, q)
    beta = float(mins.sum())
    p_acc = 1 - (1 - beta) ** k
    res = (p - (p_acc / beta) * mins).clamp_min(0)
    res = res / res.sum()
    r = (q - p / rho).clamp_min(0) / (1 - beta)
    return p_acc + (1 - p_acc) * float((res * (1 - (1 - r) ** k)).sum())


@pytest.mark.parametrize("k", [2, 3])
@pytest.mark.parametrize("seed", [21, 22, 23])
def test_closed_form_node_acceptance(k, seed):
    inst = random_instance(seed, 4, zero_frac=0.0)
    p, q = inst.target_fn(()), inst.draft_fn(())
    nss = float((p * (1 - (1 - q) ** k)).sum())
    assert _acceptance("nss", k, inst) == pytest.approx(nss, abs=1e-12)
    assert _acceptance("specinfer", k, inst) == pytest.approx(_specinfer_closed_form(p, q, k), abs=1e-12)
    assert _acceptance("spectr", k, inst) == pytest.approx(_spectr_closed_form(p, q, k), abs=1e-9)


def test_spectr_rho_is_the_root_and_on_the_safe_side():
    for seed in range(20):
        inst = random_instance(seed, 6, zero_frac=0.2)
        p, q = inst.target_fn(()), inst.draft_fn(())
        for k in (2, 3, 4):
            rho = spectr_rho(p, q, k)
            beta = float(torch.minimum(p / rho, q).sum())
            f = 1 - (1 - beta) ** k - rho * beta
            assert 1.0 <= rho <= k
            assert f <= 1e-15  # any rho >= rho* is lossless: never below the root
            if rho > 1.0 + 1e-9:
                lower = rho - 1e-9
                beta_l = float(torch.minimum(p / lower, q).sum())
                assert 1 - (1 - beta_l) ** k - lower * beta_l > -1e-12  # and tight


@pytest.mark.parametrize("tail_prob", [0.15, 0.35])
def test_gbv_with_a_large_tail_is_still_exact(monkeypatch, tail_prob):
    """Exercise the tail ranking (tokens ranked by id below the head) through the exact test."""
    from adaptive_spec.analysis.exact import completed_tv
    from adaptive_spec.verifiers import gbv

    monkeypatch.setattr(gbv, "GBV_TAIL_PROB", tail_prob)
    for seed in range(8):
        inst = random_instance(300 + seed, 4, zero_frac=0.1)
        for shape in [TreeShape.iid(2, 2), TreeShape.delayed(1, 2, 1), TreeShape.iid(3, 1)]:
            law = output_law(gbv.verify_gbv, shape, inst.draft_fn, inst.target_fn)
            tv, mass = completed_tv(law, inst.target_fn, inst.vocab, shape.depth + 1)
            assert tv < 1e-9 and abs(mass - 1) < 1e-12


def test_gbv_rank_tuple_matches_rank_cdf_order():
    for seed in range(10):
        inst = random_instance(400 + seed, 6, zero_frac=0.2)
        p, q = inst.target_fn(()), inst.draft_fn(())
        cdf = rank_cdf(p, q, tail_prob=0.1)
        from adaptive_spec.verifiers.gbv import rank_tuple

        support = [t for t in range(6) if q[t] > 0]
        by_tuple = sorted(support, key=lambda t: rank_tuple(float(p[t]), float(q[t]), t, tail_prob=0.1))
        by_cdf = sorted(support, key=lambda t: float(cdf[t]))
        assert by_tuple == by_cdf


def test_spectr_bucketed_root_equals_the_sorted_root(monkeypatch):
    from adaptive_spec.verifiers import spectr

    gen = torch.Generator().manual_seed(0)
    for trial in range(6):
        logits = torch.randn(6000, generator=gen, dtype=torch.float64) * 2
        p = torch.softmax(logits, 0)
        q = torch.softmax(logits + torch.randn(6000, generator=gen, dtype=torch.float64) * (0.3 + trial / 3), 0)
        for k in (2, 3, 4):
            monkeypatch.setattr(spectr, "_SORT_LIMIT", 10**9)
            exact = spectr.spectr_rho(p, q, k)
            monkeypatch.setattr(spectr, "_SORT_LIMIT", 64)
            assert spectr.spectr_rho(p, q, k) == pytest.approx(exact, abs=1e-12)
