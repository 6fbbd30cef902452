"""SpecInfer and RRSw on the rows' device for slot trees (``rrs_on_slots``): their laws, with one host read.

Every fed slot runs recursive rejection sampling at once and the walk runs on the host after one read. On
fixed slot trees (walkers that share a prefix, a dropped draw without replacement) the device path's
frequencies of (accepted node, emitted tokens) match the host solver's law, computed exactly by enumeration
on the same tree; a variant that forgets the residual after a rejection fails the same check.
"""

from __future__ import annotations

import pytest
import torch

import adaptive_spec.verifiers.rrs as rrs
from adaptive_spec.analysis.exact import completed_tv, fixed_tree_law, output_law
from adaptive_spec.analysis.instances import random_instance
from adaptive_spec.rng import TorchSampler
from adaptive_spec.trees import DraftLaw, DraftTree, TreeShape
from adaptive_spec.trees.slots import slot_layout
from adaptive_spec.verifiers import REGISTRY
from adaptive_spec.verifiers.rrsw import verify_rrsw
from adaptive_spec.verifiers.specinfer import verify_specinfer
from adaptive_spec.verifiers.walk import top_down_walk
from tests.helpers.reads import counted_reads
from tests.helpers.verifier_cases import cases_for

RUNS = 5000
V = 4


def _tv(a: dict, b: dict) -> float:
    return 0.5 * sum(abs(a.get(k, 0.0) - b.get(k, 0.0)) for k in set(a) | set(b))


def _case(shape: TreeShape, tokens: list[int], valid: list[bool]):
    """A slot tree with fixed draws, its draft rows and the target rows at its prefixes (a random instance)."""
    inst = random_instance(3, V, zero_frac=0.0)
    layout = slot_layout(shape, V)
    host = DraftTree.from_slots(layout, torch.tensor(tokens), torch.tensor(valid), torch.zeros(len(tokens), V))
    draft = torch.stack([inst.draft_fn(c) for c in host.prefixes]).float()
    target = torch.stack([inst.target_fn(c) for c in host.prefixes]).float()
    draft[layout.fed :] = 0  # leaves have no draft row

    def tree() -> DraftTree:  # a fresh tree (its tokens on the device, as the engine's)
        return DraftTree.from_slots(layout, torch.tensor(tokens), torch.tensor(valid), draft)

    return tree, target


def _no_residual(p, q, x, active, without_replacement):
    """A wrong ``rrs_states``: every candidate tried against ``p`` and ``q`` themselves, and ``Y`` from ``p``: the
    residual after a rejection is forgotten."""
    px, qx = p.gather(1, x).double(), q.to(p.dtype).gather(1, x).double()
    return torch.where(active & (qx > 0), px / qx.clamp_min(1e-300), 0.0).clamp_max(1.0), p.clone()


CASES = {
    # three walkers: walkers 0 and 2 share token 1 at the root, then draw 2 and 3 there; walker 1 draws 0
    "specinfer": (verify_specinfer, TreeShape.iid(3, 2), [-1, 1, 0, 1, 2, 1, 3], [True] * 7),
    # a trunk of one token, then two walkers that both draw token 0 (one node, drawn twice), then 3 and 1
    "specinfer-delayed": (verify_specinfer, TreeShape.delayed(1, 2, 2), [-1, 2, 0, 0, 3, 1], [True] * 6),
    # two distinct draws at the root, two under each; the second draw under node 2 did not happen
    "rrsw": (verify_rrsw, TreeShape.without_replacement((2, 2)), [-1, 1, 3, 0, 2, 3, 1], [True] * 6 + [False]),
}


@pytest.mark.parametrize("name", CASES)
def test_the_device_path_has_the_host_solvers_law_and_a_wrong_residual_fails(name, monkeypatch) -> None:
    verifier, shape, tokens, valid = CASES[name]
    tree, target = _case(shape, tokens, valid)
    exact = fixed_tree_law(verifier, tree(), target)  # the host solver, enumerated (an enumeration sampler)
    assert abs(sum(exact.values()) - 1.0) < 1e-6 and max(len(t) for _, t in exact) == shape.depth + 1

    def frequencies() -> dict:
        sampler, counts = TorchSampler(torch.Generator().manual_seed(0)), {}
        for _ in range(RUNS):
            r = verifier(tree(), target, sampler)
            counts[r.node, r.tokens] = counts.get((r.node, r.tokens), 0) + 1
            assert r.next_on_device is not None and int(r.next_on_device) == r.tokens[-1]
        return {k: v / RUNS for k, v in counts.items()}

    assert _tv(frequencies(), exact) < 0.035

    monkeypatch.setattr(rrs, "rrs_states", _no_residual)
    assert _tv(frequencies(), exact) > 0.06


def test_the_device_path_reads_the_host_once_with_the_ride() -> None:
    verifier, shape, tokens, valid = CASES["specinfer"]
    tree, target = _case(shape, tokens, valid)
    with counted_reads() as reads:
        t = tree()
        r = verifier(t, target, TorchSampler(torch.Generator().manual_seed(1)), ride=torch.tensor([7, 1]))
    assert len(reads) == 1 and r.ride == (7, 1) and t.tokens == tokens  # the tree's tokens and flags came along


def _policy_tree(seed: int, tokens, parents, child_draws, law: DraftLaw, **table):
    """A policy tree (no slots) with fixed draws, its draft rows and the target rows at its prefixes (a random
    instance); its tokens and ``table`` (the children or draws table) on the device, as the drafters hand them over.
    Leaves have no draft row."""
    inst = random_instance(seed, V, zero_frac=0.0)
    depths = [0] * len(parents)
    for i in range(1, len(parents)):
        depths[i] = depths[parents[i]] + 1
    shape = TreeShape.dynamic(law, max(depths), sum(map(len, child_draws)))
    ref = DraftTree(tokens, parents, depths, torch.zeros(len(tokens), V), child_draws, shape)
    draft = torch.stack([inst.draft_fn(c) for c in ref.prefixes]).float()
    target = torch.stack([inst.target_fn(c) for c in ref.prefixes]).float()
    draft[3:] = 0  # the leaves (nodes 3 on)

    def tree() -> DraftTree:
        t = DraftTree(tokens, parents, depths, draft, child_draws, shape)
        t.keep_tensors(tokens=torch.tensor(tokens), **{k: torch.tensor(v) for k, v in table.items()})
        return t

    return tree, target


def _policy_case():
    """Drawn without replacement: node 0 drew 1 then 3, node 1 drew 0 then 2, node 2 drew 1, node 3 none; its
    children table on the device (an instance where forgetting the residual shows)."""
    draws = [[1, 2], [3, 4], [5], [], [], []]
    children = [[1, 2], [3, 4], [5, 6], *[[6, 6]] * 3]
    return _policy_tree(1, [-1, 1, 3, 0, 2, 1], [-1, 0, 0, 1, 1, 2], draws, DraftLaw.DYNAMIC_WOR, children=children)


def _iid_policy_case():
    """Drawn i.i.d.: node 0 drew 1, 3, 1 (node 1 twice), node 1 drew 0, 0 (node 3 twice), node 2 drew 2, node 3
    none; its draws table on the device, as ``draft_eagle_iid_on_device`` hands it over."""
    draws = [[1, 2, 1], [3, 3], [4], [], []]
    table = [[1, 2, 1], [3, 3, 5], [4, 5, 5], *[[5] * 3] * 2]
    return _policy_tree(2, [-1, 1, 3, 0, 2], [-1, 0, 0, 1, 2], draws, DraftLaw.DYNAMIC_IID, draws=table)


def _chain_case():
    """A policy chain (node 0 drew 1, node 1 drew 0, node 2 drew 2): its children table on the device, as
    ``draft_chain_on_device`` hands it over; one draw a node, so SpecInfer takes it as its draws."""
    children = [[1], [2], [3], [4]]
    return _policy_tree(3, [-1, 1, 0, 2], [-1, 0, 1, 2], [[1], [2], [3], []], DraftLaw.DYNAMIC_CHAIN, children=children)


@pytest.mark.parametrize(
    ("case", "verifier"),
    [(_policy_case, verify_rrsw), (_iid_policy_case, verify_specinfer), (_chain_case, verify_specinfer)],
    ids=["rrsw", "specinfer", "specinfer-chain"],
)
def test_a_policy_tree_runs_its_verifier_on_the_device(monkeypatch, case, verifier) -> None:
    """RRSw on a tree drawn without replacement (its children table), SpecInfer on a tree drawn i.i.d. (its draws
    table: duplicates tried again, as the host walk tries them): the exact law of the host solver on the same tree,
    one host read; forgetting the residual fails."""
    tree, target = case()
    exact = fixed_tree_law(verifier, tree(), target)
    assert abs(sum(exact.values()) - 1.0) < 1e-6
    called = []
    real = rrs.rrs_on_children
    monkeypatch.setattr(rrs, "rrs_on_children", lambda *a, **k: called.append(k) or real(*a, **k))
    verifier(tree(), target, TorchSampler(torch.Generator().manual_seed(2)))
    assert not called  # a CPU walks on the host: solving every node's rows costs it more
    monkeypatch.setattr(rrs, "run_ahead", lambda device: True)  # as on an accelerator

    def frequencies() -> dict:
        sampler, counts = TorchSampler(torch.Generator().manual_seed(0)), {}
        for _ in range(RUNS):
            r = verifier(tree(), target, sampler)
            counts[r.node, r.tokens] = counts.get((r.node, r.tokens), 0) + 1
        return {k: v / RUNS for k, v in counts.items()}

    assert _tv(frequencies(), exact) < 0.035 and len(called) == RUNS
    distinct = verifier is verify_rrsw or case is _chain_case  # a chain's one draw a node: its children table
    assert all(k == {"without_replacement": distinct} for k in called)
    with counted_reads() as reads:
        verifier(tree(), target, TorchSampler(torch.Generator().manual_seed(1)))
    assert len(reads) == 1
    monkeypatch.setattr(rrs, "rrs_states", _no_residual)
    assert _tv(frequencies(), exact) > 0.06


def _states_solver(without_replacement: bool, states=rrs.rrs_states):
    """A node solver built on ``rrs_states``: each candidate flipped with the probability the states give it, in
    order, and ``Y`` from the residual they give: the device path's law, driven by the enumeration sampler."""

    def solver(p, q, candidates, sampler):
        x = torch.tensor([candidates])
        accept, residual = states(p[None], q[None], x, torch.ones_like(x, dtype=torch.bool), without_replacement)
        for j, token in enumerate(candidates):
            if sampler.flip(float(accept[0, j])):
                return token, False
        return sampler.categorical(residual[0]), False

    return solver


def _states_verifier(without_replacement: bool, states=rrs.rrs_states):
    solver = _states_solver(without_replacement, states)
    return lambda tree, target, sampler: top_down_walk(tree, target, sampler, solver, distinct=without_replacement)


@pytest.mark.parametrize(
    ("name", "law"),
    [(n, law) for n in ("specinfer", "rrsw") for law in sorted(REGISTRY[n].laws) if not law.dynamic],
    ids=lambda v: getattr(v, "value", v),
)
def test_the_device_states_have_the_exact_law(name, law) -> None:
    """``rrs_states`` (every node's acceptance probabilities and final residual, computed ahead in one form) gives
    the verifier's exact law on every static drafting law it accepts (TV < 1e-9)."""
    fn = _states_verifier(name == "rrsw")
    for inst, shape in cases_for(law, n_random=8):
        tv, mass = completed_tv(
            output_law(fn, shape, inst.draft_fn, inst.target_fn), inst.target_fn, inst.vocab, shape.depth + 1
        )
        assert abs(mass - 1.0) < 1e-12 and tv < 1e-9, (inst.name, str(shape), tv)


@pytest.mark.parametrize(
    ("name", "shape", "states"),
    [
        ("forgotten residual", TreeShape.iid(2, 2), _no_residual),
        ("draws without replacement taken as i.i.d.", TreeShape.without_replacement((2, 2)), None),
    ],
)
def test_wrong_device_states_are_caught(name, shape, states) -> None:
    if states is None:  # RRSw's trees verified by the states with replacement: the rejected token stays in q'
        fn = _states_verifier(True, lambda p, q, x, a, wor: rrs.rrs_states(p, q, x, a, False))
    else:
        fn = _states_verifier(False, states)
    tvs = []
    for seed in range(6):
        inst = random_instance(seed, 3, zero_frac=0.0)
        tvs.append(
            completed_tv(output_law(fn, shape, inst.draft_fn, inst.target_fn), inst.target_fn, 3, shape.depth + 1)[0]
        )
        if tvs[-1] > 1e-3:
            break
    assert max(tvs) > 1e-3, (name, tvs)
