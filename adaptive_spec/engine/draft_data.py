"""The engine's side of draft-data logs (:mod:`adaptive_spec.formats.draft_log`): what it hands the logger.

:func:`log_draft_data` attaches a :class:`~adaptive_spec.formats.draft_log.DraftDataLogger` to an engine
(``engine.draft_data``). The engine then keeps the target's last hidden states of every row it feeds
(as for an EAGLE head) and, in speculative generations, calls :func:`log_prefill` after the prefill and
:func:`log_committed` after each step's commit. Autoregressive generations (no plan) log nothing.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from adaptive_spec.formats.draft_log import DraftDataLogger

__all__ = ["log_committed", "log_draft_data", "log_prefill"]


def log_draft_data(engine: Any, log: str | os.PathLike | DraftDataLogger, **kwargs: Any) -> DraftDataLogger:
    """Attach a draft-data logger (a directory, or a logger; ``kwargs`` go to a new one) to ``engine``."""
    logger = log if isinstance(log, DraftDataLogger) else DraftDataLogger(log, **kwargs)
    logger.attach(engine.describe(), hidden_size=int(engine.hidden_sizes[1]))
    engine.draft_data = logger
    return logger


def log_prefill(logger: DraftDataLogger, state: Any, temperature: float) -> None:
    """A new generation: the prompt, and the target's features of the prompt but its last token (the prefill)."""
    logger.temperature = float(temperature)
    logger.begin(state.context, state.target.features if state.target.cached else None)


def log_committed(
    logger: DraftDataLogger, state: Any, node_tokens: list[int], accepted: list[int], base: int, logits: torch.Tensor
) -> None:
    """One step's committed positions, after the target's commit and before the context is extended.

    The target's block was the pending tokens ``context[base:]`` (root last), then the drafted nodes;
    ``logits`` are its rows of the nodes (the root first). The committed positions are the pending
    tokens and the accepted nodes; those with a logits row (the root and the accepted nodes) get a law.
    """
    p = len(state.context) - base
    rows = [*range(p), *(p - 1 + a for a in accepted)]
    feats = state.target.features[torch.tensor(rows, device=state.target.features.device)]
    law = logits[torch.tensor([0, *accepted], device=logits.device)]
    logger.add(base, state.context[base:] + [node_tokens[a] for a in accepted], feats, law, p - 1)
