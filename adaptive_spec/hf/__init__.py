"""transformers integration: ``model.generate(..., custom_generate=custom_generate_dir(), assistant_model=draft)``.

transformers (>= 5) runs ``custom_generate/generate.py`` from the directory (or hub repo) given
as ``custom_generate=`` instead of its own decoding loop, when ``trust_remote_code=True``.
:func:`custom_generate_dir` is such a directory, shipped inside this package; its
``generate`` is :func:`speculative_generate`::

    import adaptive_spec
    out = target.generate(input_ids, max_new_tokens=64, assistant_model=draft,
                          custom_generate=adaptive_spec.custom_generate_dir(), trust_remote_code=True)

(``trust_remote_code=True`` is transformers' opt-in for running a ``generate.py`` from a
directory, local ones included; the file only imports this package.) The same call without
transformers' loader: ``adaptive_spec.hf.speculative_generate(target, input_ids,
assistant_model=draft, ...)``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["custom_generate_dir", "speculative_generate"]

# generate() keyword arguments that carry nothing when left at their defaults.
_IGNORED = {"synced_gpus", "use_model_defaults", "use_cache", "output_attentions", "output_hidden_states"}
_REFUSED_IF_SET = ("prefix_allowed_tokens_fn", "negative_prompt_ids", "negative_prompt_attention_mask")


def custom_generate_dir() -> str:
    """The directory to pass as ``model.generate(custom_generate=...)``: it holds ``custom_generate/generate.py``."""
    return str(Path(__file__).resolve().parent)


def speculative_generate(
    model: Any,
    inputs: Any = None,
    generation_config: Any = None,
    logits_processor: Any = None,
    stopping_criteria: Any = None,
    assistant_model: Any = None,
    streamer: Any = None,
    *,
    plan: Any = "auto",
    seed: int | None = None,
    **kwargs: Any,
) -> Any:
    """``model.generate`` with lossless speculative decoding: ``model`` is the target, ``assistant_model`` the draft.

    Takes ``model.generate``'s arguments and settings with transformers' precedence and defaults
    (keyword arguments > ``generation_config`` > ``model.generation_config`` > transformers'
    defaults: greedy unless ``do_sample=True``, ``max_length`` 20, top-k 50 when sampling), and
    returns what ``generate`` returns: a ``[1, prompt + new]`` tensor of token ids (or a
    ``GenerateDecoderOnlyOutput`` with only ``sequences`` when ``return_dict_in_generate=True``).
    Greedy output equals ``model.generate``'s greedy output; sampled output has the same law.

    Args:
        model: the target model.
        inputs: ``input_ids`` ``[1, n]`` (or pass ``input_ids=``); batches of one only.
        generation_config: a ``GenerationConfig``.
        logits_processor: row-wise processors only (see :meth:`SpecEngine.generate
            <adaptive_spec.engine.SpecEngine.generate>`).
        stopping_criteria: criteria that read only the token ids (``MaxLengthCriteria``,
            ``MaxTimeCriteria``, ``StopStringCriteria``, ``EosTokenCriteria``).
        assistant_model: the draft model (required).
        streamer: a transformers streamer.
        plan: the engine's plan (default ``"auto"``: the plan tuned for this pair, else
            ``chain:2/block``).
        seed: seeds the engine's generator (default: drawn from torch's global generator, so
            that ``torch.manual_seed`` makes sampling reproducible as with ``generate``).
        **kwargs: ``attention_mask`` (all ones), ``tokenizer`` (for ``stop_strings``) and
            generation settings (``max_new_tokens``, ``do_sample``, ``temperature``, ...).

    Raises:
        ValueError: no ``assistant_model``, a batch, padding, or settings that are not lossless.
    """
    import torch

    from adaptive_spec.engine.engine import SpecEngine

    if assistant_model is None:
        raise ValueError("adaptive-spec's custom_generate needs assistant_model= (the draft model)")
    input_ids = _single_prompt(inputs, kwargs)
    tokenizer = kwargs.pop("tokenizer", None)
    kwargs.pop("assistant_tokenizer", None)
    config = _generation_config(model, generation_config, kwargs)
    if seed is None:
        seed = int(torch.randint(0, 2**62, (1,)).item())
    engine = SpecEngine(model, assistant_model, tokenizer=tokenizer)
    result = engine.generate(
        input_ids[0],
        plan=plan,
        seed=seed,
        streamer=streamer,
        generation_config=config,
        logits_processor=logits_processor,
        stopping_criteria=stopping_criteria,
    )
    new = torch.tensor([result.token_ids], dtype=input_ids.dtype, device=input_ids.device)
    sequences = torch.cat([input_ids, new], dim=1)
    if config.return_dict_in_generate:
        from transformers.generation.utils import GenerateDecoderOnlyOutput

        return GenerateDecoderOnlyOutput(sequences=sequences)
    return sequences


def _single_prompt(inputs: Any, kwargs: dict[str, Any]) -> Any:
    """The prompt's ``input_ids`` as ``[1, n]``, after refusing what cannot be honoured (batches, padding, ...).

    Pops from ``kwargs`` what it consumes (``input_ids``, ``attention_mask``, the ignored and refused arguments).
    """
    import torch

    for name in _REFUSED_IF_SET:
        if kwargs.pop(name, None) is not None:
            raise ValueError(f"{name} is not supported by adaptive-spec's speculative generate")
    for name in _IGNORED:
        kwargs.pop(name, None)
    input_ids = kwargs.pop("input_ids", None) if inputs is None else inputs
    if input_ids is None:
        raise ValueError("give the prompt's input_ids")
    input_ids = torch.as_tensor(input_ids)
    if input_ids.dim() == 1:
        input_ids = input_ids[None]
    if input_ids.dim() != 2 or input_ids.shape[0] != 1:
        raise ValueError(f"batches are not supported yet (input_ids of shape {tuple(input_ids.shape)}): one prompt")
    mask = kwargs.pop("attention_mask", None)
    if mask is not None and not bool(torch.as_tensor(mask).bool().all()):
        raise ValueError("padded prompts are not supported: pass the prompt without padding (attention_mask all ones)")
    return input_ids


def _generation_config(model: Any, generation_config: Any, kwargs: dict[str, Any]) -> Any:
    """The ``GenerationConfig`` transformers' own precedence gives; leftover or unsupported arguments are refused."""
    default_max_length = kwargs.get("max_length") is None and all(
        getattr(c, "max_length", None) is None for c in (generation_config, model.generation_config)
    )
    config, rest = model._prepare_generation_config(generation_config, **kwargs)  # transformers' own precedence
    if default_max_length and config.max_new_tokens is None:  # as generate: by default, 20 *new* tokens
        config.max_new_tokens = config.max_length
    rest = {k: v for k, v in rest.items() if k not in _IGNORED}
    if rest:
        raise TypeError(f"unexpected generate() arguments for adaptive-spec: {', '.join(sorted(rest))}")
    if config.output_scores or config.output_logits:
        raise ValueError("output_scores/output_logits are not available with speculative decoding")
    return config
