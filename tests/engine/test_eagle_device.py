"""EAGLE-style policy trees decided on the device (``engine.drafting.draft_eagle_on_device`` without replacement,
``draft_eagle_iid_on_device`` with i.i.d. children).

The device drafter draws the same candidates by the same calls as the host drafter (one host read per
level), so from the same generator state it must grow *the same tree*: tokens, parents, draws, rows,
feed order, device tensors, and leave the draft cache and the generator where the host drafter leaves
them (with i.i.d. children the device feeds padding rows too: its rows agree to rounding, and its cache
holds those rows until the commit). Where a drawn child has probability 0 (a top-k processor narrower than
the width), it grows the host path's tree again from the saved generator state. The host drafter's law is tested exactly
elsewhere (tests/verifiers/test_dynamic_exact.py, through sample_policy_tree and the engine).
"""

from __future__ import annotations

import collections
import contextlib

import pytest
import torch

from adaptive_spec.bench.overhead import HostSyncCounter
from adaptive_spec.engine import SpecEngine, drafting
from adaptive_spec.engine.drafting import (
    DraftOutcome,
    draft_policy_tree,
    draft_root,
    eagle_iid_slots,
    eagle_levels,
    eagle_on_device,
)
from adaptive_spec.engine.logits import ProbsFn, SamplingConfig, build_logits_processor
from adaptive_spec.engine.runner import ModelRunner
from adaptive_spec.rng import accelerator_path_on_cpu
from adaptive_spec.trees.policy import parse_policy
from tests.engine.test_eagle import make_head
from tests.helpers.drafting import drafting_attr, patch_drafting
from tests.helpers.tiny import perturbed, tiny_model

V = 12
CONTEXT = [0, 2, 1, 5, 7]
POLICIES = [
    "eagle:3:6:2:2:wor",
    "eagle:4:12:3:2:wor",
    "eagle:6:48:6:4:wor",  # the shipped plan's shape: the budget ends mid-level
    "eagle:2:5:4:3:wor",
    "eagle:1:4:2:3:wor",
    "eagle:5:7:1:3:wor",
    "eagle:3:30:2:1:wor",  # a chain-like tree
]
IID_POLICIES = [p.removesuffix(":wor") for p in POLICIES] + ["eagle:6:30:3:5", "eagle:5:40:2:6"]


def _grow(model, policy, probs_fn, seed, deterministic, on_device, look=None):
    runner = ModelRunner(model)
    if look is not None:  # the policy's past trees in the request, as if one had reached depth ``look``
        runner.chain_look[str(policy)] = collections.deque([look])
    g = torch.Generator().manual_seed(seed)
    with torch.inference_mode():
        runner.chain_forward(torch.tensor(CONTEXT[:-1]), logits_to_keep=1)
        root = draft_root(runner, torch.tensor(CONTEXT[-1:]), probs_fn)
        out = draft_policy_tree(runner, root, policy, probs_fn, g, deterministic, on_device=on_device)
    return out, runner, g


def _same(a, b):
    ta, tb = a.tree, b.tree
    assert (ta.tokens, ta.parents, ta.depths, ta.child_draws) == (tb.tokens, tb.parents, tb.depths, tb.child_draws)
    assert torch.equal(ta.draft_probs, tb.draft_probs)
    assert (a.fed_nodes, a.cache_rows, a.pending_fed, a.policy_levels) == (
        b.fed_nodes,
        b.cache_rows,
        b.pending_fed,
        b.policy_levels,
    )
    assert torch.equal(a.ancestors, b.ancestors)
    for name in ("tokens", "parents", "depths", "ancestors", "children"):
        assert torch.equal(getattr(ta, f"{name}_tensor")(), getattr(tb, f"{name}_tensor")()), name


@pytest.fixture(scope="module")
def model():
    return tiny_model("llama", vocab=V, hidden=16, init_range=0.4, seed=3, layers=1, eos=None)


@pytest.mark.parametrize("text", POLICIES)
@pytest.mark.parametrize("temperature", [1.0, 0.0])
def test_the_device_drafter_grows_the_host_drafters_tree(model, text, temperature) -> None:
    policy = parse_policy(text)
    assert eagle_on_device(policy, V)
    sampling = SamplingConfig(temperature=1.0)  # the draft's rows; temperature 0 takes their top-k
    probs_fn = ProbsFn(build_logits_processor(sampling.generation_config()), V, one_hot=False)
    for seed in range(6):
        dev, r_dev, g_dev = _grow(model, policy, probs_fn, seed, temperature == 0, True)
        host, r_host, g_host = _grow(model, policy, probs_fn, seed, temperature == 0, False)
        _same(dev, host)
        assert r_dev.device_policy  # no child of probability 0: no redo
        assert r_dev.cache_length() == r_host.cache_length() and r_dev.forwards == r_host.forwards
        assert torch.equal(g_dev.get_state(), g_host.get_state())  # the same draws, consumed alike
        assert dev.tree.num_nodes == 1 + sum(sum(w) for w, _ in eagle_levels(policy))


def test_rows_with_zeros_are_drafted_again_on_the_host(model) -> None:
    policy = parse_policy("eagle:4:12:3:3:wor")
    narrow = SamplingConfig(temperature=1.0, top_k=2)  # two positive entries per row, three children wanted
    probs_fn = ProbsFn(build_logits_processor(narrow.generation_config()), V, one_hot=False)
    for seed in range(3):
        dev, r_dev, g_dev = _grow(model, policy, probs_fn, seed, False, True)
        host, r_host, g_host = _grow(model, policy, probs_fn, seed, False, False)
        _same(dev, host)
        assert not r_dev.device_policy  # redone on the host, and the rest of the run stays there
        assert r_dev.cache_length() == r_host.cache_length()  # the device attempt's rows are gone
        assert torch.equal(g_dev.get_state(), g_host.get_state())
        assert dev.tree.num_nodes < 1 + sum(sum(w) for w, _ in eagle_levels(policy))


def test_eagle_levels_follow_the_host_loop() -> None:
    assert eagle_levels(parse_policy("eagle:6:48:6:4:wor")) == [
        ([4], 4),
        ([4] * 4, 6),
        ([4] * 6, 6),
        ([4, 0, 0, 0, 0, 0], 0),
    ]
    assert eagle_levels(parse_policy("eagle:1:4:2:3:wor")) == [([3], 0)]  # depth 1: the root's children only
    assert eagle_levels(parse_policy("eagle:2:5:4:3:wor")) == [([3], 3), ([2, 0, 0], 0)]
    assert eagle_on_device(parse_policy("eagle:3:6:2:2"), V)  # i.i.d. children too (draft_eagle_iid_on_device)
    assert not eagle_on_device(parse_policy("eagle:3:6:2:20:wor"), V)  # wider than the vocabulary


GENERATION_PLANS = {
    "wor": ["eagle:4:12:3:2:wor/traversal", "eagle:3:9:2:3:wor/nss", "eagle:5:10:2:2:wor/rrsw"],
    "iid": ["eagle:4:12:3:2/traversal", "eagle:5:16:3:3/specinfer", "eagle:3:9:2:4/nss"],
}


@pytest.mark.parametrize("law", ["wor", "iid"])
@pytest.mark.parametrize("temperature", [1.0, 0.0])
@pytest.mark.parametrize("head", [False, True], ids=["draft-model", "eagle-head"])
def test_generations_are_the_same_on_the_device_and_on_the_host(monkeypatch, law, temperature, head) -> None:
    """Without replacement a CPU grows the tree on the device too; with i.i.d. children only an accelerator does (a
    CPU run grows none there), so those runs take the accelerator's paths, verifiers included, on both sides. With
    i.i.d. children the device grows the tree to a look chosen by the past trees, the host path's tree of the policy
    cut there; the levels it drafts blind past a tree's end make no node but take draws from the generator, so here
    the look is kept at the first level that is not certain, where the host path of the policy cut at that depth
    draws alike (the looks: the next test)."""
    host_plans = GENERATION_PLANS[law]
    if law == "iid":
        patch_drafting(monkeypatch, "look_level", lambda *a, least, first: (collections.deque(maxlen=0), least))
        host_plans = [_cut_at_first_uncertain(plan) for plan in host_plans]
    target = tiny_model("llama", vocab=48, hidden=32, seed=3, eos=None)
    draft = make_head(target, 40, range(8, 48)) if head else perturbed(target, 0.2, 4)
    engine = SpecEngine(target, draft)
    name = "draft_eagle_on_device" if law == "wor" else "draft_eagle_iid_on_device"
    runs, grown = {}, []
    real = drafting_attr(name)
    patch_drafting(monkeypatch, name, lambda *a: grown.append(real(*a)) or grown[-1])
    for where in ("cpu", "device", "host") if law == "iid" else ("device", "host"):
        if where == "host":
            patch_drafting(monkeypatch, "eagle_on_device", lambda *a: False)
        ahead = law == "iid" and where != "cpu"
        with accelerator_path_on_cpu() if ahead else contextlib.nullcontext():  # the verifiers' paths alike
            runs[where] = [
                engine.generate([5, 6, 7, 9], max_new_tokens=24, temperature=temperature, plan=plan, seed=seed)
                for plan in (host_plans if where == "host" else GENERATION_PLANS[law])
                for seed in range(2)
            ]
        if where == "cpu":  # a CPU grows trees with i.i.d. children on the host: a read costs nothing there
            assert not grown
    assert grown and all(isinstance(o, DraftOutcome) for o in grown)  # every tree of the device runs: grown there
    for a, b in zip(runs["device"], runs["host"], strict=True):
        assert a.token_ids == b.token_ids
        assert (a.stats.accept_lengths, a.stats.tree_sizes) == (b.stats.accept_lengths, b.stats.tree_sizes)


def _certain(policy) -> int:
    """The levels of ``policy`` (an EAGLE-style tree) whose new nodes are surely fed."""
    levels = eagle_levels(policy)
    certain = 0
    while certain < len(levels) and levels[certain][1]:
        certain += 1
    return certain


def _cut_at_first_uncertain(plan: str) -> str:
    """``plan`` with its policy cut at its first level that is not certain."""
    text, verifier = plan.split("/")
    policy = parse_policy(text)
    return f"{policy.truncated(_certain(policy) + 1)}/{verifier}"


def _cuts_and_alone(monkeypatch, cache: str, make, text: str) -> list[tuple]:
    """The plans of a policy's depth cuts made with its own (checked: in one copy for all), each beside the plan made
    for the cut alone."""
    policy, cpu, copies = parse_policy(text), torch.device("cpu"), []
    patch_drafting(monkeypatch, cache, {})
    monkeypatch.setattr(torch, "tensor", lambda *a, **k: copies.append(a) or torch.as_tensor(*a, **k))
    full = make(policy, cpu)
    cuts = [make(policy.truncated(d), cpu) for d in range(1, policy.depth)]
    assert len(copies) == 1 and full is make(policy, cpu)
    monkeypatch.undo()
    alone = []
    for d in range(1, policy.depth):
        patch_drafting(monkeypatch, cache, {})
        alone.append(make(policy.truncated(d), cpu))
    return list(zip(cuts, alone, strict=True))


def test_a_policys_depth_cuts_get_their_plans_in_the_same_transfer(monkeypatch):
    """The plans of a policy's depth cuts (its last steps in a request) are made with its own, in one copy, and each
    equals the plan made for the cut alone."""
    for cut, alone in _cuts_and_alone(monkeypatch, "_EAGLE_PLANS", drafting_attr("_eagle_plan"), "eagle:6:48:6:4:wor"):
        assert (cut.n, cut.fed, cut.widest, cut.depths) == (alone.n, alone.fed, alone.widest, alone.depths)
        assert [(lv.widths, lv.fed, lv.kids) for lv in cut.levels] == [
            (lv.widths, lv.fed, lv.kids) for lv in alone.levels
        ]
        for a, b in zip(cut.levels, alone.levels, strict=True):
            for name in ("used", "of", "ids", "own"):
                assert torch.equal(getattr(a, name), getattr(b, name))
        for name in ("depths_d", "start", "kids", "ancestors", "root", "one"):
            assert torch.equal(getattr(cut, name), getattr(alone, name))


def _same_iid(a, b):
    """The same tree, draws and feeds; rows equal to rounding (the device's forwards carry padding rows)."""
    ta, tb = a.tree, b.tree
    assert (ta.tokens, ta.parents, ta.depths, ta.child_draws) == (tb.tokens, tb.parents, tb.depths, tb.child_draws)
    assert torch.allclose(ta.draft_probs, tb.draft_probs, atol=1e-6)
    assert (a.pending_fed, a.policy_levels, sorted(a.cache_rows)) == (
        b.pending_fed,
        b.policy_levels,
        sorted(b.cache_rows),
    )
    assert torch.equal(a.ancestors, b.ancestors)
    for name in ("tokens", "parents", "depths", "ancestors", "children", "draws"):
        assert torch.equal(getattr(ta, f"{name}_tensor")(), getattr(tb, f"{name}_tensor")()), name
    assert ta.has_tensors(ta.device, "children", "draws")  # handed over by the device drafter: no copy
    rows = a.cache_rows_tensor.tolist()
    assert [r for r in rows if r >= 0] == sorted(a.cache_rows.values()) and all(
        rows[node] == row for node, row in a.cache_rows.items()
    )


@pytest.mark.parametrize("text", IID_POLICIES)
@pytest.mark.parametrize("temperature", [1.0, 0.0])
def test_the_device_drafter_grows_the_host_drafters_iid_tree(model, text, temperature, monkeypatch) -> None:
    policy = parse_policy(text)
    assert eagle_on_device(policy, V) and not policy.without_replacement
    probs_fn = ProbsFn(build_logits_processor(SamplingConfig(temperature=1.0).generation_config()), V, one_hot=False)
    reads, merged, longer = [], 0, 0
    real = drafting_attr("_read_iid")
    patch_drafting(monkeypatch, "_read_iid", lambda *a: reads.append(1) or real(*a))
    for seed in range(8):
        host, r_host, g_host = _grow(model, policy, probs_fn, seed, temperature == 0, False)
        reads.clear()  # the look at the tree's depth: the whole tree, no level blind
        dev, r_dev, g_dev = _grow(model, policy, probs_fn, seed, temperature == 0, True, look=max(host.tree.depths))
        n_reads = len(reads)
        _same_iid(dev, host)
        assert r_dev.device_policy and r_dev.forwards == r_host.forwards
        assert torch.equal(g_dev.get_state(), g_host.get_state())  # the same draws, consumed alike
        draws = sum(map(len, dev.tree.child_draws))
        assert draws <= policy.budget and draws == sum(len(c) for c in host.tree.child_draws)
        merged += dev.tree.num_nodes - 1 < draws  # duplicates merged into one node
        longer += dev.policy_levels > len(eagle_levels(policy))  # saved budget spent deeper
        assert n_reads == 1  # one read for the tree
    if text in ("eagle:3:6:2:2", "eagle:4:12:3:2"):
        assert merged and longer  # the cases where the merges matter happen


def test_iid_frontier_rows_per_level() -> None:
    assert eagle_iid_slots(parse_policy("eagle:6:48:6:4")) == [1, 4, 6, 6, 6, 6]
    assert eagle_iid_slots(parse_policy("eagle:1:4:2:3")) == [1]
    assert eagle_iid_slots(parse_policy("eagle:3:30:2:1")) == [1, 1, 1]


def draws_at_the_top(monkeypatch) -> None:
    """The drafter's draws forced to each row's top k (the same uniforms consumed): with a top-k processor narrower
    than k, drawn children of probability 0."""
    real = drafting_attr("draw_tokens")

    def topk_draws(rows, k, generator, **kw):
        real(rows, k, generator, **kw)
        return rows.topk(k, dim=-1).indices

    patch_drafting(monkeypatch, "draw_tokens", topk_draws)


def test_iid_draws_of_probability_zero_are_drafted_again_on_the_host(model, monkeypatch) -> None:
    """A drawn child of probability 0 (here: draws forced to a row's top k, wider than its two positive entries)
    sends the tree back to the host path, which grows the same tree from the saved generator state: the tree of the
    policy cut at the look (before any tree, the first level that is not certain)."""
    policy = parse_policy("eagle:4:12:3:3")
    narrow = SamplingConfig(temperature=1.0, top_k=2)
    probs_fn = ProbsFn(build_logits_processor(narrow.generation_config()), V, one_hot=False)
    draws_at_the_top(monkeypatch)
    dev, r_dev, g_dev = _grow(model, policy, probs_fn, 0, False, True)
    assert _certain(policy) + 1 < policy.depth  # a cut
    host, r_host, g_host = _grow(model, policy.truncated(_certain(policy) + 1), probs_fn, 0, False, False)
    assert (dev.tree.tokens, dev.tree.child_draws) == (host.tree.tokens, host.tree.child_draws)
    assert not r_dev.device_policy and r_dev.cache_length() == r_host.cache_length()
    assert torch.equal(g_dev.get_state(), g_host.get_state())
    assert all(len(d) <= 2 for d in dev.tree.child_draws)  # the host path stops a node's draws at a zero


def test_an_iid_policys_depth_cuts_get_their_plans_in_the_same_transfer(monkeypatch):
    """As without replacement: the plans of an i.i.d. EAGLE policy's depth cuts come with its own, in one copy, and
    each equals the plan made for the cut alone."""
    for cut, alone in _cuts_and_alone(monkeypatch, "_IID_PLANS", drafting_attr("_iid_plan"), "eagle:6:48:6:4"):
        assert (cut.slots, cut.certain, cut.m) == (alone.slots, alone.certain, alone.m)
        for name in ("start", "tables", "counters", "ancestors", "earlier", "root", "one", "pad"):
            assert torch.equal(getattr(cut, name), getattr(alone, name)), name
        for name in ("limit", "row", "depth", "rank"):
            assert all(torch.equal(a, b) for a, b in zip(getattr(cut, name), getattr(alone, name), strict=True))


@pytest.mark.parametrize("text", IID_POLICIES)
def test_an_iid_tree_is_read_at_its_look_and_is_the_host_drafters(model, text) -> None:
    """Grown to the look level (the deepest of the policy's past trees, at least the first level that is not
    certain) and read once there: the host path's tree of the policy cut at the look, from the same generator state;
    a look past the tree's end costs blind levels (forwards, draws), no node; the tree's depth is recorded, one
    more for a tree cut at its look (nodes were fed there), so the next look goes a level deeper."""
    policy = parse_policy(text)
    probs_fn = ProbsFn(build_logits_processor(SamplingConfig(temperature=1.0).generation_config()), V, one_hot=False)
    certain = _certain(policy)
    reads, real = [], drafting_attr("_read_iid")

    def counted(*a):
        reads.append(1)
        return real(*a)

    blind = cut = 0
    for seed in range(6):
        full = max(_grow(model, policy, probs_fn, seed, False, False)[0].tree.depths)
        for look in range(certain + 1, policy.depth + 2):
            host, _, _ = _grow(model, policy.truncated(look), probs_fn, seed, False, False)
            depth = max(host.tree.depths)
            reads.clear()
            with pytest.MonkeyPatch.context() as mp:
                patch_drafting(mp, "_read_iid", counted)
                dev, runner, _ = _grow(model, policy, probs_fn, seed, False, True, look=look)
            ta, tb = dev.tree, host.tree
            assert (ta.tokens, ta.parents, ta.depths, ta.child_draws) == (
                tb.tokens,
                tb.parents,
                tb.depths,
                tb.child_draws,
            )
            assert torch.allclose(ta.draft_probs, tb.draft_probs, atol=1e-6) and sorted(dev.cache_rows) == sorted(
                host.cache_rows
            )
            assert len(reads) == 1
            assert dev.policy_levels == min(look, policy.depth)  # levels drafted, blind ones included
            assert runner.chain_look[str(policy)][-1] == (look + 1 if full > look else depth)
            assert depth == min(full, look)
            blind += look > depth and depth < policy.depth
            cut += full > look
    if text in ("eagle:3:6:2:2", "eagle:4:12:3:2"):  # where merges take some trees deeper than others
        assert blind and cut  # looks past a tree's end and before it, both met


def test_a_path_through_nodes_one_to_k_keeps_its_draft_rows(monkeypatch) -> None:
    """A path 1 .. k (the root's draws all merged into node 1) of a tree grown on the device, whose fed padding rows
    sit between its nodes' draft rows: the draft cache keeps the path's own rows (a slice of the device's row table,
    no copy), so the next steps draft what the host path's do. The policy's first two levels are certain (fed
    whatever the merges) and its budget outlasts the third, so every tree is grown to its depth, the look."""
    plan = "eagle:3:12:2:2/specinfer"
    target = tiny_model("llama", vocab=48, seed=3, eos=None)
    engine = SpecEngine(target, perturbed(target, 0.2, 4))
    runs, roles, grown = {}, {"target": engine.target, "draft": engine.draft}, []
    real = drafting.draft_eagle_iid_on_device
    patch_drafting(monkeypatch, "draft_eagle_iid_on_device", lambda *a: grown.append(real(*a)) or grown[-1])
    with accelerator_path_on_cpu():  # the policy's plans, made once
        engine.generate([5, 6, 7, 9], max_new_tokens=4, plan=plan, seed=0)
    for where in ("device", "host"):
        if where == "host":
            patch_drafting(monkeypatch, "eagle_on_device", lambda *a: False)
        with HostSyncCounter(roles=roles) as counter:  # the accelerator's path
            runs[where] = [
                engine.generate([5, 6, 7, 9], max_new_tokens=24, temperature=1.0, plan=plan, seed=s) for s in (2, 3)
            ]
        if where == "device":  # the tree's read and the verifier's: the rows kept are not copied over
            assert counter.by_kind(stage="step").keys() == {"tolist"}
    for a, b in zip(runs["device"], runs["host"], strict=True):
        assert (a.token_ids, a.stats.accept_lengths, a.stats.tree_sizes) == (
            b.token_ids,
            b.stats.accept_lengths,
            b.stats.tree_sizes,
        )
    # the case: the root's draws merged into node 1, and node 1's into node 2
    assert any(
        o.tree.parents[:3] == [-1, 0, 1] and o.tree.parents.count(0) == o.tree.parents.count(1) == 1 for o in grown
    )
