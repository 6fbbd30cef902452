"""The built-in draft/target pair: two small Llama-style models trained on Python source.

The committed pair lives in ``adaptive_spec/zoo/default``, built by ``adaptive-spec zoo build``
(:func:`adaptive_spec.files.default_pair_path`; its held-out prompts are
:func:`adaptive_spec.files.default_prompts`); ``load_default_pair()`` loads it. Heavy imports
(torch, transformers, Lightning) happen on first use only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerFast


def load_default_pair(
    device: torch.device | str | None = None, dtype: torch.dtype | None = None
) -> tuple[PreTrainedModel, PreTrainedModel, PreTrainedTokenizerFast]:
    """(target, draft, tokenizer) of the committed pair, in eval mode, without network access.

    ``dtype`` None means float32 on CPU (half-precision matmuls are slow there) and the
    checkpoint's float16 elsewhere.
    """
    from adaptive_spec.files import default_pair_path
    from adaptive_spec.zoo.build import load_pair

    return load_pair(default_pair_path(), device=device, dtype=dtype)


def __getattr__(name: str):  # lazy re-exports, so ``import adaptive_spec.zoo`` stays light
    if name in ("build_pair", "load_pair"):
        from adaptive_spec.zoo import build

        return getattr(build, name)
    if name == "evaluate_pair":
        from adaptive_spec.zoo.evaluate import evaluate_pair

        return evaluate_pair
    if name in ("ZooConfig", "ModelSpec", "TrainSpec"):
        from adaptive_spec.zoo import config

        return getattr(config, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "ModelSpec",
    "TrainSpec",
    "ZooConfig",
    "build_pair",
    "evaluate_pair",
    "load_default_pair",
    "load_pair",
]
