"""Offline labels against exact expectations on tiny trees."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch

from adaptive_spec.analysis.exact import target_rows, tree_law
from adaptive_spec.analysis.expected import expected_block_efficiency
from adaptive_spec.engine.logits import ProbsFn, SamplingConfig, build_logits_processor
from adaptive_spec.planner.latency import LatencyModel
from adaptive_spec.planner.plan import Plan
from adaptive_spec.records.forest import family_specs
from adaptive_spec.records.labeller import LabelConfig, Labeller
from adaptive_spec.trees import DraftLaw
from tests.helpers.profiles import synthetic_profile
from tests.helpers.tiny import tiny_model

V = 5
CONTEXT = [0, 3, 2]
PLANS = [
    "chain:2/token",
    "chain:2/block",
    "chain:1/traversal",
    "iid:2x2/specinfer",
    "iid:2x1/traversal",
    "iid:3x1/spectr",
    "delayed:1x2x1/gbv",
    "delayed:1x2x1/nss",
    "wor:2x1/rrsw",
    "wor:3/traversal",
]


@pytest.fixture(scope="module")
def pair():
    torch.manual_seed(0)
    target = tiny_model("llama", vocab=V, seed=1, init_range=0.4).eval()
    draft = tiny_model("llama", vocab=V, seed=2, init_range=0.4).eval()
    return target, draft


def _probs_fn(model, temperature):
    sampling = SamplingConfig(temperature)
    fn = ProbsFn(build_logits_processor(sampling.generation_config()), V, one_hot=False)

    @functools.cache
    @torch.inference_mode()
    def row(prefix: tuple[int, ...]) -> torch.Tensor:
        ids = torch.tensor([[*CONTEXT, *prefix]])
        return fn(model(input_ids=ids).logits[:, -1]).double()[0]

    return row


def _exact_label(plan: Plan, target, draft, temperature: float) -> float:
    return _exact_moments(plan, target, draft, temperature)[0]


def _exact_moments(plan: Plan, target, draft, temperature: float) -> tuple[float, float]:
    """The exact label (E over the drafting law of the per-tree E[τ+1]) and the variance of the per-tree value."""
    mean = second = 0.0
    draft_fn, target_fn = _probs_fn(draft, temperature), _probs_fn(target, temperature)
    for tree, prob in tree_law(plan.policy or plan.shape, draft_fn):
        value, exact = expected_block_efficiency(plan.verifier, tree, target_rows(tree, target_fn))
        assert exact
        mean += prob * value
        second += prob * value * value
    return mean, max(second - mean * mean, 0.0)


def test_family_specs_cover_every_plan():
    plans = [Plan.parse(p) for p in PLANS]
    kinds = [(s.law, s.trunk, s.paths, s.length, s.widths) for s in family_specs(plans)]
    assert kinds == [
        (DraftLaw.CHAIN, 0, 1, 2, ()),
        (DraftLaw.IID, 0, 3, 2, ()),
        (DraftLaw.DELAYED, 1, 2, 1, ()),
        (DraftLaw.WITHOUT_REPLACEMENT, 0, 1, 0, (3, 1)),
    ]


def test_labels_match_exact_expectations(pair):
    target, draft = pair
    plans = [Plan.parse(p) for p in PLANS]
    samples = 200
    labeller = Labeller(
        target, draft, plans, LatencyModel.from_profile(synthetic_profile()), V, LabelConfig(samples=samples)
    )
    be, times = labeller.label(CONTEXT, 1.0, 0, 1.0, seed=0)
    assert times.shape == (len(plans),) and (times > 0).all()
    for a, plan in enumerate(plans):
        exact, var = _exact_moments(plan, target, draft, 1.0)
        # Each label is a mean of `samples` independent per-tree expectations: 4.5 of its own standard errors.
        tol = 4.5 * np.sqrt(var / samples) + 1e-9
        assert be[a] == pytest.approx(exact, abs=tol), (str(plan), be[a], exact, tol)


def test_greedy_labels_are_exact_for_deterministic_drafts(pair):
    target, draft = pair
    plans = [Plan.parse(p) for p in ("chain:2/block", "wor:2x1/rrsw", "chain:1/token")]
    labeller = Labeller(target, draft, plans, LatencyModel.from_profile(synthetic_profile()), V, LabelConfig(samples=2))
    be, _ = labeller.label(CONTEXT, 0.0, 0, 1.0, seed=3)
    target_fn = _probs_fn(target, 1.0)
    draft_fn = _probs_fn(draft, 1.0)
    # Greedy chain: follow the draft's argmax while it equals the target's argmax.
    prefix, accepted = (), 0
    for _ in range(2):
        tok = int(draft_fn(prefix).argmax())
        if tok != int(target_fn(prefix).argmax()):
            break
        prefix, accepted = (*prefix, tok), accepted + 1
    assert be[0] == accepted + 1
    assert be[2] == min(accepted, 1) + 1
    # Greedy wor:2x1: the draft's top 2 at the root, then each one's argmax; the target's argmax path is
    # accepted as far as the tree holds it.
    top2 = draft_fn(()).topk(2).indices.tolist()
    first = int(target_fn(()).argmax())
    second = first in top2 and int(draft_fn((first,)).argmax()) == int(target_fn((first,)).argmax())
    assert be[1] == 1 + (first in top2) + second


def test_labels_are_reproducible(pair):
    target, draft = pair
    labeller = Labeller(
        target,
        draft,
        [Plan.parse(p) for p in PLANS],
        LatencyModel.from_profile(synthetic_profile()),
        V,
        LabelConfig(samples=3),
    )
    a, _ = labeller.label(CONTEXT, 0.7, 0, 0.9, seed=5)
    b, _ = labeller.label(CONTEXT, 0.7, 0, 0.9, seed=5)
    assert np.array_equal(a, b) and (a >= 1).all()


POLICIES = ["cum-chain:3:0.3/block", "conf-chain:3:0.45/block", "conf-chain:3:0.45/token"]


def test_chain_policy_labels_match_the_policys_exact_law(pair):
    """The labeller runs a chain policy along its drawn chain as the engine's drafter would:
    its labels converge to the exact expectation under the policy's own drafting law."""
    target, draft = pair
    plans = [Plan.parse(p) for p in ["chain:1/block", "chain:3/block", *POLICIES]]
    assert [s.length for s in family_specs(plans) if s.law is DraftLaw.CHAIN] == [3]  # one chain family for all
    samples = 300
    latency = LatencyModel.from_profile(synthetic_profile())
    labeller = Labeller(target, draft, plans, latency, V, LabelConfig(samples=samples))
    be, times = labeller.label(CONTEXT, 1.0, 0, 1.0, seed=0)
    for a, plan in enumerate(plans):
        exact, var = _exact_moments(plan, target, draft, 1.0)
        assert be[a] == pytest.approx(exact, abs=4.5 * np.sqrt(var / samples) + 1e-9), str(plan)
    # The policy's chains are between 1 and 3 tokens long, and so is their predicted time.
    lo, hi = times[0], times[1]
    assert all(lo <= t <= hi for t in times[2:]) and lo < hi


def test_chain_policies_that_always_or_never_feed_label_as_static_chains(pair):
    target, draft = pair
    plans = [Plan.parse(p) for p in ("chain:1/block", "chain:3/block", "cum-chain:3:0/block", "cum-chain:3:1/block")]
    labeller = Labeller(target, draft, plans, LatencyModel.from_profile(synthetic_profile()), V, LabelConfig(samples=4))
    for temperature in (0.0, 1.0):
        be, times = labeller.label(CONTEXT, temperature, 0, 1.0, seed=2)
        assert be[2] == be[1] and times[2] == pytest.approx(times[1])  # always fed: the whole chain
        assert be[3] == be[0] and times[3] == pytest.approx(times[0])  # never fed: one token


def test_the_labeller_refuses_tree_policies():
    with pytest.raises(ValueError, match="chain policies only"):
        family_specs([Plan.parse("conf-delayed:4:0.5:2/traversal")])
