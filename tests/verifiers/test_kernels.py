"""The fused kernels (``adaptive_spec.verifiers.kernels``) against the torch code, and their law.

The torch code of ``traversal_states`` is held to the reference's exact law (``test_traversal_device.py``). The
kernel does a level in one launch with the same arithmetic: on every tree here it gives the torch code's weights,
rows and positions (float64 rows: to 1e-12; float32: to float32's rounding), with and without the rejected
tokens zeroed. Its states, run through the exact harness, have the exact law, and the lossy control (the
rejected token kept in ``Ms``) run through the kernel is caught. A kernel that fails leaves the torch code's
result and one log line. The RRS kernel likewise gives ``rrs_states``' acceptance probabilities and residuals
(with and without replacement, inactive and zero-probability candidates, an all-zero residual), and through the
exact harness SpecInfer's and RRSw's laws, with the control (RRSw's trees solved with replacement) caught. On a CPU
they run in Triton's interpreter; the ``gpu`` cases run them compiled on CUDA.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import pytest
import torch

from adaptive_spec.analysis.exact import completed_tv, output_law
from adaptive_spec.analysis.instances import random_instance
from adaptive_spec.rng import TorchSampler
from adaptive_spec.trees import DraftTree, TreeShape
from adaptive_spec.trees.draw import sample_tree
from adaptive_spec.verifiers import REGISTRY, kernels, rrs, traversal
from tests.helpers.verifier_cases import cases_for
from tests.verifiers.test_rrs_device import _states_verifier
from tests.verifiers.test_traversal_device import SLOT_TREES, _slot_case, _states_program

pytest.importorskip("triton")
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning:triton")  # the interpreter's x/0, where-masked

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


def kernels_on(monkeypatch) -> None:
    """The fused kernels on (on a CPU in Triton's interpreter: tests/conftest.py sets it), restored after the test."""
    monkeypatch.setattr(kernels, "FUSED", [True])
    monkeypatch.setattr(kernels, "ON_CPU", [True])


@pytest.fixture
def fused(monkeypatch):
    """:func:`kernels_on` for a test."""
    kernels_on(monkeypatch)
    return kernels


def _both(tree: DraftTree, target: torch.Tensor, zero_rejected: bool = True):
    """``traversal_states`` by the torch code, then by the kernel (which must not have failed)."""
    kernels.FUSED[0] = False
    torch_states = traversal.traversal_states(tree, target, zero_rejected=zero_rejected)
    kernels.FUSED[0] = True
    fused_states = traversal.traversal_states(tree, target, zero_rejected=zero_rejected)
    assert kernels.FUSED[0], "the kernel failed: the torch code ran"
    return torch_states, fused_states


def _host_trees(device: str):
    """Trees of every static law traversal verifies, on random float64 rows, built on the host."""
    out = []
    for law in sorted(law for law in REGISTRY["traversal"].laws if not law.dynamic):
        for inst, shape in cases_for(law, n_random=2)[:3]:
            tree = sample_tree(shape, inst.draft_fn, TorchSampler(torch.Generator().manual_seed(7)))
            target = torch.stack([inst.target_fn(c) for c in tree.prefixes]).to(device)
            tree.draft_probs = tree.draft_probs.to(device)
            out.append((f"{law.value}:{inst.name}", tree, target))
    # a first child accepted surely (p/q = 1.5) whose residual stays positive at its token: the second child's
    # rejection then depends on that token's draft mass being zeroed
    q = torch.tensor([[0.4, 0.4, 0.2], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]], dtype=torch.float64)
    tree = DraftTree(
        [-1, 0, 1], [-1, 0, 0], [0, 1, 1], q.to(device), [[1, 2], [], []], TreeShape.without_replacement((2,))
    )
    target = torch.tensor([[0.6, 0.3, 0.1], [0.2, 0.5, 0.3], [0.1, 0.1, 0.8]], dtype=torch.float64)
    out.append(("zeroed token matters", tree, target.to(device)))
    # a policy-grown tree: numbered depth by depth, its tokens and children table kept (levels: ranges of it)
    inst = random_instance(7, 4, zero_frac=0.0)
    parents, tokens, depths = [-1, 0, 0, 1, 1, 2, 3], [-1, 1, 3, 0, 2, 1, 3], [0, 1, 1, 2, 2, 2, 3]
    prefixes = [()]
    for i in range(1, 7):
        prefixes.append(prefixes[parents[i]] + (tokens[i],))
    draws = [[c for c in range(7) if parents[c] == i] for i in range(7)]
    draft = torch.stack([inst.draft_fn(c) for c in prefixes]).to(device)
    tree = DraftTree(tokens, parents, depths, draft, draws, TreeShape.without_replacement((2, 2, 1)))
    tree.keep_tensors(
        tokens=torch.tensor(tokens, device=device), children=torch.tensor(tree.children_rows(), device=device)
    )
    out.append(("kept tables", tree, torch.stack([inst.target_fn(c) for c in prefixes]).to(device)))
    return out


def _emitted(states, target: torch.Tensor, n: int) -> torch.Tensor:
    """Each node's row it emits from if accepted, from ``traversal_states``' ``(w, residuals, pos)``."""
    _, residuals, pos = states
    rows = target.clone()
    inner = pos[:n] >= 0
    rows[inner] = residuals[pos[:n][inner]]
    return rows


def _check(torch_states, fused_states, target, used: torch.Tensor, atol: float, name: str = "") -> None:
    n = target.shape[0]
    w_t, w_f = torch_states[0][:n][used], fused_states[0][:n][used]
    assert torch.allclose(w_t, w_f, rtol=0, atol=atol), (name, w_t, w_f)
    rows_t, rows_f = _emitted(torch_states, target, n)[used], _emitted(fused_states, target, n)[used]
    assert torch.allclose(rows_t, rows_f, rtol=0, atol=atol), name


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("zero_rejected", [True, False], ids=["zeroed", "control"])
def test_the_fused_levels_give_the_torch_states_on_host_trees(fused, device, zero_rejected) -> None:
    trees = _host_trees(device)
    assert len(trees) >= 6
    moved = 0
    for name, tree, target in trees:
        a, b = _both(tree, target, zero_rejected)
        n = tree.num_nodes
        _check(a, b, target, torch.arange(n, device=device), 1e-12, name)
        moved += int((a[0][:n] < 1).sum())
    assert moved > 0  # some weight moved below 1: the rejections were exercised


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", range(len(SLOT_TREES)))
def test_the_fused_levels_give_the_torch_states_on_slot_trees(fused, device, case) -> None:
    make, target = _slot_case(*SLOT_TREES[case], device=device)  # float32 rows; inactive columns between active ones
    tree = make()
    a, b = _both(tree, target.to(device))
    used = torch.tensor(make().used, device=device)
    _check(a, b, target.to(device), used, 1e-6)


# (shape, vocabulary, instance seed): small enough for the interpreter, and an instance where the control is caught
EXACT_CASES = [(TreeShape.iid(2, 2), 2, 0), (TreeShape.without_replacement((2, 1)), 3, 2)]


@pytest.mark.parametrize(("shape", "vocab", "seed"), EXACT_CASES, ids=lambda x: str(x))
def test_the_fused_states_have_the_exact_law_and_the_lossy_control_is_caught(fused, shape, vocab, seed) -> None:
    inst = random_instance(seed, vocab, zero_frac=0.0)
    depth = shape.depth + 1
    tv, mass = completed_tv(
        output_law(_states_program(), shape, inst.draft_fn, inst.target_fn), inst.target_fn, vocab, depth
    )
    assert abs(mass - 1.0) < 1e-12 and tv < 1e-9, tv
    lossy = output_law(_states_program(zero_rejected=False), shape, inst.draft_fn, inst.target_fn)
    assert completed_tv(lossy, inst.target_fn, vocab, depth)[0] > 1e-3
    assert kernels.FUSED[0]  # the kernel ran throughout


def test_a_failing_kernel_leaves_the_torch_states_and_one_log_line(fused, monkeypatch, caplog) -> None:
    make, target = _slot_case(*SLOT_TREES[1])
    kernels.FUSED[0] = False
    expected = traversal.traversal_states(make(), target)
    kernels.FUSED[0] = True

    def broken(*args, **kwargs):
        raise RuntimeError("no kernel image for this device")

    monkeypatch.setattr(kernels, "traversal_level", broken)
    with caplog.at_level(logging.WARNING, logger="adaptive_spec.verifiers"):
        got = traversal.traversal_states(make(), target)
        traversal.traversal_states(make(), target)  # off now: not tried again, no second line
    assert not kernels.FUSED[0]
    assert [r.getMessage() for r in caplog.records] == [
        "fused traversal kernel failed (RuntimeError: no kernel image for this device); the torch code runs instead"
    ]
    for e, g in zip(expected, got, strict=True):
        assert torch.equal(e, g)


def _rrs_rows(device: str, dtype: torch.dtype):
    """Rows and candidates for ``rrs_states``: random rows with zeros, a candidate of probability 0, an inactive
    column between active ones, a duplicate (with replacement), and a row whose residual empties (p = q).
    """
    g = torch.Generator().manual_seed(5)
    m, v, k = 6, 7, 4
    p = torch.rand(m, v, generator=g, dtype=torch.float64) * (torch.rand(m, v, generator=g) > 0.2)
    q = torch.rand(m, v, generator=g, dtype=torch.float64) * (torch.rand(m, v, generator=g) > 0.2)
    p[:, 0], q[:, 1] = 1.0, 1.0
    q[5] = p[5]  # p = q: the first rejection empties the residual
    p, q = p / p.sum(1, keepdim=True), q / q.sum(1, keepdim=True)
    x = torch.stack([torch.randperm(v, generator=g)[:k] for _ in range(m)])
    x[1, 2] = x[1, 0]  # a duplicate draw (with replacement only: taken out below for RRSw)
    active = torch.ones(m, k, dtype=torch.bool)
    active[2, 1] = False  # an inactive column between active ones
    active[3, 3] = False
    return p.to(device, dtype), q.to(device, dtype), x.to(device), active.to(device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["f64", "f32"])
@pytest.mark.parametrize("wor", [False, True], ids=["specinfer", "rrsw"])
def test_the_fused_rrs_rows_give_the_torch_states(fused, device, dtype, wor) -> None:
    p, q, x, active = _rrs_rows(device, dtype)
    if wor:
        x[1, 2] = (x[1, 0] + 1) % p.shape[1] if (x[1] != (x[1, 0] + 1) % p.shape[1]).all() else x[1, 2]
    kernels.FUSED[0] = False
    a_t, r_t = rrs.rrs_states(p, q, x, active, wor)
    kernels.FUSED[0] = True
    a_f, r_f = rrs.rrs_states(p, q, x, active, wor)
    assert kernels.FUSED[0], "the kernel failed: the torch code ran"
    tol = 1e-12 if dtype is torch.float64 else 1e-6
    assert torch.allclose(a_t, a_f, rtol=0, atol=tol), (a_t, a_f)
    assert torch.allclose(r_t, r_f, rtol=0, atol=tol)
    assert ((a_t > 0) & (a_t < 1)).any() and (a_t == 0).any()  # the cases test something


@pytest.mark.parametrize(("name", "wor"), [("specinfer", False), ("rrsw", True)])
def test_the_fused_rrs_rows_have_the_exact_law_and_the_control_is_caught(fused, name, wor) -> None:
    shape = TreeShape.iid(2, 2) if not wor else TreeShape.without_replacement((2, 1))
    vocab = 3
    inst = random_instance(2, vocab, zero_frac=0.0)
    law = output_law(_states_verifier(wor), shape, inst.draft_fn, inst.target_fn)
    tv, mass = completed_tv(law, inst.target_fn, vocab, shape.depth + 1)
    assert abs(mass - 1.0) < 1e-12 and tv < 1e-9, (name, tv)
    if wor:  # RRSw's trees solved with replacement: the rejected token stays in q'
        wrong = _states_verifier(True, lambda p, q, x, a, _: rrs.rrs_states(p, q, x, a, False))
        lossy = output_law(wrong, shape, inst.draft_fn, inst.target_fn)
        assert completed_tv(lossy, inst.target_fn, vocab, shape.depth + 1)[0] > 1e-3
    assert kernels.FUSED[0]  # the kernel ran throughout


@pytest.mark.parametrize("device", DEVICES)
def test_the_fused_search_accepts_the_torch_codes_node_and_token(fused, device) -> None:
    """traversal_on_device with the kernels (states and the bottom-up search) and without, from one generator
    state: the same accepted node and token on every tree (float64 rows), over many seeds, rejections included.
    """
    from adaptive_spec.verifiers.traversal import traversal_on_device

    trees = [(name, lambda tree=tree: tree, target) for name, tree, target in _host_trees(device)]
    for case in range(len(SLOT_TREES)):  # slot trees: which slots are nodes, and the merge, decided in the launches
        for instance in (3, 4, 5):
            make, target = _slot_case(*SLOT_TREES[case], seed=instance, device=device)

            def fresh(make=make):  # tokens on the device, as the engine's (a verification reads them)
                tree = make()
                tree.draft_probs = tree.draft_probs.double()
                return tree

            trees.append((f"slot tree {case}, instance {instance}", fresh, target.double().to(device)))
    depths = set()
    for name, make, target in trees:
        for seed in range(12):
            out = []
            for on in (False, True):
                kernels.FUSED[0] = on
                g = torch.Generator(device).manual_seed(seed)
                tree = make()
                r = traversal_on_device(tree, target, g)
                out.append((r.node, r.tokens))
            assert kernels.FUSED[0], "a kernel failed: the torch code ran"
            assert out[0] == out[1], (name, seed, out)
            depths.add(tree.depths[out[0][0]])
    assert len(depths) > 1  # stops at different depths: the search was exercised


_COMPILE = """
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from adaptive_spec.engine import _triton_draft as d
from adaptive_spec.verifiers import _triton as k


def ptx(fn, signature, constexprs):  # compute capability 9.0: an H100 or H200
    sig = {**signature, **dict.fromkeys(constexprs, "constexpr")}
    source = ASTSource(fn=fn, signature=sig, constexprs=constexprs)
    return triton.compile(source, target=GPUTarget("cuda", 90, 32)).asm["ptx"]


ints = dict.fromkeys(("row0", "cand_stride", "tok_stride", "act_stride", "V", "K"), "i32")
rows = {"p_ptr": "*fp32", "q_ptr": "*fp32", "out_ptr": "*fp32", "w_ptr": "*fp64"}
tables = {"par_ptr": "*i64", "cand_ptr": "*i64", "tok_ptr": "*i64", "act_ptr": "*i1", "node_ptr": "*i1"}
search = {"par_ptr": "*i64", "cand_ptr": "*i64", "tok_ptr": "*i64", "act_ptr": "*i1", "found_ptr": "*i1"}
search |= {"first_ptr": "*i64", **dict.fromkeys(("row0", "cand_stride", "tok_stride", "act_stride", "K"), "i32")}
rrs = {"p_ptr": "*fp32", "q_ptr": "*fp32", "x_ptr": "*i64", "act_ptr": "*i1", "accept_ptr": "*fp64"}
rrs |= {"frozen_ptr": "*fp64", "out_ptr": "*fp32", **dict.fromkeys(("x_stride", "act_stride", "V", "K"), "i32")}
for parents in (True, False):  # a policy tree's levels; a slot tree's (its nodes and merge in the kernels)
    flags = {"ZERO": True, "PARENTS": parents, "NODES": not parents, "MERGE": not parents, "BLOCK": 4096}
    assert ".entry traversal_level_kernel" in ptx(k.traversal_level_kernel, {**rows, **tables, **ints}, flags)
    flags = {"PARENTS": parents, "MERGE": not parents}
    assert ".entry traversal_search_kernel" in ptx(k.traversal_search_kernel, search, flags)
for wor in (True, False):
    assert ".entry rrs_rows_kernel" in ptx(k.rrs_rows_kernel, rrs, {"WOR": wor, "BLOCK": 4096})
draft = {"r_ptr": "*fp32", "r_stride": "i32", "cand_ptr": "*i64", "work_ptr": "*i64", "pp_ptr": "*fp64"}
draft |= {"anc_ptr": "*i1", "allowed_ptr": "*i1"}
draft |= dict.fromkeys("F W G depth M top_k tok_off par_off depth_off draw_off child_off".split(), "i32")
draft |= dict.fromkeys("state_off fed_off fr_off next_off feed_off pp_in pp_out P is_last".split(), "i32")
flags = {"BE": 32, "BG": 16, "BC": 64}  # the drafting kernel (adaptive_spec.engine.draft_kernels): a plan's one
assert ".entry eagle_iid_level_kernel" in ptx(d.eagle_iid_level_kernel, draft, flags)
print("compiled")
"""


def test_the_kernels_compile_for_a_hopper_gpu_without_one(tmp_path) -> None:
    """What the GPU machine will compile (float32 rows, the engine's variants), compiled here to PTX by Triton's own
    compiler and ptxas, in a process of its own (not in the interpreter): a kernel that Triton cannot compile fails
    here, not on the first GPU lease.
    """
    pytest.importorskip("triton.backends.nvidia")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path)  # compiled now, not read from an earlier compile
    done = subprocess.run([sys.executable, "-c", _COMPILE], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and "compiled" in done.stdout, done.stderr[-3000:]
