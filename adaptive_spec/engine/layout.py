"""Weight forms for CPU decoding: ``Linear`` weights row-major (stock), column-major, oneDNN-packed, or per size.

A ``Linear`` computes ``x @ W.T`` with ``W`` of shape ``[out, in]``. Stored the usual way
(row-major), the CPU BLAS behind ``F.linear`` takes one code path; the same values stored
column-major (``W.T`` contiguous, seen as ``[out, in]``) take another. Which is faster depends on
the host's BLAS, the shape and the rows ``x`` has (the tokens of the forward). Measured with
``adaptive-spec profile --target smollm2 --row-major-too`` (both orders interleaved, SmolLM2-135M
in float32 on 2 EPYC threads, context 256): one target token 41.4 -> 33.1 ms column-major, two
65.2 -> 49.6 ms, three 79.8 -> 61.7 ms, four and more about the same; on another EPYC host,
111 against 128 ms at one token but 292 against 272 ms at eight. Same math, same values, same
state dict: only the memory order changes.

A third form is **packed**: a copy of the weight in oneDNN's blocked layout
(``torch.ops.mkldnn._reorder_linear_weight``), multiplied by oneDNN's own kernels
(``torch.ops.mkldnn._linear_pointwise``), which pick their code by the CPU's instruction set where MKL's
``F.linear`` takes a slow path for a few rows on an AMD host: SmolLM2's whole target pass on 2 EPYC threads took
56.5 against 69.6 ms at two rows, 62.9 against 86.6 at three, 50.7 against 76.9 at four (at one row, where it is not
used, 41.5 against 42.0; ``docs/measurements/cpu-2026-12-06f/``). The same dot products summed in another order
(logits within about 1e-4 of the stock order's). The packed copy is an opaque tensor. Both copies, column-major and
packed, are kept outside the module's parameters and buffers (never saved, moved or copied; dropped when the weight
leaves the CPU), made again from the weight when the weight changes (a new tensor, an in-place write such as
``load_state_dict``, another dtype), and used only without autograd (oneDNN's op has no backward): under
``torch.enable_grad()`` every form falls back to the stock weight. A weight without a version counter (made under
``torch.inference_mode``) keeps the stock form: a write in place to it could not be seen.

- :func:`column_major_linears`: every CPU ``Linear`` weight column-major, in place;
- :func:`per_size_linears`: chosen weights kept in more than one form, each forward picking by its row
  count (:class:`PerSizeLinear`; the stock weight stays the parameter, the copies are attributes);
- :func:`row_major_linears`: back to the stock order (before ``save_pretrained``: safetensors
  saves only contiguous tensors).

Which form each weight gets on this host is measured and cached by
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
    "FORMS",
    "PerSizeLinear",
    "column_major_copy",
    "column_major_linears",
    "linear_groups",
    "linear_orders",
    "packed_copy",
    "packed_linear",
    "packing_available",
    "per_size_linears",
    "row_major_linears",
    "version_counter",
]

#: The forms a forward can multiply by: the stock weight, its column-major copy, its oneDNN-packed copy.
FORMS = ("row", "column", "packed")


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


_PACKING: bool | None = None  # packing_available()'s answer, once asked


def packing_available() -> bool:
    """Whether this torch has oneDNN's packed linear (``torch.ops.mkldnn``) and it runs here."""
    global _PACKING
    if _PACKING is None:
        try:
            w = torch.ones(2, 3)
            y = packed_linear(torch.ones(1, 3), packed_copy(w), None)
            _PACKING = bool(torch.backends.mkldnn.is_available() and torch.equal(y, torch.full((1, 2), 3.0)))
        except (AttributeError, RuntimeError, NotImplementedError):
            _PACKING = False
    return _PACKING


def packed_linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``F.linear(x, W, bias)`` with ``W`` as oneDNN's packed copy (:func:`packed_copy`)."""
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


def column_major_copy(weight: torch.Tensor) -> torch.Tensor:
    """``weight``'s values stored column-major (``weight.T`` contiguous, seen as ``weight``'s shape)."""
    return weight.detach().t().contiguous().t()


def packed_copy(weight: torch.Tensor) -> torch.Tensor:
    """``weight`` packed in oneDNN's blocked layout, for :func:`packed_linear`."""
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous(), 1)


#: How each copied form is made from the weight.
_MAKE_COPY = {"column": column_major_copy, "packed": packed_copy}


def version_counter(weight: torch.Tensor) -> int | None:
    """``weight``'s version counter (bumped by every in-place write), or None where it keeps none: an inference
    tensor, or a parameter first made under ``torch.inference_mode`` (its counter stays absent after ``.data = ...``).
    What a copy made from a weight checks to know the weight unchanged (here, :func:`~.decoder.fused_weights`,
    :func:`~.graphs.weights_key`).
    """
    try:
        return weight._version
    except RuntimeError:
        return None


class _Copy:
    """A weight's copy in another form (``column`` or ``packed``), made on first use and again whenever the weight
    changes: a new tensor, an in-place write (``load_state_dict``, an optimizer's step), another dtype.

    Never copied or pickled (an opaque packed tensor cannot be): a copy starts empty and makes its own on first use.
    """

    def __init__(self, form: str) -> None:
        self.form = form
        self.tensor: torch.Tensor | None = None
        self.key: tuple | None = None

    def of(self, weight: torch.Tensor) -> torch.Tensor | None:
        """The copy of ``weight`` (a CPU tensor), made now if ``weight`` is not what it was made from; None for a
        weight whose writes cannot be seen (an inference tensor keeps no version counter): use the weight itself.
        """
        try:
            version = weight._version  # inline, not version_counter(): a forward's every layer asks
        except RuntimeError:
            self.clear()
            return None
        key = (weight.data_ptr(), version, weight.dtype, tuple(weight.shape))
        if key != self.key or self.tensor is None:
            with torch.no_grad():
                self.tensor = _MAKE_COPY[self.form](weight)
            self.key = key
        return self.tensor

    def clear(self) -> None:
        """Drop the copy (made again on next use)."""
        self.tensor = self.key = None

    def __deepcopy__(self, memo: dict) -> _Copy:
        return _Copy(self.form)

    def __getstate__(self) -> dict:
        return {"form": self.form}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["form"])


class PerSizeLinear(torch.nn.Linear):
    """A ``Linear`` whose weight is kept in more than one form; each forward uses the one chosen for its row count.

    ``weight`` (the parameter) stays in the stock row-major order. Where a size uses them, ``column_weight`` (the
    same values stored column-major) and ``packed_weight`` (oneDNN's layout) hold copies outside the parameters,
    buffers and state dict (:class:`_Copy`), made again when the weight changes. ``row_forms[r]`` (one of
    :data:`FORMS`) is the form a forward of ``r`` rows (tokens) uses; forwards of more rows than the tuple covers
    use ``form_above``. With autograd on, or a weight no longer on the CPU, every forward uses the stock weight.
    Made only by :func:`per_size_linears`, which turns a plain ``Linear`` into one in place (its
    parameters, state dict and hooks stay); :func:`row_major_linears` turns it back.
    """

    row_forms: tuple[str, ...]
    form_above: str

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``F.linear`` with the weight form chosen for ``x``'s row count."""
        rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
        form = self.row_forms[rows] if rows < len(self.row_forms) else self.form_above
        w = self.weight  # one module attribute lookup (they are slow): a forward of every layer asks
        if form == "row" or torch.is_grad_enabled() or w.device.type != "cpu":
            return functional.linear(x, w, self.bias)
        if form == "column":
            copy = self.column_weight.of(w)
            return functional.linear(x, w if copy is None else copy, self.bias)
        if x.device.type != "cpu" or x.dtype != w.dtype:
            return functional.linear(x, w, self.bias)
        copy = self.packed_weight.of(w)
        if copy is None:
            return functional.linear(x, w, self.bias)
        return packed_linear(x, copy, self.bias)

    def _apply(self, fn, recurse: bool = True):
        """``Module._apply`` (``.to``, ``.cuda``, ``.half``, ...), then the copies dropped where the weight left the
        CPU: they would hold host memory no forward reads (a forward on the CPU again makes them anew).
        """
        out = super()._apply(fn, recurse)
        if self.weight.device.type != "cpu":
            for holder in (self.column_weight, self.packed_weight):
                if holder is not None:
                    holder.clear()
        return out


def _to_plain(module: torch.nn.Linear) -> None:
    """Turn a :class:`PerSizeLinear` back into a plain ``Linear`` (its copies dropped)."""
    if type(module) is PerSizeLinear:
        for name in ("column_weight", "packed_weight", "row_forms", "form_above"):
            module.__dict__.pop(name, None)
        module.__class__ = torch.nn.Linear


def column_major_linears(*models: torch.nn.Module) -> int:
    """Store the CPU ``Linear`` weights of ``models`` column-major, in place (others stay); returns how many changed."""
    changed = 0
    with torch.no_grad():
        for w, modules in linear_groups(*models):
            for module in modules:
                _to_plain(module)
            if _reorderable(w) and w.is_contiguous():
                w.data = column_major_copy(w)
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
    weight: torch.nn.Parameter, modules: Sequence[torch.nn.Linear], row_forms: Sequence[str], form_above: str
) -> bool:
    """Keep ``weight`` in the forms ``row_forms`` and ``form_above`` name (:data:`FORMS`) and let each of
    ``modules`` (plain ``Linear`` layers holding it) pick per forward: :class:`PerSizeLinear`, a forward of ``r``
    rows using ``row_forms[r]``, larger ones ``form_above``.

    Returns False (nothing changed) when a module is not a plain ``Linear`` on a CPU, or has its own
    ``forward`` (e.g. an accelerate hook), or a packed form is asked for where oneDNN's is not available, or the
    weight keeps no version counter (made under ``torch.inference_mode``: a write in place would leave its copies
    stale unseen, so it keeps the stock form).

    Raises:
        ValueError: a form not in :data:`FORMS`.
    """
    forms = (*row_forms, form_above)
    if any(f not in FORMS for f in forms):
        raise ValueError(f"weight forms must be among {', '.join(FORMS)}, got {sorted(set(forms) - set(FORMS))}")
    if not _reorderable(weight) or any(type(m) is not torch.nn.Linear or "forward" in vars(m) for m in modules):
        return False
    if version_counter(weight) is None:  # a copy could go stale unseen (an inference tensor's writes are not counted)
        return False
    if "packed" in forms and not packing_available():
        return False
    with torch.no_grad():
        if not weight.is_contiguous():
            weight.data = weight.data.contiguous()
    copies = {form: _Copy(form) for form in _MAKE_COPY if form in forms}
    for copy in copies.values():
        copy.of(weight)  # made now, not inside the first timed forward
    for module in modules:
        module.__class__ = PerSizeLinear
        module.column_weight = copies.get("column")
        module.packed_weight = copies.get("packed")
        module.row_forms = tuple(forms[:-1])
        module.form_above = form_above
    return True


def linear_orders(*models: torch.nn.Module) -> dict[str, int]:
    """``{"column": n, "per-size": n, "row": n}``: how the CPU ``Linear`` weights of ``models`` are stored now."""
    counts = {"column": 0, "per-size": 0, "row": 0}
    for w, modules in linear_groups(*models):
        if _reorderable(w):
            per_size = any(type(m) is PerSizeLinear for m in modules)
            counts["per-size" if per_size else "row" if w.is_contiguous() else "column"] += 1
    return counts
