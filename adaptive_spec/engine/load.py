"""Loading an engine the way every command does: given models, or the built-in pair."""

from __future__ import annotations

__all__ = ["load_engine"]


def load_engine(target: str | None, draft: str | None, device: str | None, dtype: str | None, **engine_kwargs):
    """The engine over ``target``/``draft``, or over the built-in default pair when both are None.

    ``engine_kwargs`` (e.g. ``latency_model``) go to :class:`~adaptive_spec.engine.SpecEngine`.
    """
    import torch

    from adaptive_spec.engine import SpecEngine

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    if (target is None) != (draft is None):
        raise SystemExit("give both --target and --draft, or neither (the built-in default pair)")
    return SpecEngine.from_pretrained(target, draft, device=device, dtype=dtype, **engine_kwargs)
