"""Prompts: token ids from text, ids, tensors, tokenizer outputs or a chat.

The engine decodes one sequence: every prompt form becomes one list of token ids below the
target's input vocabulary, or a one-line ValueError says what is wrong with it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from adaptive_spec.engine.settings import token_id

BATCH_ERROR = (
    "batches are not supported yet (got {n} prompts): call generate() once per prompt; "
    "the engine decodes one sequence at a time"
)


def prompt_ids(
    prompt: str | Sequence[int] | torch.Tensor | Mapping[str, Any], tokenizer: Any, vocab_size: int
) -> list[int]:
    """``prompt`` as token ids, each checked to be an integer in ``[0, vocab_size)``.

    ``prompt``: text (needs ``tokenizer``; a doubled BOS from a rendered chat template is
    dropped), token ids (a list, a 1-D or ``[1, n]`` tensor), or the dict of a tokenizer call.
    """
    if isinstance(prompt, Mapping):  # a BatchEncoding or dict, e.g. apply_chat_template(..., return_dict=True)
        if "input_ids" not in prompt:
            raise ValueError(f"a dict prompt needs 'input_ids' (got keys {sorted(prompt)})")
        prompt = prompt["input_ids"]
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (list, torch.Tensor)):
            prompt = prompt[0]  # [[ids]]: a batch of one
    if isinstance(prompt, str):
        if tokenizer is None:
            raise ValueError("a text prompt needs a tokenizer; pass tokenizer= or give token ids")
        ids = list(tokenizer(prompt)["input_ids"])
        bos = getattr(tokenizer, "bos_token_id", None)
        if bos is not None and len(ids) > 1 and ids[0] == ids[1] == bos:
            ids = ids[1:]  # the text already began with the BOS token (e.g. a rendered chat template)
    elif isinstance(prompt, torch.Tensor):
        if prompt.dim() == 2 and prompt.shape[0] == 1:
            prompt = prompt[0]
        if prompt.dim() == 2:
            raise ValueError(BATCH_ERROR.format(n=prompt.shape[0]))
        if prompt.dim() != 1:
            raise ValueError(f"a token-id prompt must be 1-D or [1, n], got shape {tuple(prompt.shape)}")
        if prompt.is_floating_point() or prompt.is_complex() or prompt.dtype == torch.bool:
            raise ValueError(f"token ids must be integers, got a {str(prompt.dtype).removeprefix('torch.')} tensor")
        ids = [int(x) for x in prompt.tolist()]
    elif isinstance(prompt, (bytes, bytearray)):
        raise ValueError("a bytes prompt is ambiguous: decode it to str, or give a list of token ids")
    elif isinstance(prompt, Sequence):
        if prompt and all(
            isinstance(x, (str, Sequence)) or (isinstance(x, torch.Tensor) and x.dim() > 0) for x in prompt
        ):
            raise ValueError(BATCH_ERROR.format(n=len(prompt)))
        ids = [token_id(x, "prompt") for x in prompt]
    else:
        raise ValueError(f"prompt must be text or token ids, got {type(prompt).__name__}")
    if not ids:
        raise ValueError("the prompt is empty: give at least one token (e.g. the BOS token)")
    bad = [t for t in ids if not 0 <= t < vocab_size]
    if bad:
        raise ValueError(f"prompt token ids {bad[:5]} are outside the target's vocabulary [0, {vocab_size})")
    return ids


def chat_prompt(prompt: Any, messages: Sequence[Mapping[str, Any]] | None, tokenizer: Any) -> Any:
    """``prompt``, or the token ids of ``messages`` rendered by the tokenizer's chat template."""
    if messages is None:
        if prompt is None:
            raise ValueError("give a prompt or messages=[{'role': 'user', 'content': ...}]")
        return prompt
    if prompt is not None:
        raise ValueError("give either a prompt or messages=, not both")
    if tokenizer is None:
        raise ValueError("messages= needs a tokenizer with a chat template; pass tokenizer=")
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError(
            "the tokenizer has no chat template: set tokenizer.chat_template, or render the chat yourself "
            "and pass it as prompt"
        )
    if isinstance(messages, Mapping) or not all(isinstance(m, Mapping) for m in messages):
        raise ValueError("messages must be a list of {'role': ..., 'content': ...} dicts")
    return tokenizer.apply_chat_template(list(messages), add_generation_prompt=True, tokenize=True, return_dict=True)
