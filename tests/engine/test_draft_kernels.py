"""The fused drafting kernel (``adaptive_spec.engine.draft_kernels``) against the torch code it replaces.

``draft_eagle_iid_on_device``'s torch code grows the host drafter's tree from one generator state
(``test_eagle_device.py``), whose law is tested exactly elsewhere. The kernel does a level's bookkeeping in one
launch: from one generator state it must grow *the same tree* as the torch code (tokens, parents, draws, feeds,
ancestors, the device tensors handed to the verifiers, the reads and the generator's state), with looks that read
the tree mid-way, merges and budgets ending mid-level; a drawn child of probability 0 must still send the tree back
to the host path; a kernel that fails (first level or mid-tree) logs one line and the torch code grows the tree
again. On a CPU it runs in Triton's interpreter (``tests/conftest.py``); the ``gpu`` cases run it compiled.
"""

from __future__ import annotations

import collections
import logging

import pytest
import torch

from adaptive_spec.engine import SpecEngine, draft_kernels
from adaptive_spec.engine.drafting import draft_policy_tree, draft_root
from adaptive_spec.engine.logits import ProbsFn, SamplingConfig, build_logits_processor
from adaptive_spec.engine.runner import ModelRunner
from adaptive_spec.rng import accelerator_path_on_cpu
from adaptive_spec.trees.policy import parse_policy
from adaptive_spec.verifiers import kernels
from tests.engine.test_eagle_device import CONTEXT, IID_POLICIES, V, _same_iid, draws_at_the_top
from tests.helpers.drafting import drafting_attr, patch_drafting
from tests.helpers.tiny import tiny_model

pytest.importorskip("triton")
from tests.verifiers.test_kernels import DEVICES, kernels_on, pytestmark  # noqa: F401 - pytestmark: its marks too


@pytest.fixture
def fused(monkeypatch):
    """The fused kernels on (on a CPU in Triton's interpreter), restored after the test; the launches counted."""
    kernels_on(monkeypatch)
    launches = []
    real = draft_kernels.eagle_iid_level
    monkeypatch.setattr(draft_kernels, "eagle_iid_level", lambda *a: launches.append(1) or real(*a))
    return launches


def _model(device: str, flat: bool = False):
    """The tests' draft; ``flat``: every row uniform (a zero head), so that path probabilities tie everywhere."""
    model = tiny_model("llama", vocab=V, hidden=16, init_range=0.4, seed=3, layers=1, eos=None).to(device)
    if flat:
        with torch.no_grad():
            model.lm_head.weight.zero_()
    return model


def _grow(model, policy, probs_fn, seed, deterministic, on_kernels, look=None, pending=1):
    """The tree of ``policy`` grown on the device, by the fused kernel (``on_kernels``) or the torch code (None:
    the kernels left as they are)."""
    if on_kernels is not None:
        kernels.FUSED[0] = on_kernels
    device = next(model.parameters()).device
    runner = ModelRunner(model)
    if look is not None:  # the policy's past trees in the request, as if one had reached depth ``look``
        runner.chain_look[str(policy)] = collections.deque([look])
    g = torch.Generator(device).manual_seed(seed)
    with torch.inference_mode():
        runner.chain_forward(torch.tensor(CONTEXT[:-pending], device=device), logits_to_keep=1)
        root = draft_root(runner, torch.tensor(CONTEXT[-pending:], device=device), probs_fn)
        out = draft_policy_tree(runner, root, policy, probs_fn, g, deterministic, on_device=True)
    return out, runner, g


def _probs_fn(**sampling) -> ProbsFn:
    return ProbsFn(build_logits_processor(SamplingConfig(temperature=1.0, **sampling).generation_config()), V, False)


FLAT_POLICIES = ["eagle:6:48:6:4", "eagle:4:12:3:2", "eagle:5:40:2:6"]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "text,flat", [(t, False) for t in IID_POLICIES] + [(t, True) for t in FLAT_POLICIES], ids=lambda v: str(v)
)
@pytest.mark.parametrize("temperature", [1.0, 0.0])
def test_the_fused_levels_grow_the_torch_codes_tree(fused, monkeypatch, device, text, flat, temperature) -> None:
    """Every i.i.d. policy (merges, budgets ending mid-level, chain-like trees; on uniform rows, path probabilities
    tied: the first made first), with the look at the first uncertain level and deeper (reads mid-tree), one or
    three pending rows (the mask's first columns): a launch a level and the tree, reads and draws of the torch
    code."""
    policy, model, probs_fn = parse_policy(text), _model(device, flat), _probs_fn()
    reads = []
    real = drafting_attr("_read_iid")
    patch_drafting(monkeypatch, "_read_iid", lambda *a: reads.append(a[-1]) or real(*a))
    merged = 0
    for seed in range(4):
        for look in (None, policy.depth):
            pending = 1 + 2 * (seed % 2)
            reads.clear()
            ref, r_ref, g_ref = _grow(model, policy, probs_fn, seed, temperature == 0, False, look, pending)
            torch_reads = list(reads)
            fused.clear()
            reads.clear()
            got, r_got, g_got = _grow(model, policy, probs_fn, seed, temperature == 0, True, look, pending)
            assert kernels.FUSED[0], "the kernel failed: the torch code ran"
            assert len(fused) == got.policy_levels  # a launch a level
            _same_iid(got, ref)
            assert torch.equal(got.tree.draft_probs, ref.tree.draft_probs)  # the nodes' rows: the same forwards
            assert got.cache_rows == ref.cache_rows and torch.equal(got.cache_rows_tensor, ref.cache_rows_tensor)
            assert reads == torch_reads and r_got.forwards == r_ref.forwards
            assert r_got.cache_length() == r_ref.cache_length()
            assert torch.equal(g_got.get_state(), g_ref.get_state())
            merged += got.tree.num_nodes - 1 < sum(map(len, got.tree.child_draws))
    if text in ("eagle:3:6:2:2", "eagle:4:12:3:2") and not flat:
        assert merged  # duplicates merged into one node happen


def test_a_drawn_child_of_probability_zero_still_sends_the_tree_to_the_host(fused, monkeypatch) -> None:
    """The kernel's flag of a drawn child of probability 0 (draws forced to a row's top 3 of 2 positive entries)."""
    policy, model = parse_policy("eagle:4:12:3:3"), _model("cpu")
    probs_fn = _probs_fn(top_k=2)
    draws_at_the_top(monkeypatch)
    got, r_got, g_got = _grow(model, policy, probs_fn, 0, False, True)
    assert fused and kernels.FUSED[0]
    ref, r_ref, g_ref = _grow(model, policy, probs_fn, 0, False, False)
    assert not r_got.device_policy and not r_ref.device_policy  # both sent back to the host path
    assert (got.tree.tokens, got.tree.child_draws) == (ref.tree.tokens, ref.tree.child_draws)
    assert torch.equal(g_got.get_state(), g_ref.get_state())


@pytest.mark.parametrize("fail_at", [1, 3])
def test_a_failing_draft_kernel_leaves_the_torch_codes_tree_and_one_log_line(fused, monkeypatch, caplog, fail_at):
    """A failure at the first launch or mid-tree (after forwards): the generator and the draft's block set back, the
    tree grown again by the torch code, one log line, the kernels off from then on."""
    policy, model, probs_fn = parse_policy("eagle:6:48:6:4"), _model("cpu"), _probs_fn()
    ref, r_ref, g_ref = _grow(model, policy, probs_fn, 2, False, False)
    from adaptive_spec.engine import _triton_draft

    calls = []
    real = _triton_draft.eagle_iid_level_kernel

    class Broken:
        def __getitem__(self, grid):
            calls.append(1)
            if len(calls) == fail_at:
                raise RuntimeError("no kernel image for this device")
            return real[grid]

    monkeypatch.setattr(_triton_draft, "eagle_iid_level_kernel", Broken())
    with caplog.at_level(logging.WARNING, logger="adaptive_spec.verifiers"):
        got, r_got, g_got = _grow(model, policy, probs_fn, 2, False, True)
        again, _, _ = _grow(model, policy, probs_fn, 2, False, None)  # the kernels off now: not tried again
    assert not kernels.FUSED[0] and len(calls) == fail_at
    _same_iid(again, ref)
    assert [r.getMessage() for r in caplog.records] == [
        "fused eagle iid level kernel failed (RuntimeError: no kernel image for this device); the torch code runs "
        "instead"
    ]
    _same_iid(got, ref)
    assert r_got.device_policy and r_got.cache_length() == r_ref.cache_length()
    assert torch.equal(g_got.get_state(), g_ref.get_state())


@pytest.mark.parametrize("temperature", [1.0, 0.0])
def test_generations_are_the_same_with_the_fused_levels(fused, temperature) -> None:
    """Through the engine (the accelerator's paths on a CPU), with the EAGLE-style head: the same tokens and steps."""
    from tests.engine.test_eagle import make_head

    target = tiny_model("llama", vocab=48, hidden=32, seed=3, eos=None)
    engine = SpecEngine(target, make_head(target, 40, range(8, 48)))
    runs = {}
    for on in (False, True):
        kernels.FUSED[0] = on
        fused.clear()
        with accelerator_path_on_cpu():
            runs[on] = [
                engine.generate([5, 6, 7, 9], max_new_tokens=16, temperature=temperature, plan=plan, seed=1)
                for plan in ("eagle:5:16:3:3/specinfer", "eagle:4:12:3:2/traversal")
            ]
        assert bool(fused) == on and kernels.FUSED[0] == on
    for a, b in zip(runs[True], runs[False], strict=True):
        assert a.token_ids == b.token_ids
        assert (a.stats.accept_lengths, a.stats.tree_sizes) == (b.stats.accept_lengths, b.stats.tree_sizes)
