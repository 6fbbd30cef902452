"""Weight memory order for CPU decoding: Linear weights stored column-major.

A ``Linear`` computes ``x @ W.T`` with ``W`` of shape ``[out, in]``. Stored the usual way
(row-major), the CPU BLAS behind ``F.linear`` takes a slow path when ``x`` has one to three
rows, which is every autoregressive step and every short draft. The same values stored
column-major (``W.T`` contiguous, seen as ``[out, in]``) take the fast one. Same math, same
values, same state dict: only the memory order changes.

Measured (``adaptive-spec profile --target smollm2 --row-major-too``: both orders interleaved,
SmolLM2-135M in float32 on 2 EPYC threads, context 256): one target token 41.4 -> 33.1 ms, two
65.2 -> 49.6 ms, three 79.8 -> 61.7 ms; four and more about the same.

:meth:`SpecEngine.from_pretrained <adaptive_spec.engine.engine.SpecEngine.from_pretrained>`
applies it to the models it loads onto a CPU (they are the engine's own). Saving such a model
needs nothing: transformers' ``save_pretrained`` (5.x) packs each tensor as it writes it, and
``safetensors.torch.save_model`` does too. Only writing the raw state dict with
``safetensors.torch.save_file`` refuses non-contiguous tensors: call :func:`row_major_linears`
first there (``tests/engine/test_layout.py`` checks both).
"""

from __future__ import annotations

import torch

__all__ = ["column_major_linears", "row_major_linears"]


def _linear_weights(model: torch.nn.Module):
    seen: set[int] = set()
    for module in model.modules():
        w = getattr(module, "weight", None)
        linear = isinstance(module, torch.nn.Linear) and isinstance(w, torch.nn.Parameter) and w.dim() == 2
        if linear and id(w) not in seen and w.is_floating_point():  # a tied weight once
            seen.add(id(w))
            yield w


def column_major_linears(model: torch.nn.Module) -> int:
    """Store the CPU ``Linear`` weights of ``model`` column-major, in place (others stay); returns how many changed."""
    changed = 0
    with torch.no_grad():
        for w in _linear_weights(model):
            if w.device.type == "cpu" and w.is_contiguous() and w.shape[0] > 1 and w.shape[1] > 1:
                w.data = w.data.t().contiguous().t()
                changed += 1
    return changed


def row_major_linears(model: torch.nn.Module) -> int:
    """Undo :func:`column_major_linears` (e.g. before ``safetensors.torch.save_file``); returns how many changed."""
    changed = 0
    with torch.no_grad():
        for w in _linear_weights(model):
            if not w.is_contiguous():
                w.data = w.data.contiguous()
                changed += 1
    return changed
