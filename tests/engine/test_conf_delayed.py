"""Confidence-delayed trees (``conf-delayed``) drafted as a trunk read level by level, then slots
(``engine.drafting.draft_conf_delayed``).

Along the trunk the policy reads each fed node's top-1; from the first node where it drops below the threshold
(with ``branch_threshold`` 0 and the default budget) the policy's law is the static ``delayed(t, paths, D − t)``
shape's, so the rest is drafted into that shape's slots with no host read. Checked here: the trunk stops exactly
where the draft's rows say (every trunk node confident, the branch node not), the tree is that shape's, the host
reads are one per trunk decision, and at T = 0 the trunk is the host drafter's. The engine's output law on this
path is checked by tests/engine/test_lossless.py (``conf-delayed`` is its dynamic i.i.d. law, every verifier).
"""

from __future__ import annotations

import collections

import pytest
import torch
from transformers import LogitsProcessorList

from adaptive_spec.engine.drafting import delayed_on_slots, draft_policy_tree, draft_root
from adaptive_spec.engine.logits import ProbsFn
from adaptive_spec.engine.runner import ModelRunner
from adaptive_spec.trees import TreeShape
from adaptive_spec.trees.policy import ConfidenceDelayed, parse_policy
from tests.helpers.reads import counted_reads
from tests.helpers.tiny import tiny_model

V = 12
CONTEXT = [0, 2, 1, 5, 7]


def _grow(model, policy, seed: int, deterministic: bool, on_device=None, look=None):
    runner = ModelRunner(model)
    if look is not None:
        runner.chain_look[str(policy)] = collections.deque([look])
    probs_fn = ProbsFn(LogitsProcessorList(), V, one_hot=False)
    g = torch.Generator().manual_seed(seed)
    with torch.inference_mode():
        runner.chain_forward(torch.tensor(CONTEXT[:-1]), logits_to_keep=1)
        root = draft_root(runner, torch.tensor(CONTEXT[-1:]), probs_fn)
        with counted_reads() as reads:
            out = draft_policy_tree(runner, root, policy, probs_fn, g, deterministic, on_device=on_device)
    return out, reads


@pytest.fixture(scope="module")
def model():
    return tiny_model("llama", vocab=V, hidden=16, eos=None, init_range=0.5, seed=5, layers=1)


def test_which_policies_take_the_slots() -> None:
    assert delayed_on_slots(parse_policy("conf-delayed:4:0.5:3"))
    assert not delayed_on_slots(parse_policy("conf-delayed:4:0.5:3:0.2"))  # paths that may stop: the host's on a CPU
    assert delayed_on_slots(parse_policy("conf-delayed:4:0.5:3:0.2"), device_path=True)  # flags on the device's path
    cut = ConfidenceDelayed(depth=4, budget=5, threshold=0.5, paths=3, branch_threshold=0.2)
    assert not delayed_on_slots(cut, device_path=True)  # a budget that cuts the paths: the host's
    assert not delayed_on_slots(parse_policy("conf-delayed:4:0.5:1"))  # one path: a chain
    assert not delayed_on_slots(parse_policy("conf-chain:4:0.5"))


@pytest.mark.parametrize("threshold", [0.05, 0.2, 0.3, 0.5, 0.99])
def test_the_trunk_stops_where_the_rows_say_and_the_rest_is_the_delayed_shape(model, threshold) -> None:
    depth, paths = 4, 3
    policy = parse_policy(f"conf-delayed:{depth}:{threshold}:{paths}")
    trunks = set()
    for seed in range(6):
        out, reads = _grow(model, policy, seed, deterministic=False)
        tree = out.tree
        top1 = tree.draft_probs.max(dim=-1).values.tolist()  # slot d <= t is trunk node d (the root's row first)
        t = next((d for d in range(depth) if top1[d] < threshold), depth)
        trunks.add(t)
        assert tree.shape == TreeShape.delayed(t, paths, depth - t)
        assert all(top1[d] >= threshold for d in range(t))
        assert len(reads) == min(t + 1, depth)  # one read per trunk decision; none for the paths
        assert out.policy_levels == min(t + 1, depth)
        if t < depth:
            assert tree.slots is not None and tree.num_nodes == 1 + t + paths * (depth - t)
            assert len(tree.child_draws[t]) == paths  # the branch node: the paths' i.i.d. draws (the tree read)
            assert all(len(tree.child_draws[d]) == 1 for d in range(t))  # the trunk: one child each
        else:
            assert tree.num_nodes == depth + 1 and tree.slots is None  # confident to the end: a chain
    if threshold == 0.99:
        assert trunks == {0}  # every root row is below 0.99: an iid(paths, depth) tree at once
    if threshold == 0.05:
        assert trunks == {depth}


def test_at_t0_the_trunk_is_the_host_drafters(model) -> None:
    """Deterministic drafting takes each trunk node's argmax on both paths: the same trunk, the same branch point."""
    for threshold in (0.2, 0.3, 0.4):
        policy = parse_policy(f"conf-delayed:4:{threshold}:2")
        slots, _ = _grow(model, policy, 0, deterministic=True)
        host, _ = _grow(model, policy, 0, deterministic=True, on_device=False)
        assert host.tree.slots is None  # the host drafter, a read and a copy per level
        node, trunk = 0, []
        while len(host.tree.child_draws[node]) == 1:  # the host tree's trunk: nodes with one draw
            node = host.tree.child_draws[node][0]
            trunk.append(host.tree.tokens[node])
        t = len(trunk)
        assert slots.tree.shape == TreeShape.delayed(t, 2, 4 - t)
        assert slots.tree.tokens[1 : t + 1] == trunk


def test_the_trunk_continues_at_the_threshold_and_branches_just_above_it(model) -> None:
    """The policy's rule is ``top-1 >= threshold``: a threshold at the root row's top-1 continues the trunk, one
    just above it branches at the root (an ``iid`` tree); and the same at the first trunk node's row."""
    probe, _ = _grow(model, parse_policy("conf-delayed:3:0.0:2"), 0, deterministic=True)  # a chain: every row
    top1 = probe.tree.draft_probs.max(dim=-1).values.double().tolist()
    checked = 0
    for depth_at, value in enumerate(top1[:2]):
        at = float(torch.tensor(value, dtype=torch.float64))
        above = float(torch.nextafter(torch.tensor(at, dtype=torch.float64), torch.tensor(2.0, dtype=torch.float64)))
        lower = min(top1[:depth_at], default=1.0)  # every row before this one stays at or above the threshold
        if lower < above:
            continue
        on, _ = _grow(model, parse_policy(f"conf-delayed:3:{at!r}:2"), 0, deterministic=True)
        off, _ = _grow(model, parse_policy(f"conf-delayed:3:{above!r}:2"), 0, deterministic=True)
        assert on.tree.shape.depth == 3 and off.tree.shape == TreeShape.delayed(depth_at, 2, 3 - depth_at)
        assert on.tree.shape != off.tree.shape
        checked += 1
    assert checked >= 1  # the root's row at least


@pytest.mark.parametrize("temperature", [1.0, 0.0])
def test_on_an_accelerator_the_trunk_is_read_once_at_its_look(model, temperature) -> None:
    """The trunk decided on the device (``on_device=True``: the accelerator's path), read once after ``look``
    decisions: it branches where the host-read trunk does when that is before the look, else at the look (the tree
    of ``LookedDelayed(policy, look)``); at T = 0, where the trunk draws nothing at random, the very same tree."""
    depth, paths = 4, 3
    before = set()
    for threshold in (0.6, 0.7, 0.72, 0.99):  # trunks of 4, 3, 0 and 0 nodes with this model
        policy = parse_policy(f"conf-delayed:{depth}:{threshold}:{paths}")
        for seed in range(3):
            host, _ = _grow(model, policy, seed, deterministic=temperature == 0)
            top1 = host.tree.draft_probs.max(dim=-1).values.tolist()  # slot d <= t is trunk node d
            t_host = next((d for d in range(depth) if top1[d] < threshold), depth)
            for look in range(1, depth):
                dev, reads = _grow(model, policy, seed, deterministic=temperature == 0, on_device=True, look=look)
                t = min(t_host, look)
                before.add(t_host < look)
                assert len(reads) == 1  # the trunk's one read; none for the paths
                assert dev.tree.shape == TreeShape.delayed(t, paths, depth - t) and dev.policy_levels == t + 1
                assert dev.tree.num_nodes == 1 + t + paths * (depth - t)
                if t_host < look:  # branched before the look: the host-read trunk, its later nodes' rows undone
                    assert dev.tree.tokens[1 : t + 1] == host.tree.tokens[1 : t + 1]
                    if temperature == 0:
                        assert dev.tree.tokens == host.tree.tokens
                        assert torch.equal(dev.tree.draft_probs, host.tree.draft_probs)
    assert before == {True, False}  # both cases met


@pytest.mark.parametrize("temperature", [1.0, 0.0])
def test_on_an_accelerator_paths_that_may_stop_are_the_policys_with_one_read(model, temperature) -> None:
    """``conf-delayed`` with a ``branch_threshold`` on the device's path: the paths drafted into the slots, each path
    node fed (given children) exactly when the row its token was drawn from has a top-1 of at least the threshold
    (the policy's ``feed``), with as many draws as paths stand on it, and no read for the paths."""
    depth, paths = 4, 3
    fed_seen, cut_seen = 0, 0
    for branch in (0.7, 0.85, 0.95):
        policy = parse_policy(f"conf-delayed:{depth}:0.7:{paths}:{branch}")
        for seed in range(4):
            for look in (1, 2):
                out, reads = _grow(model, policy, seed, temperature == 0, on_device=True, look=look)
                tree = out.tree
                assert len(reads) == 1  # the trunk's one read; none for the paths
                t = out.policy_levels - 1
                assert tree.shape == TreeShape.delayed(t, paths, depth - t)
                top1 = tree.draft_probs.max(dim=-1).values.double().tolist()
                assert all(len(tree.child_draws[d]) == 1 for d in range(t)) and len(tree.child_draws[t]) == paths
                for v in range(t + 1, tree.num_nodes):
                    if not tree.used[v]:
                        continue
                    par = tree.parents[v]
                    fed = tree.depths[v] < depth and top1[par] >= branch
                    assert bool(tree.child_draws[v]) == fed, (branch, seed, look, v)
                    if fed:  # one draw per path standing on it
                        assert len(tree.child_draws[v]) == tree.child_draws[par].count(v)
                    fed_seen += fed
                    cut_seen += tree.depths[v] < depth and not fed
    assert fed_seen and cut_seen, (fed_seen, cut_seen)  # paths that went on and paths that stopped


def test_on_an_accelerator_a_path_goes_on_at_the_branch_threshold_and_stops_just_above_it(model) -> None:
    """The rule is ``top-1 >= branch_threshold``: the draws do not depend on it (the same seed and look draw the same
    slots), so a path node fed at a threshold equal to its parent row's top-1 has no children one float above."""
    checked = 0
    for seed in range(4):
        probe, _ = _grow(model, parse_policy("conf-delayed:4:0.7:3:1e-9"), seed, False, on_device=True, look=1)
        tree, t = probe.tree, probe.policy_levels - 1
        top1 = tree.draft_probs.max(dim=-1).values.double()
        for v in range(t + 2, tree.num_nodes):  # a path node below the branch node's children, not a leaf
            if not tree.used[v] or tree.depths[v] >= 4:
                continue
            at = top1[tree.parents[v]]
            above = torch.nextafter(at, torch.tensor(2.0, dtype=torch.float64))
            on, _ = _grow(model, parse_policy(f"conf-delayed:4:0.7:3:{float(at)!r}"), seed, False, True, look=1)
            off, _ = _grow(model, parse_policy(f"conf-delayed:4:0.7:3:{float(above)!r}"), seed, False, True, look=1)
            assert on.tree.tokens == off.tree.tokens == tree.tokens  # the same draws
            assert on.tree.used[v] and on.tree.child_draws[v] and off.tree.used[v] and not off.tree.child_draws[v]
            checked += 1
            break
    assert checked >= 2
