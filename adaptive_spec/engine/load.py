"""Loading an engine the way every command does: given models, or the built-in pair."""

from __future__ import annotations

__all__ = ["check_device", "load_engine", "load_hf_draft"]


def load_engine(target: str | None, draft: str | None, device: str | None, dtype: str | None, **engine_kwargs):
    """The engine over ``target``/``draft``, or over the built-in default pair when both are None.

    ``engine_kwargs`` (e.g. ``latency_model``) go to :class:`~adaptive_spec.engine.SpecEngine`.
    """
    from adaptive_spec.engine import SpecEngine
    from adaptive_spec.engine.models import PAIRED_DRAFT
    from adaptive_spec.options import parse_device

    device = str(parse_device(device))  # the default one if None; from_pretrained checks it first (check_device)
    if target is None and draft is not None:
        raise ValueError("--draft needs a --target")
    if target is not None and draft is None and target not in PAIRED_DRAFT:
        raise ValueError(
            f"give --draft for --target {target} (only the short names {', '.join(PAIRED_DRAFT)} have a paired draft)"
        )
    return SpecEngine.from_pretrained(target, draft, device=device, dtype=dtype, **engine_kwargs)


def check_device(device: str) -> None:
    """Raise a one-line ``ValueError`` for a device this machine cannot run on (a typo, CUDA without a GPU, a GPU
    index past the last), before any model loads (every command's ``--device``, and ``SpecEngine.from_pretrained``).
    """
    import torch

    from adaptive_spec.options import parse_device

    dev = parse_device(device)
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            why = "this torch was built without CUDA" if torch.version.cuda is None else "no CUDA device is visible"
            raise ValueError(f"device {device}: {why} (torch {torch.__version__}); use the cpu")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ValueError(f"device {device}: only {torch.cuda.device_count()} CUDA device(s) here")


def load_hf_draft(engine, name: str | None, target: str | None):
    """The draft for transformers' assisted generation: ``name`` (a short name or folder); else the paired
    standalone draft of a short-named target (``smollm2`` -> ``smollm2-draft``); else None (the engine's draft
    is used when it is a plain causal LM).
    """
    from adaptive_spec.engine.models import SHORT_NAMES, resolve_model
    from adaptive_spec.engine.pretrained import load_causal_lm

    if name is None and target is not None and f"{target}-draft" in SHORT_NAMES:
        name = f"{target}-draft"
    if name is None:
        return None
    model = load_causal_lm(
        resolve_model(name, "draft"), "assisted draft", dtype=engine.target.dtype, attn_implementation="sdpa"
    )
    from adaptive_spec.engine.weight_order import arrange_linears

    model = model.to(engine.device).eval()
    arrange_linears(model)  # on a CPU, the weight order the engine's own models have (a fair baseline)
    return model
