"""Sampling settings at the model boundary: ``GenerationConfig`` -> ``LogitsProcessorList`` -> probabilities.

The same processors are applied to the draft's and the target's logits (docs/algorithms.md §2: the
distributions used for drafting and verification must be the ones actually sampled from).
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Any

import torch
from transformers import GenerationConfig, LogitsProcessorList
from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

# Below this, logits / temperature can overflow float32 (NaN probabilities); 0 means greedy.
MIN_TEMPERATURE = 1e-4


@dataclass(frozen=True)
class SamplingConfig:
    """Validated sampling settings, following transformers' conventions.

    Attributes:
        temperature: 0 means greedy decoding (argmax, ties to the lowest token id); > 0 samples
            from ``softmax(logits / temperature)``.
        top_k: keep the ``top_k`` most likely tokens (0 disables it).
        top_p: nucleus sampling mass in (0, 1] (1 disables it).
    """

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0

    def __post_init__(self) -> None:
        # numpy scalars are numbers.Real / numbers.Integral: accepted and stored as Python numbers.
        t = self.temperature
        if isinstance(t, bool) or not isinstance(t, numbers.Real) or not math.isfinite(t) or t < 0:
            raise ValueError(f"temperature must be a finite number >= 0 (0 = greedy), got {t!r}")
        if 0 < t < MIN_TEMPERATURE:
            raise ValueError(
                f"temperature {float(t)!r} is too small to sample from (logits / temperature overflow float32); "
                f"use temperature=0 for greedy decoding, or a temperature >= {MIN_TEMPERATURE}"
            )
        object.__setattr__(self, "temperature", float(t))
        k = self.top_k
        if isinstance(k, bool) or not isinstance(k, numbers.Integral) or k < 0:
            raise ValueError(f"top_k must be an integer >= 0 (0 disables top-k), got {k!r}")
        object.__setattr__(self, "top_k", int(k))
        p = self.top_p
        if isinstance(p, bool) or not isinstance(p, numbers.Real) or not (0.0 < p <= 1.0):
            raise ValueError(f"top_p must be in (0, 1] (1 disables nucleus sampling), got {p!r}")
        object.__setattr__(self, "top_p", float(p))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def generation_config(self) -> GenerationConfig:
        """The equivalent transformers ``GenerationConfig``."""
        if self.greedy:
            return GenerationConfig(do_sample=False)
        return GenerationConfig(
            do_sample=True, temperature=float(self.temperature), top_k=self.top_k or None, top_p=float(self.top_p)
        )


def build_logits_processor(config: GenerationConfig) -> LogitsProcessorList:
    """Sampling warpers for ``config`` in transformers' order: temperature, top-k, top-p.

    Only the warpers are built (no repetition penalties or other history-dependent
    processors): those would make the draft and target laws depend on the tree branch.
    """
    procs = LogitsProcessorList()
    if not config.do_sample:
        return procs
    if config.temperature is not None and float(config.temperature) != 1.0:
        procs.append(TemperatureLogitsWarper(float(config.temperature)))
    if config.top_k:
        procs.append(TopKLogitsWarper(top_k=int(config.top_k)))
    if config.top_p is not None and float(config.top_p) < 1.0:
        procs.append(TopPLogitsWarper(top_p=float(config.top_p)))
    return procs


# Logits processors that act on each row of scores alone, without reading the token history
# (``input_ids``): applied identically to the draft's and the target's rows at every tree node,
# they keep speculative decoding lossless. History-dependent ones (repetition penalties, n-gram
# bans, minimum lengths, bad-word sequences, watermarks, ...) would give each tree branch other
# rules than the context it stands for, so they are refused.
ROW_WISE_PROCESSORS = (
    "TemperatureLogitsWarper",
    "TopKLogitsWarper",
    "TopPLogitsWarper",
    "MinPLogitsWarper",
    "TypicalLogitsWarper",
    "EpsilonLogitsWarper",
    "EtaLogitsWarper",
    "TopHLogitsWarper",
    "SuppressTokensLogitsProcessor",
    "InfNanRemoveLogitsProcessor",
)


def check_logits_processors(processors: Any) -> list:
    """The user's ``logits_processor`` list, checked to hold only row-wise processors.

    Raises:
        ValueError: naming the processor that depends on the token history and the accepted ones.
    """
    if processors is None:
        return []
    if not isinstance(processors, (list, tuple, LogitsProcessorList)):
        processors = [processors]
    out = []
    for proc in processors:
        name = type(proc).__name__
        if name not in ROW_WISE_PROCESSORS:
            raise ValueError(
                f"logits processor {name} is not supported: speculative decoding stays lossless only with "
                f"processors that act on each row alone ({', '.join(ROW_WISE_PROCESSORS)}); "
                "history-dependent ones (repetition penalties, n-gram bans, minimum lengths) are refused"
            )
        out.append(proc)
    return out


class ProbsFn:
    """Turns raw logits rows into the next-token distributions used for sampling.

    ``__call__(logits)`` maps Tensor[n, V'] (any float dtype) to float32 Tensor[n, vocab_size]:
    extra logits are cut, and missing ones (a draft with a smaller vocabulary than the target)
    count as -inf, i.e. probability 0; so do the ids outside a reduced draft vocabulary, whose
    logits columns ``token_ids`` (LongTensor[V']) maps to target ids. With ``one_hot`` (the target at
    temperature 0) each row is one-hot at its argmax; otherwise the processors are applied and a
    softmax taken.
    """

    def __init__(
        self, processors: LogitsProcessorList, vocab_size: int, one_hot: bool, token_ids: torch.Tensor | None = None
    ) -> None:
        self.processors = processors
        self.vocab_size = vocab_size
        self.one_hot = one_hot
        self.token_ids = token_ids

    #: Processors whose settings are plain numbers, which a captured graph of this function bakes in.
    CAPTURABLE = (TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper)

    def graph_key(self) -> tuple | None:
        """What a captured graph of this function bakes into its kernels (the vocabulary size, one-hot rows, whether a
        reduced vocabulary is mapped, every processor's settings), or None when a processor is not one of
        :data:`CAPTURABLE` (its state may hold tensors that a graph would read after they are gone).
        """
        procs = []
        for proc in self.processors:
            if type(proc) not in self.CAPTURABLE:
                return None
            procs.append((type(proc).__name__, tuple(sorted((k, repr(v)) for k, v in vars(proc).items()))))
        return self.vocab_size, self.one_hot, self.token_ids is not None, tuple(procs)

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        if self.token_ids is not None:  # a reduced vocabulary: column j is token token_ids[j], the rest -inf
            scores = torch.full((*logits.shape[:-1], self.vocab_size), -math.inf, device=logits.device)
            scores[..., self.token_ids] = logits.float()
        else:
            scores = logits if logits.shape[-1] <= self.vocab_size else logits[..., : self.vocab_size]  # [n, V]
            scores = scores if scores.dtype == torch.float32 else scores.float()  # a no-op call is an op too
        if scores.shape[-1] < self.vocab_size:
            scores = torch.nn.functional.pad(scores, (0, self.vocab_size - scores.shape[-1]), value=-math.inf)
        if len(self.processors):
            # The processors used here never read input_ids; an empty placeholder keeps the signature.
            placeholder = torch.empty(scores.shape[0], 0, dtype=torch.long, device=scores.device)
            scores = self.processors(placeholder, scores)
        if self.one_hot:
            out = torch.zeros_like(scores)
            return out.scatter_(-1, scores.argmax(dim=-1, keepdim=True), 1.0)
        return torch.softmax(scores, dim=-1)


def finite_flag(logits: torch.Tensor, probs: torch.Tensor | None = None) -> torch.Tensor:
    """0-dim bool tensor: are all ``logits`` (and the ``probs`` made from them) finite? No host sync.

    The probabilities are checked after processing too: a row can overflow in the processors
    (a tiny temperature) although the raw logits are finite.
    """
    total = logits.sum(dtype=torch.float32)
    if probs is not None:  # one flag for both: a NaN or inf in either makes the sum so
        total = total + probs.sum(dtype=torch.float32)
    return (total - total) == 0  # NaN for a NaN or an inf: two ops, where isfinite takes four


def rows_ok(probs: torch.Tensor) -> torch.Tensor:
    """0-dim bool tensor: are the probability rows ``probs`` free of NaN? No host sync.

    Softmax rows are NaN wherever their logits were not finite, and a sum of probabilities cannot overflow, so
    this is their finiteness, in two ops.
    """
    total = probs.sum()
    return total == total
