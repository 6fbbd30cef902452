"""The phase timer: a device sync per phase switch only when the engine asks for one (``phase_sync``)."""

from __future__ import annotations

import torch

from adaptive_spec.engine import SpecEngine
from adaptive_spec.engine.metrics import PHASES, PhaseTimer
from tests.helpers.tiny import perturbed, tiny_model


def _switches(monkeypatch, device: str, sync: bool) -> tuple[int, dict]:
    calls = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda d=None: calls.append(d))
    totals = dict.fromkeys(PHASES, 0.0)
    timer = PhaseTimer(totals, torch.device(device), sync)
    for phase in ("draft", "target", "verify"):
        with timer.phase(phase):
            pass
    return len(calls), totals


def test_phase_timer_syncs_only_on_cuda_when_asked(monkeypatch):
    synced, totals = _switches(monkeypatch, "cuda", True)
    assert synced == 6  # into and out of each of the three phases
    assert all(totals[p] > 0 for p in ("draft", "target", "verify"))
    assert _switches(monkeypatch, "cuda", False)[0] == 0  # the default: the host runs ahead of the device
    assert _switches(monkeypatch, "cpu", True)[0] == 0


def test_engine_phase_sync_is_off_by_default_and_reaches_the_timer(monkeypatch):
    target = tiny_model("llama", vocab=48, seed=3, eos=None)
    engine = SpecEngine(target, perturbed(target, 0.2, 4))
    assert engine.phase_sync is False
    made = []
    init = PhaseTimer.__init__

    def spy(self, totals, device, sync):
        made.append(sync)
        init(self, totals, device, sync)

    monkeypatch.setattr(PhaseTimer, "__init__", spy)
    engine.generate([5, 6, 7], max_new_tokens=4, temperature=0, plan="chain:2/block")
    engine.phase_sync = True
    out = engine.generate([5, 6, 7], max_new_tokens=4, temperature=0, plan="chain:2/block")
    assert made == [False, True]
    assert sum(out.stats.phase_times_s.values()) > 0
    assert SpecEngine(target, perturbed(target, 0.2, 4), phase_sync=True).phase_sync is True
