"""Policy chains decided on the device (``engine.drafting.draft_chain_on_device``): one host read at most a tree.

``conf-chain``, ``cum-chain`` and ``learned-chain`` decide each node from its row (top-1, path probability, the
acceptance model's network), all device arithmetic. On an accelerator their levels are drafted without waiting for
the host, which reads once, at a *look* level chosen from the past stops: a chain that stopped by then is cut there,
one that did not is drafted to the policy's depth. Checked here: from the same generator state the device drafter
grows the host drafter's tree of ``LookedChain(policy, look)`` (tokens, rows, fed nodes, levels, the draft cache),
with one read; the look follows the stops. That policy's law: tests/verifiers/test_dynamic_exact.py (exact, every
verifier of policy chains); through the engine: tests/engine/test_lossless.py; the syncs: tests/test_overhead.py.
"""

from __future__ import annotations

import collections

import pytest
import torch

from adaptive_spec.engine import Plan
from adaptive_spec.engine.drafting import chain_on_device, draft_policy_tree, draft_root
from adaptive_spec.engine.logits import ProbsFn, SamplingConfig, build_logits_processor
from adaptive_spec.engine.runner import ModelRunner
from adaptive_spec.trees.policy import LearnedChain, LookedChain, parse_policy
from tests.helpers.drafting import drafting_attr, patch_drafting
from tests.helpers.dynamic_cases import TinyAcceptanceNet
from tests.helpers.reads import counted_reads
from tests.helpers.tiny import tiny_model

V = 12
CONTEXT = [0, 2, 1, 5, 7]
POLICIES = [
    parse_policy("conf-chain:4:0.3"),
    parse_policy("conf-chain:6:0.2"),
    parse_policy("cum-chain:5:0.05"),
    parse_policy("cum-chain:3:0.3"),
    LearnedChain(depth=5, cost_ratio=0.01, predictor=TinyAcceptanceNet(1)),
    Plan.parse("learned-chain:4:0.1/block").policy,  # with the installed acceptance model
]


def _grow(model, policy, seed, deterministic, on_device, look=None):
    runner = ModelRunner(model)
    if look is not None:
        runner.chain_look[str(policy)] = collections.deque([look])
    probs_fn = ProbsFn(build_logits_processor(SamplingConfig(temperature=1.0).generation_config()), V, one_hot=False)
    g = torch.Generator().manual_seed(seed)
    with torch.inference_mode():
        runner.chain_forward(torch.tensor(CONTEXT[:-1]), logits_to_keep=1)
        root = draft_root(runner, torch.tensor(CONTEXT[-1:]), probs_fn)
        with counted_reads() as reads:
            out = draft_policy_tree(
                runner, root, policy, probs_fn, g, deterministic, temperature=1.0, on_device=on_device
            )
    return out, runner, reads


@pytest.fixture(scope="module")
def model():
    return tiny_model("llama", vocab=V, hidden=16, init_range=0.4, seed=3, layers=1, eos=None)


def test_which_policies_are_decided_on_the_device() -> None:
    assert all(chain_on_device(p) for p in POLICIES)
    assert not chain_on_device(LearnedChain(depth=3, predictor=lambda rows: [(0.5, 0.5)] * len(rows)))  # no layers
    assert not chain_on_device(parse_policy("conf-delayed:4:0.5:3"))
    assert not chain_on_device(parse_policy("eagle:3:6:2:2"))


@pytest.mark.parametrize("policy", POLICIES, ids=str)
@pytest.mark.parametrize("temperature", [1.0, 0.0])
def test_the_device_drafts_the_host_chain_of_the_looked_policy(model, policy, temperature) -> None:
    """From the same generator state: the tree of ``LookedChain(policy, look)`` grown on the host, node for node;
    cut at the policy's own stop when it comes by the look, else to the depth."""
    G, greedy = policy.depth, temperature == 0
    cut = past = 0
    for seed in range(8):
        own, _, _ = _grow(model, policy, seed, greedy, on_device=False)
        s = own.tree.num_nodes - 1  # the policy's own stop: nodes 1 .. s - 1 fed, node s a leaf
        for look in range(1, G):
            dev, r_dev, reads = _grow(model, policy, seed, greedy, on_device=True, look=look)
            host, r_host, _ = _grow(model, LookedChain(policy.depth, inner=policy, look=look), seed, greedy, False)
            assert reads == [1]  # the look's one read
            ht, dt = host.tree, dev.tree
            assert dt.tokens == ht.tokens and torch.equal(dt.draft_probs, ht.draft_probs) and dev.ok is not None
            assert (dev.fed_nodes, dev.policy_levels) == (host.fed_nodes, host.policy_levels)
            assert [dev.draft_row(i) for i in range(dt.num_nodes)] == [host.draft_row(i) for i in range(ht.num_nodes)]
            assert dt.tokens[: s + 1] == own.tree.tokens
            if s <= look:  # stopped by the look: cut there, the policy's own chain
                cut += 1
                assert dt.num_nodes == s + 1 and list(r_dev.chain_look[str(policy)]) == [look, s]
            else:  # drafted to the depth, every node fed but the leaf
                past += 1
                assert dt.num_nodes == G + 1 == dev.fed_nodes + 1 and dev.policy_levels == G
                assert list(r_dev.chain_look[str(policy)]) == [look, look + 1]
            assert r_dev.cache_length() == r_host.cache_length()  # nodes fed after a stop: their rows undone
    assert past and (cut or greedy), (cut, past)  # both cases met (at T = 0 these chains often run to the depth)


def test_a_depth_one_chain_reads_nothing(model) -> None:
    policy = parse_policy("conf-chain:1:0.5")
    dev, _, reads = _grow(model, policy, 0, False, on_device=True)
    assert reads == [] and dev.tree.num_nodes == 2 and dev.fed_nodes == 1


def test_the_look_follows_the_deepest_recent_stop(model) -> None:
    """The look is the deepest of the last stops (a chain past its look counts as one deeper), 2 at first."""
    policy = parse_policy("conf-chain:6:0.2")
    runner = ModelRunner(model)
    probs_fn = ProbsFn(build_logits_processor(SamplingConfig(temperature=1.0).generation_config()), V, one_hot=False)
    g = torch.Generator().manual_seed(0)
    looks = []
    with torch.inference_mode():
        runner.chain_forward(torch.tensor(CONTEXT[:-1]), logits_to_keep=1)
        for _ in range(12):
            mark = runner.block_mark()
            stops = runner.chain_look.get(str(policy), ())
            looks.append(min(max(stops, default=2), 5))
            root = draft_root(runner, torch.tensor(CONTEXT[-1:]), probs_fn)
            out = draft_policy_tree(runner, root, policy, probs_fn, g, False, on_device=True)
            stop = runner.chain_look[str(policy)][-1]
            assert stop == (out.tree.num_nodes - 1 if out.tree.num_nodes <= looks[-1] + 1 else looks[-1] + 1)
            runner.undo_block(mark)
    assert looks[0] == 2 and len(set(looks)) > 1


@pytest.mark.parametrize("plan", ["conf-chain:5:0.3/block", "cum-chain:4:0.2/block", "conf-delayed:4:0.3:2/traversal"])
def test_device_policies_through_an_eagle_head_keep_greedy_equality(plan, monkeypatch) -> None:
    """Through an EAGLE head (whose rows ride on the target's features, undone with the block rows after a stop),
    on the accelerator's path: greedy tokens equal transformers', and a sampled run goes to its end, the same for
    the same seed."""
    from adaptive_spec.engine import SpecEngine
    from adaptive_spec.rng import accelerator_path_on_cpu
    from tests.engine.test_eagle import make_head

    calls = []
    for name in ("draft_chain_on_device", "draft_conf_delayed"):
        real = drafting_attr(name)
        patch_drafting(monkeypatch, name, lambda *a, real=real: calls.append(a[-1]) or real(*a))

    target = tiny_model("llama", vocab=8, hidden=16, eos=None, init_range=0.5, seed=11, layers=1)
    head = make_head(target, 6, [0, 1, 2, 3, 5, 6], seed=2, init=0.5)
    engine = SpecEngine(target, head)
    prompt = [5, 6, 7, 2, 3]
    ref = target.generate(torch.tensor([prompt]), max_new_tokens=40, do_sample=False)[0, len(prompt) :].tolist()
    with accelerator_path_on_cpu():
        assert engine.generate(prompt, max_new_tokens=40, temperature=0.0, plan=plan).token_ids == ref
        r = engine.generate(prompt, max_new_tokens=40, temperature=1.0, plan=plan, seed=0)
        again = engine.generate(prompt, max_new_tokens=40, temperature=1.0, plan=plan, seed=0)
    assert len(r.token_ids) == 40 and max(r.stats.tree_sizes) > 2
    assert again.token_ids == r.token_ids  # the looks start afresh with each request: a seed gives its tokens
    assert calls  # drafted by the device path
    if plan.startswith("conf-delayed"):
        assert all(calls)  # its trunk looked once, on the device (``looked``, the last argument)


def test_the_engine_can_keep_policies_on_the_host(model) -> None:
    """``engine.device_policies = False``: policy trees grown on the host (a read a level) on an accelerator too."""
    from adaptive_spec.engine import SpecEngine
    from adaptive_spec.rng import accelerator_path_on_cpu

    engine = SpecEngine(model, model)
    with accelerator_path_on_cpu():
        with counted_reads() as device_reads:
            on = engine.generate([0, 2, 1], max_new_tokens=12, temperature=1.0, plan="conf-chain:5:0.05/block", seed=0)
        engine.device_policies = False
        with counted_reads() as host_reads:
            off = engine.generate([0, 2, 1], max_new_tokens=12, temperature=1.0, plan="conf-chain:5:0.05/block", seed=0)
    assert len(device_reads) <= 2 * on.stats.steps < len(host_reads)  # a read a level on the host: more
    assert len(host_reads) > 2 * off.stats.steps
