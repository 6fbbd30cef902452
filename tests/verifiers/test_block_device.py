"""Block verification on the rows' device (``verify_block`` with a ``torch.Generator``) has BV's law exactly.

The device path computes every ``h_i`` and candidate row at once (:func:`chain_block_law`) and draws
``(τ, token)`` on the device (:func:`chain_block_draw`), read back once. Its law is replayed through the enumeration
sampler and compared, per chain case, with the backward scan's enumerated law and with the target law
(TV < 1e-9); wrong variants are caught; the draw's frequencies match the law it is given, and a wrong draw
fails the same check.
"""

from __future__ import annotations

import pytest
import torch

from adaptive_spec.analysis.exact import completed_tv, output_law
from adaptive_spec.analysis.instances import divergence_instance, random_instance
from adaptive_spec.trees import DraftLaw, DraftTree, TreeShape
from adaptive_spec.verifiers.base import result_for
from adaptive_spec.verifiers.block import chain_block_draw, chain_block_law, verify_block
from tests.helpers.verifier_cases import cases_for

TV_TOL = 1e-9
CAUGHT = 1e-3


def tau_probs(h: torch.Tensor) -> torch.Tensor:
    """P(τ = i) of the backward scan: ``h_i`` times the chance that every later position was rejected."""
    g = h.numel() - 1
    out = torch.zeros(g + 1, dtype=torch.float64)
    later = 1.0  # prod_{j > i} (1 - h_j)
    for i in range(g, 0, -1):
        out[i] = float(h[i]) * later
        later *= 1.0 - float(h[i])
    out[0] = later
    return out


def replayed(law_fn=chain_block_law, tau_fn=tau_probs):
    """A verifier that emits what :func:`chain_block_draw` samples from ``law_fn``'s output, through a sampler."""

    def fn(tree, target_probs, sampler):
        h, rows = law_fn(target_probs, tree.draft_probs, tree.tokens_tensor()[1:])
        tau = sampler.categorical(tau_fn(h))
        token = sampler.categorical(rows[tau])
        return result_for(tree, tau, token, bonus=tau == tree.num_nodes - 1)

    return fn


def _tv(a: dict, b: dict) -> float:
    return 0.5 * sum(abs(a.get(k, 0.0) - b.get(k, 0.0)) for k in set(a) | set(b))


def test_the_device_law_is_the_backward_scans_law_on_every_chain_case() -> None:
    cases = cases_for(DraftLaw.CHAIN)
    assert len(cases) >= 51
    worst_scan = worst_target = 0.0
    for inst, shape in cases:
        device = output_law(replayed(), shape, inst.draft_fn, inst.target_fn)
        scan = output_law(verify_block, shape, inst.draft_fn, inst.target_fn)  # the enumeration sampler: the scan
        worst_scan = max(worst_scan, _tv(device, scan))
        tv, mass = completed_tv(device, inst.target_fn, inst.vocab, shape.depth + 1)
        assert abs(mass - 1.0) < 1e-12
        worst_target = max(worst_target, tv)
    assert worst_scan < TV_TOL and worst_target < TV_TOL


def _unclipped_law(target_probs, draft_probs, tokens):
    """Wrong: the weights without min(1, .) (the plain cumulative ratio)."""
    P, Q = target_probs.double(), draft_probs.double()
    h, rows = chain_block_law(target_probs, draft_probs, tokens)
    pe = P[:-1].gather(1, tokens[:, None]).squeeze(1)
    qe = Q[:-1].gather(1, tokens[:, None]).squeeze(1)
    w = torch.cat([P.new_ones(1), torch.where(qe > 0, pe / qe, 0.0).cumprod(0)])
    return torch.cat([h[:-1], w[-1:].clamp(max=1.0) ** 0.5]), rows


def _forward_scan(h):
    """Wrong: stop at the smallest accepted position instead of the largest."""
    g = h.numel() - 1
    out = torch.zeros(g + 1, dtype=torch.float64)
    before = 1.0
    for i in range(1, g + 1):
        out[i] = float(h[i]) * before
        before *= 1.0 - float(h[i])
    out[0] = before
    return out


@pytest.mark.parametrize("variant", ["unclipped", "forward scan"])
def test_wrong_device_laws_are_caught(variant) -> None:
    fn = replayed(law_fn=_unclipped_law) if variant == "unclipped" else replayed(tau_fn=_forward_scan)
    worst = 0.0
    for seed in range(6):
        inst = random_instance(seed, 3, zero_frac=0.0)
        law = output_law(fn, TreeShape.chain(3), inst.draft_fn, inst.target_fn)
        worst = max(worst, completed_tv(law, inst.target_fn, inst.vocab, 4)[0])
    assert worst > CAUGHT


def _chain(inst, tokens):
    prefixes = [tuple(tokens[:i]) for i in range(len(tokens) + 1)]
    n = len(prefixes)
    tree = DraftTree(
        [-1, *tokens],
        list(range(-1, n - 1)),
        list(range(n)),
        torch.stack([inst.draft_fn(c) for c in prefixes]).float(),
        [[i + 1] for i in range(n - 1)] + [[]],
        TreeShape.chain(n - 1),
    )
    return tree, torch.stack([inst.target_fn(c) for c in prefixes]).float()


def _empirical(draw, h, rows, runs: int, seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    counts: dict = {}
    for _ in range(runs):
        key = draw(h, rows, g)
        counts[key] = counts.get(key, 0) + 1
    return {k: v / runs for k, v in counts.items()}


def test_the_draw_follows_the_law_and_a_wrong_draw_fails() -> None:
    inst = divergence_instance(2, 4, 0.5)
    tree, target = _chain(inst, [3, 1, 1])
    h, rows = chain_block_law(target, tree.draft_probs, tree.tokens_tensor()[1:])
    tp = tau_probs(h)
    exact = {(t, y): float(tp[t] * rows[t][y] / rows[t].sum()) for t in range(4) for y in range(4) if rows[t][y] > 0}
    assert sum(exact.values()) == pytest.approx(1.0)
    assert min(tp.tolist()) > 0.2  # every τ occurs often enough to be checked

    def wrong(h, rows, g):  # the smallest accepted position
        u = torch.rand(h.numel(), generator=g, dtype=torch.float64)
        ok = [i for i in range(1, h.numel()) if u[i] < h[i]]
        tau = ok[0] if ok else 0
        return tau, int(torch.multinomial(rows[tau], 1, generator=g))

    def device(h, rows, g):
        return tuple(torch.cat(chain_block_draw(h, rows, g)).tolist())

    runs = 6000
    assert _tv(_empirical(device, h, rows, runs), exact) < 0.035
    assert _tv(_empirical(wrong, h, rows, runs), exact) > 0.05
    # through verify_block with a torch.Generator: the device path, the same law
    sampler = _sampler(torch.Generator().manual_seed(1))
    counts: dict = {}
    for _ in range(runs):
        r = verify_block(tree, target, sampler)
        key = (r.node, r.tokens[-1])
        counts[key] = counts.get(key, 0) + 1
    assert _tv({k: v / runs for k, v in counts.items()}, exact) < 0.035


def _sampler(g):
    from adaptive_spec.rng import TorchSampler

    return TorchSampler(g)


def test_a_torch_generator_takes_the_device_path(monkeypatch) -> None:
    import adaptive_spec.verifiers.block as block

    calls = []
    real = block.chain_block_draw
    monkeypatch.setattr(block, "chain_block_draw", lambda *a: calls.append(1) or real(*a))
    inst = random_instance(0, 3, zero_frac=0.0)
    tree, target = _chain(inst, [1, 2])
    block.verify_block(tree, target, _sampler(torch.Generator().manual_seed(0)))
    assert calls == [1]
