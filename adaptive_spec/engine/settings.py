"""Generation settings: transformers' precedence, and integer arguments checked once.

:func:`resolve_generation` merges explicit arguments, a ``GenerationConfig`` argument and the
target's own ``generation_config`` as transformers does; :func:`token_id` and :func:`as_int`
check integer arguments without truncating floats or bools.
"""

from __future__ import annotations

import numbers
import operator
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch


def token_id(x: Any, what: str) -> int:
    """``x`` as a token id: Python or numpy integers only (floats, bools and bytes are refused, not truncated)."""
    if isinstance(x, (bool, float, bytes, str)):
        raise ValueError(f"{what} token ids must be integers, got {x!r}")
    if isinstance(x, torch.Tensor):
        if x.numel() != 1 or x.is_floating_point():
            raise ValueError(f"{what} token ids must be integers, got a tensor {x!r}")
        return int(x.item())
    try:
        return operator.index(x)
    except TypeError:
        raise ValueError(f"{what} token ids must be integers, got {type(x).__name__} {x!r}") from None


def as_int(x: Any, name: str, minimum: int) -> int:
    """``x`` as an int >= ``minimum``; numpy integers are accepted, floats and bools are not."""
    if isinstance(x, bool):
        raise ValueError(f"{name} must be an integer >= {minimum}, got {x!r}")
    try:
        value = operator.index(x)
    except TypeError:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {x!r}") from None
    if value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value}")
    return value


@dataclass
class GenerationSettings:
    """Generation settings after transformers' precedence (see :func:`resolve_generation`).

    Attributes:
        max_new_tokens: the new-token budget, or None (then ``max_length``, else 32).
        max_length: prompt plus new tokens, used only when ``max_new_tokens`` is None.
        temperature: 0 = greedy.
        top_k: 0 disables top-k.
        top_p: 1 disables nucleus sampling.
        eos_token_ids: the EOS ids of the ``generation_config`` argument, or None (then the
            target's own, as the engine found them).
        stop_strings: stop strings from a generation config.
        processors: row-wise warpers built from ``min_p``, ``typical_p`` and ``epsilon_cutoff``.
    """

    max_new_tokens: int | None
    max_length: int | None
    temperature: float
    top_k: int
    top_p: float
    eos_token_ids: set[int] | None = None
    stop_strings: list[str] = field(default_factory=list)
    processors: list[Any] = field(default_factory=list)


# GenerationConfig fields that would need history-dependent processors, beams or several
# sequences: refused in a generation_config argument, ignored with a warning in the model's own.
UNSUPPORTED_FIELDS = (
    "repetition_penalty",
    "encoder_repetition_penalty",
    "no_repeat_ngram_size",
    "encoder_no_repeat_ngram_size",
    "min_length",
    "min_new_tokens",
    "bad_words_ids",
    "sequence_bias",
    "num_beams",
    "num_beam_groups",
    "num_return_sequences",
    "penalty_alpha",
    "eta_cutoff",
    "forced_bos_token_id",
    "forced_eos_token_id",
    "suppress_tokens",
    "begin_suppress_tokens",
    "exponential_decay_length_penalty",
    "guidance_scale",
    "watermarking_config",
    "renormalize_logits",
    "top_h",
)
_NEUTRAL = {
    "repetition_penalty": 1.0,
    "encoder_repetition_penalty": 1.0,
    "no_repeat_ngram_size": 0,
    "encoder_no_repeat_ngram_size": 0,
    "min_length": 0,
    "min_new_tokens": 0,
    "num_beams": 1,
    "num_beam_groups": 1,
    "num_return_sequences": 1,
    "eta_cutoff": 0.0,
    "guidance_scale": 1.0,
    "renormalize_logits": False,
}


def resolve_generation(
    config: Any,
    model_config: Any = None,
    *,
    max_new_tokens: Any = None,
    temperature: Any = None,
    top_k: Any = None,
    top_p: Any = None,
) -> GenerationSettings:
    """Merge generation settings as transformers does: explicit arguments > ``config`` > ``model_config`` > defaults.

    Each ``GenerationConfig`` field that the explicit arguments leave out is taken from
    ``config`` (the ``generation_config=`` argument) if set there, else from ``model_config``
    (the target's ``generation_config``), else from the engine's defaults (32 new tokens,
    sampling at temperature 1, no top-k or top-p). ``do_sample=False`` means temperature 0
    unless ``temperature`` is explicit. ``max_new_tokens`` wins over ``max_length``, as in
    transformers.

    Raises:
        TypeError: ``config`` is not a ``GenerationConfig``.
        ValueError: ``config`` asks for something that is not lossless with speculative decoding
            (repetition penalty, n-gram bans, minimum lengths, beams, ...).
    """
    from transformers import GenerationConfig

    if config is not None and not isinstance(config, GenerationConfig):
        raise TypeError(f"generation_config must be a transformers GenerationConfig, got {type(config).__name__}")
    sources = [c for c in (config, model_config) if isinstance(c, GenerationConfig)]
    _check_supported(sources, config)

    def pick(name: str) -> Any:
        for src in sources:
            value = getattr(src, name, None)
            if value is not None:
                return value
        return None

    if temperature is None:
        if pick("do_sample") is False:
            temperature = 0.0
        else:
            temperature = pick("temperature")
            temperature = 1.0 if temperature is None else temperature
    top_k = top_k if top_k is not None else (pick("top_k") or 0)
    top_p = top_p if top_p is not None else (pick("top_p") if pick("top_p") is not None else 1.0)
    sampling = not (isinstance(temperature, numbers.Real) and not isinstance(temperature, bool) and temperature == 0)
    processors = _row_warpers(pick) if sampling else []
    eos = getattr(config, "eos_token_id", None) if config is not None else None
    eos_ids = None
    if eos is not None:
        eos_ids = {token_id(e, "eos") for e in ([eos] if not isinstance(eos, (list, tuple)) else eos)}
    stop_strings = pick("stop_strings") or []
    return GenerationSettings(
        max_new_tokens=max_new_tokens if max_new_tokens is not None else pick("max_new_tokens"),
        max_length=None if max_new_tokens is not None else pick("max_length"),
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        eos_token_ids=eos_ids,
        stop_strings=[stop_strings] if isinstance(stop_strings, str) else list(stop_strings),
        processors=processors,
    )


def _check_supported(sources: Sequence[Any], config: Any) -> None:
    """Refuse (in the ``generation_config`` argument) or ignore with a warning (in the model's own) any
    setting that is not lossless with speculative decoding.
    """
    import warnings

    for src in sources:
        bad = [
            f"{name}={getattr(src, name)!r}"
            for name in UNSUPPORTED_FIELDS
            if getattr(src, name, None) is not None and getattr(src, name) != _NEUTRAL.get(name)
        ]
        if not bad:
            continue
        what = ", ".join(bad)
        if src is config:
            raise ValueError(
                f"generation_config sets {what}: not supported, speculative decoding stays lossless only with "
                "row-wise settings (temperature, top_k, top_p, min_p, typical_p, epsilon_cutoff); unset it"
            )
        warnings.warn(
            f"the target's generation_config sets {what}: ignored (not lossless with speculative "
            "decoding); pass generation_config= to override",
            UserWarning,
            stacklevel=5,
        )


def _row_warpers(pick: Any) -> list[Any]:
    """The row-wise warpers of ``min_p``, ``typical_p`` and ``epsilon_cutoff`` (``pick(name)``: the merged field)."""
    from transformers.generation.logits_process import EpsilonLogitsWarper, MinPLogitsWarper, TypicalLogitsWarper

    processors: list[Any] = []
    if pick("min_p") is not None:
        processors.append(MinPLogitsWarper(float(pick("min_p"))))
    if pick("typical_p") is not None and float(pick("typical_p")) < 1.0:
        processors.append(TypicalLogitsWarper(float(pick("typical_p"))))
    if pick("epsilon_cutoff") is not None and float(pick("epsilon_cutoff")) > 0.0:
        processors.append(EpsilonLogitsWarper(float(pick("epsilon_cutoff"))))
    return processors
