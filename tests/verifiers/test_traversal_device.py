"""Traversal on the rows' device (``traversal_on_device``): its law, exactly, and its one host read.

The device path computes every node's weight when it is tested and the row it emits from
(``traversal_states``, no read), then flips one uniform per node and takes the first flagged node in
post-order. Driving the same post-order walk with an enumeration sampler's flips and draws
(:func:`_states_program`) gives that law exactly, so it is held to the exact test of every drafting law
traversal accepts (TV < 1e-9), with the reference's negative control (the rejected token left in ``Ms``)
caught by the same harness. A slot tree's levels, built on the device from its layout, give the same states
as the host's levels of the merged tree; and the device path itself reads the host once, with frequencies
that match the exact law. It is an accelerator's path: a CPU runs it within ``accelerator_path_on_cpu``.
"""

from __future__ import annotations

import pytest
import torch

from adaptive_spec.analysis.exact import completed_tv, fixed_tree_law, output_law
from adaptive_spec.analysis.instances import random_instance
from adaptive_spec.rng import TorchSampler, accelerator_path_on_cpu
from adaptive_spec.trees import DraftLaw, DraftTree, TreeShape
from adaptive_spec.trees.slots import slot_layout
from adaptive_spec.verifiers import REGISTRY
from adaptive_spec.verifiers.base import result_for
from adaptive_spec.verifiers.traversal import traversal_on_device, traversal_states, verify_traversal
from tests.helpers.reads import counted_reads
from tests.helpers.verifier_cases import cases_for

TV_TOL = 1e-9
CAUGHT = 1e-3


def _states_program(zero_rejected: bool = True):
    """The device path's law, with the sampler's flips: the nodes in post-order, each accepted with its weight."""

    def verify(tree: DraftTree, target_probs: torch.Tensor, sampler):
        w, rows = _states(tree, target_probs, zero_rejected)
        w = w.tolist()
        order: list[int] = []

        def post(node: int) -> None:
            for c in tree.children[node]:
                post(c)
            order.append(node)

        post(0)
        node = next(n for n in order if n == 0 or sampler.flip(w[n]))
        return result_for(tree, node, sampler.categorical(rows[node]), not tree.children[node])

    return verify


def _states(tree: DraftTree, target_probs: torch.Tensor, zero_rejected: bool = True):
    """``traversal_states`` as (weights [N], the row each node emits from [N, V])."""
    w, residuals, pos = traversal_states(tree, target_probs, zero_rejected=zero_rejected)
    n = tree.num_nodes
    rows = target_probs.clone()
    parent = pos[:n] >= 0
    rows[parent] = residuals[pos[:n][parent]]
    return w[:n], rows


TRAVERSAL_LAWS = sorted(law for law in REGISTRY["traversal"].laws if not law.dynamic)


@pytest.mark.parametrize("law", TRAVERSAL_LAWS, ids=lambda x: x.value)
def test_the_device_states_have_the_exact_law(law) -> None:
    fn = _states_program()
    cases = cases_for(law, n_random=12)
    for inst, shape in cases:
        law_out = output_law(fn, shape, inst.draft_fn, inst.target_fn)
        tv, mass = completed_tv(law_out, inst.target_fn, inst.vocab, shape.depth + 1)
        assert abs(mass - 1.0) < 1e-12 and tv < TV_TOL, (inst.name, str(shape), tv)


@pytest.mark.parametrize("shape", [TreeShape.iid(2, 2), TreeShape.without_replacement((2, 2))], ids=str)
def test_the_device_states_without_zeroing_the_rejected_token_are_caught(shape) -> None:
    fn = _states_program(zero_rejected=False)
    tvs = []
    for seed in range(6):
        inst = random_instance(seed, 3, zero_frac=0.0)
        tv, _ = completed_tv(output_law(fn, shape, inst.draft_fn, inst.target_fn), inst.target_fn, 3, shape.depth + 1)
        tvs.append(tv)
        if tv > CAUGHT:
            break
    assert max(tvs) > CAUGHT, tvs


V = 4
# (shape, slot tokens, validity): walkers sharing prefixes, a trunk, a dropped draw without replacement
SLOT_TREES = [
    (TreeShape.iid(3, 2), [-1, 1, 0, 1, 2, 1, 3], [True] * 7),
    (TreeShape.iid(3, 3), [-1, 1, 1, 1, 2, 2, 3, 0, 1, 0], [True] * 10),
    (TreeShape.delayed(1, 2, 2), [-1, 2, 0, 0, 3, 1], [True] * 6),
    (TreeShape.delayed(1, 3, 2), [-1, 2, 0, 1, 0, 3, 3, 3], [True] * 8),
    (TreeShape.without_replacement((2, 2)), [-1, 1, 3, 0, 2, 3, 1], [True] * 6 + [False]),
    (TreeShape.without_replacement((2, 2)), [-1, 1, 3, 0, 2, 3, 1], [True, True, False, True, True, True, True]),
]


def _slot_case(shape: TreeShape, tokens: list[int], valid: list[bool], seed: int = 3, device: str = "cpu"):
    inst = random_instance(seed, V, zero_frac=0.2)
    layout = slot_layout(shape, V)
    host = DraftTree.from_slots(layout, torch.tensor(tokens), torch.tensor(valid), torch.zeros(len(tokens), V))
    draft = torch.stack([inst.draft_fn(c) for c in host.prefixes]).float()
    target = torch.stack([inst.target_fn(c) for c in host.prefixes]).float()
    draft[layout.fed :] = 0  # leaves have no draft row

    def tree() -> DraftTree:  # a fresh tree, its tokens and validity on the device as the engine's
        d = torch.device(device)
        return DraftTree.from_slots(layout, torch.tensor(tokens, device=d), torch.tensor(valid, device=d), draft.to(d))

    return tree, target


@pytest.mark.parametrize("case", range(len(SLOT_TREES)))
def test_a_slot_trees_device_levels_give_the_host_levels_states(case) -> None:
    tree, target = _slot_case(*SLOT_TREES[case])
    on_device = tree()
    w_dev, rows_dev = _states(on_device, target)  # levels from the layout, tokens unread
    assert not on_device.tokens_on_host
    on_host = tree()
    assert len(on_host.tokens) == on_host.num_nodes  # read: levels built on the host from the merged tree
    w_host, rows_host = _states(on_host, target)
    used = torch.tensor(on_host.used)
    assert torch.equal(w_dev[used], w_host[used]) and torch.equal(rows_dev[used], rows_host[used])
    assert (w_host[used] < 1).any()  # the case tests something: some weight is below 1


@pytest.mark.parametrize("case", [2, 4])
def test_the_device_path_reads_once_and_has_the_exact_law(case) -> None:
    runs = 2500
    tree, target = _slot_case(*SLOT_TREES[case])
    exact = fixed_tree_law(verify_traversal, tree(), target)  # the host reference, enumerated
    sampler, counts = TorchSampler(torch.Generator().manual_seed(0)), {}
    for _ in range(runs):
        t = tree()
        with counted_reads() as reads, accelerator_path_on_cpu():
            r = verify_traversal(t, target, sampler, ride=torch.tensor([5]))
        assert len(reads) == 1 and r.ride == (5,) and int(r.next_on_device) == r.tokens[-1]
        counts[r.node, r.tokens] = counts.get((r.node, r.tokens), 0) + 1
    tv = 0.5 * sum(abs(counts.get(k, 0) / runs - exact.get(k, 0.0)) for k in set(counts) | set(exact))
    assert tv < 0.05
    gen, bad = torch.Generator().manual_seed(0), {}
    if case == 2:  # a node with two children: forgetting the rejected token moves the law
        for _ in range(runs):
            r = traversal_on_device(tree(), target, gen, zero_rejected=False)
            bad[r.node, r.tokens] = bad.get((r.node, r.tokens), 0) + 1
        bad_tv = 0.5 * sum(abs(bad.get(k, 0) / runs - exact.get(k, 0.0)) for k in set(bad) | set(exact))
        assert bad_tv > 0.06


def test_a_host_tree_costs_one_copy_and_one_read() -> None:
    inst = random_instance(5, 4, zero_frac=0.0)
    from adaptive_spec.trees import sample_tree

    tree = sample_tree(TreeShape.without_replacement((2, 2)), inst.draft_fn, TorchSampler(torch.Generator()))
    target = torch.stack([inst.target_fn(c) for c in tree.prefixes]).float()
    assert tree.law is DraftLaw.WITHOUT_REPLACEMENT and max(map(len, tree.children)) == 2
    with counted_reads() as reads, accelerator_path_on_cpu():
        verify_traversal(tree, target, TorchSampler(torch.Generator().manual_seed(2)))
    assert len(reads) == 1
    with counted_reads() as lazy:  # a CPU's own path: the lazy walk, a read first and one per rejection
        r = verify_traversal(tree, target, TorchSampler(torch.Generator().manual_seed(2)))
    assert len(lazy) >= 1 + (r.node == 0)


def test_a_tree_numbered_depth_by_depth_takes_its_levels_from_its_children_table_with_no_copy(monkeypatch) -> None:
    """A policy-grown tree hands over its tokens and children table: traversal's levels are slices, same states."""
    inst = random_instance(7, V, zero_frac=0.0)
    parents, tokens = [-1, 0, 0, 1, 1, 2, 3], [-1, 1, 3, 0, 2, 1, 3]  # depth by depth; node 2 has one child
    depths = [0, 1, 1, 2, 2, 2, 3]
    draws = [[c for c in range(7) if parents[c] == i] for i in range(7)]
    prefixes = [()]
    for i in range(1, 7):
        prefixes.append(prefixes[parents[i]] + (tokens[i],))
    draft = torch.stack([inst.draft_fn(c) for c in prefixes]).float()
    target = torch.stack([inst.target_fn(c) for c in prefixes]).float()

    def tree() -> DraftTree:
        return DraftTree(tokens, parents, depths, draft, draws, TreeShape.without_replacement((2, 2, 1)))

    import adaptive_spec.verifiers.traversal as traversal

    kept = tree()
    kept.keep_tensors(tokens=torch.tensor(tokens), children=torch.tensor(kept.children_rows()))
    sliced, real = [], traversal._range_levels
    monkeypatch.setattr(traversal, "_range_levels", lambda t, d: sliced.append(t) or real(t, d))
    copies = []
    monkeypatch.setattr(traversal.torch, "tensor", lambda *a, **k: copies.append(a) or torch.as_tensor(*a, **k))
    with counted_reads() as reads:
        w_kept, rows_kept = _states(kept, target)
    assert sliced == [kept] and reads == [] and copies == []  # slices of the kept tensors: no copy, no read
    monkeypatch.undo()
    w_host, rows_host = _states(tree(), target)  # levels packed on the host and copied
    assert torch.equal(w_kept, w_host) and torch.equal(rows_kept, rows_host) and (w_host < 1).any()
