"""The built-in draft/target pair: two small Llama-style models trained on Python source.

``default_pair_path()`` is the committed pair (``adaptive_spec/zoo/default``), built by
``adaptive-spec zoo build``; ``load_default_pair()`` loads it and ``default_prompts()`` gives
code prompts from files the pair never saw in training. Heavy imports (torch,
transformers, Lightning) happen on first use only.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerFast


def default_pair_path() -> Path:
    """Directory of the committed pair: ``target/``, ``draft/``, ``prompts.jsonl``, ``build_info.json``."""
    return Path(__file__).resolve().parent / "default"


def load_default_pair(
    device: torch.device | str | None = None, dtype: torch.dtype | None = None
) -> tuple[PreTrainedModel, PreTrainedModel, PreTrainedTokenizerFast]:
    """(target, draft, tokenizer) of the committed pair, in eval mode, without network access.

    ``dtype`` None means float32 on CPU (half-precision matmuls are slow there) and the
    checkpoint's float16 elsewhere.
    """
    from adaptive_spec.zoo.build import load_pair

    return load_pair(default_pair_path(), device=device, dtype=dtype)


def default_prompts() -> list[str]:
    """The committed pair's built-in prompts: function headers with a docstring start, from held-out files."""
    from adaptive_spec.zoo.build import read_prompts

    return read_prompts(default_pair_path())


def __getattr__(name: str):  # lazy re-exports, so ``import adaptive_spec.zoo`` stays light
    if name in ("build_pair", "load_pair", "read_prompts"):
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
    "default_pair_path",
    "default_prompts",
    "evaluate_pair",
    "load_default_pair",
    "load_pair",
    "read_prompts",
]
