"""Generation statistics and per-phase timing."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

PHASES = ("draft", "target", "verify", "other")


@dataclass
class GenerationStats:
    """Statistics of one ``generate`` call.

    Attributes:
        new_tokens: tokens generated.
        steps: decoding steps (one target pass each, after the prefill).
        target_forwards: target forward passes, prefill included.
        draft_forwards: draft forward passes, prefill included.
        accept_lengths: accepted draft tokens τ per step (0 for autoregressive steps).
        tree_sizes: draft tree nodes per step, root included.
        wall_time_s: wall-clock seconds of the whole call (prefill included).
        phase_times_s: seconds per phase. ``draft`` and ``target`` are the models' forwards
            (their prefills included) plus turning logits into probabilities and, for the
            draft, sampling the tree; ``verify`` is the verifier; ``other`` is the rest
            (cache commits, bookkeeping, stop checks). On CUDA these are host times unless the
            engine was made with ``phase_sync=True``: the device's work lands in the phase that
            waits for it (the step's host read); the sum per step is the step's time either way.
        stop_reason: ``"eos"``, ``"stop"``, ``"max_new_tokens"`` or ``"context_window"``.
        policy_levels: draft levels grown by a drafting policy (dynamic plans only).
        policy_decision_s: seconds spent in the policy's decisions at those levels (building
            its node views and calling ``widths``/``feed``), inside the draft phase.
    """

    new_tokens: int = 0
    steps: int = 0
    target_forwards: int = 0
    draft_forwards: int = 0
    accept_lengths: list[int] = field(default_factory=list)
    tree_sizes: list[int] = field(default_factory=list)
    wall_time_s: float = 0.0
    phase_times_s: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PHASES, 0.0))
    stop_reason: str = ""
    policy_levels: int = 0
    policy_decision_s: float = 0.0

    @property
    def block_efficiency(self) -> float:
        """Tokens emitted per decoding target pass (1.0 for autoregressive decoding)."""
        return self.new_tokens / self.steps if self.steps else 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.wall_time_s if self.wall_time_s > 0 else 0.0

    @property
    def mean_accept_length(self) -> float:
        return sum(self.accept_lengths) / len(self.accept_lengths) if self.accept_lengths else 0.0

    @property
    def accept_histogram(self) -> dict[int, int]:
        """``{τ: number of steps}``."""
        return dict(sorted(Counter(self.accept_lengths).items()))

    def as_dict(self) -> dict:
        """A JSON-serialisable summary."""
        return {
            "new_tokens": self.new_tokens,
            "steps": self.steps,
            "target_forwards": self.target_forwards,
            "draft_forwards": self.draft_forwards,
            "block_efficiency": self.block_efficiency,
            "mean_accept_length": self.mean_accept_length,
            "accept_histogram": self.accept_histogram,
            "wall_time_s": self.wall_time_s,
            "tokens_per_s": self.tokens_per_s,
            "phase_times_s": dict(self.phase_times_s),
            "stop_reason": self.stop_reason,
            "policy_levels": self.policy_levels,
            "policy_decision_s": self.policy_decision_s,
        }


class PhaseTimer:
    """Accumulates wall time per phase; on CUDA it synchronises at phase boundaries when asked.

    ``sync`` adds one device sync per phase switch; it is what makes the split meaningful on
    an asynchronous device, and is a no-op on CPU.
    """

    def __init__(self, totals: dict[str, float], device: torch.device, sync: bool) -> None:
        self.totals = totals
        self.step: dict[str, float] = dict.fromkeys(PHASES, 0.0)
        self._sync = sync and device.type == "cuda"
        self._device = device
        self._phase: str | None = None
        self._t0 = 0.0

    def switch(self, phase: str | None) -> None:
        """End the current phase (if any) and start ``phase`` (None: stop timing)."""
        if self._sync:
            torch.cuda.synchronize(self._device)
        now = time.perf_counter()
        if self._phase is not None:
            dt = now - self._t0
            self.totals[self._phase] += dt
            self.step[self._phase] += dt
        self._phase, self._t0 = phase, now

    @contextmanager
    def phase(self, phase: str) -> Iterator[None]:
        """Time the block as ``phase``; the time after it counts as ``"other"`` until the next switch."""
        self.switch(phase)
        try:
            yield
        finally:
            self.switch("other")

    def take_step(self) -> dict[str, float]:
        """This step's per-phase times, and reset them."""
        out, self.step = self.step, dict.fromkeys(PHASES, 0.0)
        return out
