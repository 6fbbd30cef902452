"""Weight memory orders for CPU decoding: ``Linear`` weights row-major (stock), column-major, or both.

A ``Linear`` computes ``x @ W.T`` with ``W`` of shape ``[out, in]``. Stored the usual way
(row-major), the CPU BLAS behind ``F.linear`` takes one code path; the same values stored
column-major (``W.T`` contiguous, seen as ``[out, in]``) take another. Which is faster depends on
the host's BLAS, the shape and the rows ``x`` has (the tokens of the forward). Measured with
``adaptive-spec profile --target smollm2 --row-major-too`` (both orders interleaved, SmolLM2-135M
in float32 on 2 EPYC threads, context 256): one target token 41.4 -> 33.1 ms column-major, two
65.2 -> 49.6 ms, three 79.8 -> 61.7 ms, four and more about the same; on another EPYC host,
111 against 128 ms at one token but 292 against 272 ms at eight. Same math, same values, same
state dict: only the memory order changes.

- :func:`column_major_linears`: every CPU ``Linear`` weight column-major, in place;
- :func:`per_size_linears`: chosen weights kept in both orders, each forward picking by its row
  count (:class:`PerSizeLinear`; the stock weight stays the parameter, the column-major copy is a
  buffer outside the state dict);
- :func:`row_major_linears`: back to the stock order (before ``save_pretrained``: safetensors
  saves only contiguous tensors).

Which order each weight gets on this host is measured and cached by
:mod:`adaptive_spec.engine.weight_order`, which
:meth:`SpecEngine.from_pretrained <adaptive_spec.engine.engine.SpecEngine.from_pretrained>` applies.
Saving such a model needs nothing: transformers' ``save_pretrained`` (5.x) packs each tensor as it
writes it, and ``safetensors.torch.save_model`` does too. Only writing the raw state dict with
``safetensors.torch.save_file`` refuses non-contiguous tensors: call :func:`row_major_linears`
first there (``tests/engine/test_layout.py`` checks both).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch
from torch.nn import functional

__all__ = [
    "PerSizeLinear",
    "column_major_linears",
    "linear_groups",
    "linear_orders",
    "per_size_linears",
    "row_major_linears",
]


def linear_groups(*models: torch.nn.Module) -> Iterator[tuple[torch.nn.Parameter, list[torch.nn.Linear]]]:
    """Each floating 2-D ``Linear`` weight of ``models`` once, with every ``Linear`` that holds it (a tied or
    shared weight once).
    """
    groups: dict[int, tuple[torch.nn.Parameter, list[torch.nn.Linear]]] = {}
    for model in models:
        for module in model.modules():
            w = getattr(module, "weight", None)
            linear = isinstance(module, torch.nn.Linear) and isinstance(w, torch.nn.Parameter) and w.dim() == 2
            if linear and w.is_floating_point():
                group = groups.setdefault(id(w), (w, []))[1]
                if all(m is not module for m in group):
                    group.append(module)
    yield from groups.values()


def _reorderable(w: torch.Tensor) -> bool:
    return w.device.type == "cpu" and w.shape[0] > 1 and w.shape[1] > 1


class PerSizeLinear(torch.nn.Linear):
    """A ``Linear`` whose weight is kept in both orders; each forward uses the one chosen for its row count.

    ``weight`` (the parameter) stays in the stock row-major order; ``weight_column_major`` is a
    non-persistent buffer with the same values stored column-major. ``column_rows[r]`` says whether
    a forward of ``r`` rows (tokens) uses the copy; forwards of more rows than the tuple covers use
    ``column_above``. Made only by :func:`per_size_linears`, which turns a plain ``Linear`` into one
    in place (its parameters, state dict and hooks stay); :func:`row_major_linears` turns it back.
    """

    column_rows: tuple[bool, ...]
    column_above: bool

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``F.linear`` with the weight copy chosen for ``x``'s row count."""
        rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
        column = self.column_rows[rows] if rows < len(self.column_rows) else self.column_above
        return functional.linear(x, self.weight_column_major if column else self.weight, self.bias)


def _to_plain(module: torch.nn.Linear) -> None:
    """Turn a :class:`PerSizeLinear` back into a plain ``Linear`` (its copy dropped)."""
    if type(module) is PerSizeLinear:
        del module.weight_column_major
        del module.column_rows
        del module.column_above
        module.__class__ = torch.nn.Linear


def column_major_linears(*models: torch.nn.Module) -> int:
    """Store the CPU ``Linear`` weights of ``models`` column-major, in place (others stay); returns how many changed."""
    changed = 0
    with torch.no_grad():
        for w, modules in linear_groups(*models):
            for module in modules:
                _to_plain(module)
            if _reorderable(w) and w.is_contiguous():
                w.data = w.data.t().contiguous().t()
                changed += 1
    return changed


def row_major_linears(*models: torch.nn.Module) -> int:
    """Back to the stock order (e.g. before ``safetensors.torch.save_file``): undoes :func:`column_major_linears`
    and :func:`per_size_linears`; returns how many weights changed.
    """
    changed = 0
    with torch.no_grad():
        for w, modules in linear_groups(*models):
            per_size = any(type(m) is PerSizeLinear for m in modules)
            for module in modules:
                _to_plain(module)
            if not w.is_contiguous():
                w.data = w.data.contiguous()
                changed += 1
            elif per_size:
                changed += 1
    return changed


def per_size_linears(
    weight: torch.nn.Parameter, modules: Sequence[torch.nn.Linear], column_rows: Sequence[bool], column_above: bool
) -> bool:
    """Keep ``weight`` in both orders and let each of ``modules`` (plain ``Linear`` layers holding it) pick
    per forward: :class:`PerSizeLinear` with ``column_rows`` / ``column_above``.

    Returns False (nothing changed) when a module is not a plain ``Linear`` on a CPU, or has its own
    ``forward`` (e.g. an accelerate hook).
    """
    if not _reorderable(weight) or any(type(m) is not torch.nn.Linear or "forward" in vars(m) for m in modules):
        return False
    with torch.no_grad():
        if not weight.is_contiguous():
            weight.data = weight.data.contiguous()
        copy = weight.detach().t().contiguous().t()
    for module in modules:
        module.__class__ = PerSizeLinear
        module.register_buffer("weight_column_major", copy, persistent=False)
        module.column_rows = tuple(bool(c) for c in column_rows)
        module.column_above = bool(column_above)
    return True


def linear_orders(*models: torch.nn.Module) -> dict[str, int]:
    """``{"column": n, "per-size": n, "row": n}``: how the CPU ``Linear`` weights of ``models`` are stored now."""
    counts = {"column": 0, "per-size": 0, "row": 0}
    for w, modules in linear_groups(*models):
        if _reorderable(w):
            per_size = any(type(m) is PerSizeLinear for m in modules)
            counts["per-size" if per_size else "row" if w.is_contiguous() else "column"] += 1
    return counts
