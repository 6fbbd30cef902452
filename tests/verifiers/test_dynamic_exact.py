"""Exact losslessness on trees grown by a drafting policy, and the negative controls that must fail.

The enumerator runs the reference drafter (``sample_policy_tree``) under its chooser, so every
random decision of a policy is enumerated together with the draws (docs/algorithms.md §9).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pytest
import torch

from adaptive_spec.analysis.exact import completed_tv, output_law, tree_law
from adaptive_spec.analysis.instances import random_instance
from adaptive_spec.rng import Sampler
from adaptive_spec.trees import DraftLaw, DraftTree, TreeShape, sample_policy_tree
from adaptive_spec.trees.draw import _Builder
from adaptive_spec.trees.policy import ConfidenceChain, DraftPolicy, FixedShapePolicy, NodeView, PolicyContext
from adaptive_spec.verifiers import REGISTRY
from adaptive_spec.verifiers.registry import IncompatibleTreeError, check_compatible
from adaptive_spec.verifiers.token import verify_token
from tests.helpers.dynamic_cases import DYNAMIC_LAWS, dynamic_cases
from tests.helpers.verifier_cases import instance_for

TV_TOL = 1e-9


def dynamic_pairs() -> list[tuple[str, DraftLaw]]:
    return [(name, law) for name, spec in REGISTRY.items() if spec.lossless for law in DYNAMIC_LAWS if law in spec.laws]


@pytest.mark.parametrize(("name", "law"), dynamic_pairs(), ids=lambda x: getattr(x, "value", x))
def test_completed_output_law_equals_target_on_policy_trees(name, law):
    fn = REGISTRY[name].fn
    cases = dynamic_cases(law)
    assert len(cases) >= 51
    for base, policy in cases:
        inst = instance_for(name, base)
        out = output_law(fn, policy, inst.draft_fn, inst.target_fn)
        tv, mass = completed_tv(out, inst.target_fn, inst.vocab, policy.depth + 1)
        assert abs(mass - 1.0) < 1e-12, (inst.name, str(policy), mass)
        assert tv < TV_TOL, (name, inst.name, str(policy), tv)


def test_every_dynamic_law_has_verifiers_and_gbv_is_refused():
    for law in DYNAMIC_LAWS:
        assert any(law in s.laws and s.lossless and not s.greedy_only for s in REGISTRY.values())
    with pytest.raises(
        IncompatibleTreeError,
        match=r"'gbv' is not lossless for trees drafted as 'dynamic_iid'.*"
        r"traversal",
    ):
        check_compatible("gbv", DraftLaw.DYNAMIC_IID)


def _lossy_somewhere(verifier, drafter, n: int = 12, depth: int = 2) -> float:
    worst = 0.0
    for i in range(n):
        inst = random_instance(9100 + i, 2 + i % 2)
        out = output_law(verifier, drafter, inst.draft_fn, inst.target_fn)
        tv, mass = completed_tv(out, inst.target_fn, inst.vocab, depth + 1)
        assert abs(mass - 1.0) < 1e-12
        worst = max(worst, tv)
    return worst


def test_gbv_is_lossy_on_policy_trees():
    """Why GBV is refused for dynamic trees: its skewed law assumes K fixed i.i.d. paths."""
    from tests.helpers.dynamic_cases import RandomPolicy

    pol = RandomPolicy(depth=2, budget=3, kind=DraftLaw.DYNAMIC_IID)

    def gbv_as_if_iid(tree, probs, sampler):
        shaped = DraftTree(
            tree.tokens, tree.parents, tree.depths, tree.draft_probs, tree.child_draws, TreeShape.iid(2, 2)
        )
        return REGISTRY["gbv"].fn(shaped, probs, sampler)

    worst = 0.0
    for i in range(12):
        inst = random_instance(9200 + i, 2)
        out = output_law(gbv_as_if_iid, pol, inst.draft_fn, inst.target_fn)
        worst = max(worst, completed_tv(out, inst.target_fn, inst.vocab, 3)[0])
    assert worst > 1e-4, worst


def test_fixed_shape_policies_have_the_static_law():
    """A static shape run as a policy draws exactly the trees the static drafter draws."""
    for shape in (
        TreeShape.chain(2),
        TreeShape.delayed(1, 2, 1),
        TreeShape.iid(2, 2),
        TreeShape.without_replacement((2, 1)),
    ):
        inst = random_instance(42, 3)

        def key(tree: DraftTree) -> tuple:
            return tuple(tuple(tree.tokens[c] for c in draws) for draws in _by_prefix(tree))

        static = {}
        for tree, p in tree_law(shape, inst.draft_fn):
            static[key(tree)] = static.get(key(tree), 0.0) + p
        dynamic = {}
        for tree, p in tree_law(FixedShapePolicy(shape), inst.draft_fn):
            dynamic[key(tree)] = dynamic.get(key(tree), 0.0) + p
        assert static.keys() == dynamic.keys()
        assert max(abs(static[k] - dynamic[k]) for k in static) < 1e-12


def _by_prefix(tree: DraftTree) -> list[list[int]]:
    """Child draws listed by prefix in lexicographic order (node numbering differs between drafters)."""
    order = sorted(range(tree.num_nodes), key=lambda i: tree.prefixes[i])
    return [tree.child_draws[i] for i in order]


# --------------------------------------------------------------------------- negative controls
@dataclass(frozen=True)
class TargetPeekingChain(DraftPolicy):
    """Extends a chain while the *target* likes the token: not draft-side, so lossy."""

    target_fn: object = None

    def feed(self, views: Sequence[NodeView], ctx: PolicyContext, sampler: Sampler) -> list[bool]:
        out = []
        for v in views:
            prefix = self._prefixes.get(v.parent, ()) + (v.token,)
            self._prefixes[v.node] = prefix
            out.append(float(self.target_fn(prefix[:-1])[v.token]) >= 0.5)
        return out

    def widths(self, views: Sequence[NodeView], ctx: PolicyContext, sampler: Sampler) -> list[int]:
        if views and views[0].node == 0:
            self._prefixes.clear()
        return [1] * len(views)

    @property
    def _prefixes(self) -> dict:
        if "_pre" not in self.__dict__:
            object.__setattr__(self, "_pre", {})
        return self.__dict__["_pre"]


def test_target_probabilities_of_drafted_tokens_are_context_and_stay_exact():
    """A finding, kept as a test: a rule that reads the target's probability of a token already on the
    path is a function of the drafted tokens (the target is a fixed function of the context), so it
    is a draft-side rule in disguise, and exact."""
    worst = 0.0
    for i in range(12):
        inst = random_instance(9300 + i, 2 + i % 2)
        pol = TargetPeekingChain(depth=2, budget=2, target_fn=inst.target_fn)
        for name in ("token", "block", "traversal"):
            out = output_law(REGISTRY[name].fn, pol, inst.draft_fn, inst.target_fn)
            worst = max(worst, completed_tv(out, inst.target_fn, inst.vocab, 3)[0])
    assert worst < TV_TOL


def _vetted_chain(inst, keep, depth: int = 2):
    """Draws a candidate child, then keeps it only if ``keep(prefix, row, token)``: decided after seeing it."""

    def program(sampler: Sampler) -> DraftTree:
        b = _Builder(inst.draft_fn, sampler)
        node = 0
        for _ in range(depth):
            row = b.row(node)
            token = sampler.categorical(row)
            if not keep(b.prefixes[node], row, token):
                break
            node = b.add(node, token)  # the kept candidate: no new choice for the enumerator
        return b.finish(TreeShape.dynamic(DraftLaw.DYNAMIC_CHAIN, depth, depth))

    return program


def _target_vetted_chain(inst):
    """Keeps a candidate only if the *target* rates it at least as the draft does."""
    return _vetted_chain(inst, lambda prefix, row, t: float(inst.target_fn(prefix)[t]) >= float(row[t]))


def _posthoc_chain(inst, threshold: float):
    """Keeps a candidate only if its draft probability is at least ``threshold``."""
    return _vetted_chain(inst, lambda prefix, row, t: float(row[t]) >= threshold)


def test_negative_control_policy_that_looks_at_the_target():
    """A policy that reads the target's probability of a candidate before keeping it is lossy: caught."""
    worst = 0.0
    for i in range(12):
        inst = random_instance(9300 + i, 2 + i % 2)
        for name in ("token", "block", "traversal"):
            out = output_law(REGISTRY[name].fn, _target_vetted_chain(inst), inst.draft_fn, inst.target_fn)
            worst = max(worst, completed_tv(out, inst.target_fn, inst.vocab, 3)[0])
    assert worst > 1e-3, worst
    # The same rule on the draft's own probability is exact (the contrast that makes the control meaningful).
    for i in range(6):
        inst = random_instance(9300 + i, 2 + i % 2)
        out = output_law(verify_token, ConfidenceChain(depth=2, threshold=0.5), inst.draft_fn, inst.target_fn)
        assert completed_tv(out, inst.target_fn, inst.vocab, 3)[0] < TV_TOL


def test_negative_control_verifier_chosen_after_drafting():
    """Two verifiers, each lossless for i.i.d. trees, picked after seeing the tree: the mixture is not."""

    def chosen_after(tree, probs, sampler):
        draws = [tree.tokens[c] for c in tree.child_draws[0]]
        name = "traversal" if len(set(draws)) == len(draws) else "gbv"  # distinct root draws or not
        return REGISTRY[name].fn(tree, probs, sampler)

    worst = _lossy_somewhere(chosen_after, TreeShape.iid(2, 2), n=8)
    assert worst > 1e-2, worst
    for name in ("traversal", "gbv"):  # each on its own is exact on the same instances
        assert _lossy_somewhere(REGISTRY[name].fn, TreeShape.iid(2, 2), n=4) < TV_TOL

    # Not every such mixture is lossy: picking between token-level and block verification by the
    # first drafted token of a chain happens to stay exact (each is exact given that token).
    def by_first_token(tree, probs, sampler):
        return REGISTRY["block" if tree.tokens[1] == 0 else "token"].fn(tree, probs, sampler)

    assert _lossy_somewhere(by_first_token, TreeShape.chain(2), n=4) < TV_TOL


def test_negative_control_child_count_decided_after_seeing_the_children():
    worst = 0.0
    for i in range(12):
        inst = random_instance(9400 + i, 2 + i % 2)
        for name in ("token", "traversal"):
            out = output_law(REGISTRY[name].fn, _posthoc_chain(inst, 0.5), inst.draft_fn, inst.target_fn)
            worst = max(worst, completed_tv(out, inst.target_fn, inst.vocab, 3)[0])
    assert worst > 1e-3, worst


def test_policy_trees_respect_depth_budget_and_law():
    inst = random_instance(5, 3)
    gen = torch.Generator().manual_seed(0)
    from tests.helpers.dynamic_cases import policies_for

    for law in DYNAMIC_LAWS:
        for pol in policies_for(law):
            for _ in range(20):
                tree = sample_policy_tree(pol, inst.draft_fn, gen)
                assert tree.law is law
                assert tree.max_depth <= pol.depth
                assert sum(len(d) for d in tree.child_draws) <= pol.budget
                if law is DraftLaw.DYNAMIC_CHAIN:
                    assert all(len(d) <= 1 for d in tree.child_draws)
                if law is DraftLaw.DYNAMIC_WOR:
                    assert all(len(set(d)) == len(d) for d in tree.child_draws)


def test_learned_chains_of_the_exact_cases_vary_their_length():
    """The learned-chain cases are not degenerate: on the exact instances they stop at several depths."""
    from adaptive_spec.trees.policy import LearnedChain

    gen = torch.Generator().manual_seed(0)
    depths: dict[str, set[int]] = {}
    for inst, pol in dynamic_cases(DraftLaw.DYNAMIC_CHAIN):
        if isinstance(pol, LearnedChain):
            for _ in range(10):
                depths.setdefault(str(pol), set()).add(sample_policy_tree(pol, inst.draft_fn, gen).max_depth)
    assert len(depths) == 2
    assert all(len(d) >= 2 for d in depths.values()), depths
