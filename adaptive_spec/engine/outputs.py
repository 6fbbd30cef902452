"""What :meth:`SpecEngine.generate <adaptive_spec.engine.SpecEngine.generate>` returns, and the state it mutates."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from adaptive_spec.engine.features import RootTracker
from adaptive_spec.engine.metrics import GenerationStats
from adaptive_spec.engine.runner import ModelRunner
from adaptive_spec.planner.plan import StepResult
from adaptive_spec.trees.lookup import NgramIndex


@dataclass
class GenerationResult:
    """The output of :meth:`SpecEngine.generate`.

    Attributes:
        token_ids: the generated tokens (EOS or the stop string included when generation
            ended on one), prompt excluded.
        text: ``token_ids`` decoded with special tokens skipped (None without a tokenizer).
        stats: counters and timings, see :class:`GenerationStats`.
        steps: one :class:`StepResult` per speculative step (empty for autoregressive decoding).
        state: the final :class:`EngineState` (models' caches included) when asked for with
            ``keep_state=True``, else None.
        finish_reason: ``"stop"`` or ``"length"`` (``stats.stop_reason`` has the detail:
            ``eos``, ``stop``, ``max_new_tokens`` or ``context_window``).
    """

    token_ids: list[int]
    text: str | None
    stats: GenerationStats
    steps: list[StepResult] = field(default_factory=list)
    state: EngineState | None = None

    @property
    def finish_reason(self) -> str:
        """Why generation stopped, as in vLLM's ``RequestOutput``: ``"stop"`` (an EOS token, a stop
        token or a stop string) or ``"length"`` (``max_new_tokens`` or the context window).
        """
        return "stop" if self.stats.stop_reason in ("eos", "stop") else "length"


@dataclass
class DeviceTail:
    """Committed tokens ``context[start:]`` that are on the device already (``tokens``), with their host values
    (``host``, compared with the context before use: a cut at a stop string makes the tail stale).
    """

    start: int
    host: list[int]
    tokens: torch.Tensor


@dataclass
class EngineState:
    """Everything one ``generate`` call mutates, passed explicitly through the loop.

    Attributes:
        context: committed tokens, prompt then generated.
        prompt_length: number of prompt tokens.
        target: the target model with its cache.
        draft: the draft model with its cache (None for autoregressive decoding).
        generator: the source of every random draw.
        stats: running statistics.
        steps: step results so far.
        root: the root-feature tracker, when features are computed (else None).
        tail: the last step's emitted tokens as they already are on the device, so that the next step feeds
            them without copying them over (:meth:`pending`); None before the first step.
        ngrams: the context's n-grams, indexed as it grows: what lookup drafts search (no scan of the context).
    """

    context: list[int]
    prompt_length: int
    target: ModelRunner
    draft: ModelRunner | None
    generator: torch.Generator
    stats: GenerationStats
    steps: list[StepResult] = field(default_factory=list)
    root: RootTracker | None = None
    tail: DeviceTail | None = None
    ngrams: NgramIndex = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.ngrams = NgramIndex(self.context)

    def pending(self, start: int, device: torch.device) -> torch.Tensor:
        """``context[start:]`` as a LongTensor on ``device``: a view of :attr:`tail` when it holds them (nothing is
        copied), else one host-to-device copy.
        """
        t = self.tail
        if t is not None and t.start <= start and self.context[t.start :] == t.host:
            return t.tokens if start == t.start else t.tokens[start - t.start :]
        return torch.tensor(self.context[start:], dtype=torch.long, device=device)

    @property
    def generated(self) -> list[int]:
        return self.context[self.prompt_length :]
