"""When generation stops: EOS and stop token ids, stop strings, transformers stopping criteria, the budget.

:func:`emit` applies them to one step's tokens, in that order, and says why generation ends;
the other helpers check the user's stop conditions once, when the request is built.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from adaptive_spec.engine.settings import token_id

if TYPE_CHECKING:
    from adaptive_spec.engine.outputs import EngineState
    from adaptive_spec.engine.request import GenerationRequest


def emit(request: GenerationRequest, state: EngineState, emitted: list[int], tokenizer: Any) -> tuple[list[int], str]:
    """Append a step's tokens to the context, cut at the budget, EOS, a stop string or a criterion.

    Returns the tokens emitted and the finish reason ("" to go on).
    """
    remaining = request.budget - len(state.generated)
    emitted = emitted[:remaining]
    reason = "max_new_tokens" if len(emitted) == remaining else ""
    for i, tok in enumerate(emitted):
        if tok in request.eos:
            emitted, reason = emitted[: i + 1], "eos"
            break
    before = len(state.generated)
    state.context.extend(emitted)
    if request.stop_strings:
        cut = stop_string_cut(tokenizer, state.generated, before, request.stop_strings)
        if cut is not None:
            del state.context[state.prompt_length + cut :]
            emitted, reason = state.generated[before:], "stop"
    if request.criteria:
        cut = criteria_cut(request.criteria, state.context, state.prompt_length + before)
        if cut is not None:
            del state.context[cut:]
            emitted, reason = state.generated[before:], "stop"
    window_full = request.budget < request.max_new_tokens and len(state.generated) == request.budget
    if reason == "max_new_tokens" and window_full:
        reason = "context_window"
    return emitted, reason


CRITERIA = ("MaxLengthCriteria", "MaxTimeCriteria", "StopStringCriteria", "EosTokenCriteria")


def check_stopping_criteria(criteria: Any) -> list:
    """The user's stopping criteria, checked to be ones that read only the token ids."""
    if criteria is None:
        return []
    if not isinstance(criteria, (list, tuple)) and type(criteria).__name__ != "StoppingCriteriaList":
        criteria = [criteria]
    for c in criteria:
        if type(c).__name__ not in CRITERIA:
            raise ValueError(
                f"stopping criterion {type(c).__name__} is not supported: speculative steps emit several tokens "
                f"without per-token scores; supported: {', '.join(CRITERIA)} (or stop= strings and token ids)"
            )
    return list(criteria)


def criteria_cut(criteria: Sequence[Any], context: list[int], first_new: int) -> int | None:
    """The context length at the first newly emitted token that meets a criterion, or None."""
    for end in range(first_new + 1, len(context) + 1):
        ids = torch.tensor([context[:end]])
        if any(bool(c(ids, None).any()) for c in criteria):
            return end
    return None


def split_stop(stop: Sequence[str | int] | str | None, vocab_size: int) -> tuple[list[str], set[int]]:
    if stop is None:
        return [], set()
    if isinstance(stop, (str, int)) or not isinstance(stop, Sequence):
        stop = [stop]
    strings, ids = [], set()
    for s in stop:
        if isinstance(s, str) and s:
            strings.append(s)
            continue
        try:
            tok = token_id(s, "stop")
        except ValueError:
            raise ValueError(f"stop entries must be non-empty strings or token ids, got {s!r}") from None
        if not 0 <= tok < vocab_size:
            raise ValueError(f"stop token id {tok} is outside the vocabulary [0, {vocab_size})")
        ids.add(tok)
    return strings, ids


def stop_string_cut(tokenizer: Any, generated: list[int], before: int, stop_strings: Sequence[str]) -> int | None:
    """Smallest token count whose decoded text contains a stop string (None if there is none).

    ``before``: the token count before this step; the text of those tokens held no stop string.
    """
    decode = tokenizer.decode
    if not any(s in decode(generated, skip_special_tokens=True) for s in stop_strings):
        return None
    for n in range(before + 1, len(generated) + 1):
        text = decode(generated[:n], skip_special_tokens=True)
        if any(s in text for s in stop_strings):
            return n
    return len(generated)


def cut_at_stop(text: str, stop_strings: Sequence[str]) -> str:
    """``text`` cut right after the earliest-ending occurrence of any stop string (unchanged if none occurs)."""
    ends = [text.find(s) + len(s) for s in stop_strings if s in text]
    return text[: min(ends)] if ends else text
