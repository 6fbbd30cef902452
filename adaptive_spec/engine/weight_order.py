"""The CPU weight form of a model's ``Linear`` layers, chosen by measuring on this host: once, cached.

Which form of a ``Linear`` weight is faster (:mod:`adaptive_spec.engine.layout`: the stock row-major order,
column-major, or oneDNN's packed copy) depends on the CPU's BLAS, the weight's shape and the rows (tokens) of the
forward: on one EPYC host column-major wins at one to three tokens and ties above; on another it wins at one token
(111 against 128 ms) and loses at eight (292 against 272 ms); oneDNN's packed copy wins at two rows and more on
this EPYC host and not at one. So :func:`arrange_linears` measures, for each distinct weight shape, ``F.linear``
in every form at the forward sizes of :data:`SIZES` (interleaved, rotating which goes first, on a ring of distinct
random weights of about :data:`RING_BYTES` so that they come from memory as a model's do; a larger weight, a
vocabulary head, on :data:`MAX_TIMED_ROWS` of its output rows), and caches the medians in
``<user data folder>/weight-order.json`` per host (CPU model, torch threads, torch version), shape and
dtype. Later loads read them. An unreadable or malformed cache, or entry, is measured again; delete
the file to re-measure (e.g. after a measurement on a busy machine). One call measures for at most
:data:`BUDGET_S` seconds, the shapes holding most of the weights first; a shape left over (a busy
machine) keeps the stock order and is measured on a load at least :data:`RETRY_S` seconds later.

At each size column-major **wins** when its median is at least :data:`WIN_MARGIN` under the stock order's and it
was the faster of the two in at least :data:`AGREEMENT` of the rounds; the packed copy wins (over either) when its
median is at least :data:`WIN_MARGIN` under the better order's (column-major's where that won, else the stock
order's) with the same agreement against the stock order, and only from :data:`PACKED_FROM` rows up. The stock
order wins when column-major's median is more than :data:`TIE_TOLERANCE` over; anything else is a tie (no measurable
difference). Then, per shape:

- column-major wins somewhere, packed nowhere and the stock order nowhere: stored column-major (one copy);
- packed wins somewhere, or column-major and the stock order both do: more than one form, each forward picking
  by its row count (:class:`~adaptive_spec.engine.layout.PerSizeLinear`: a winning form where it wins, the
  stock order at ties; a size between two measured ones takes a form only where both neighbours do,
  larger forwards follow the largest size), when all such second copies together take at most
  :data:`COPY_MEMORY_SHARE` of the machine's memory; else the stock order;
- else the stock order, untouched.

So no forward size runs where the stock order measured faster. ``ADAPTIVE_SPEC_WEIGHT_ORDER``
overrides the choice: ``auto`` (the default, as above), ``column`` (every weight column-major, no
measurement), ``packed`` (every weight oneDNN-packed at every size, no measurement; where torch has it) or
``row`` (the stock order).
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import os
import platform
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.nn import functional

from adaptive_spec.engine.layout import (
    column_major_copy,
    column_major_linears,
    linear_groups,
    packed_copy,
    packed_linear,
    packing_available,
    per_size_linears,
    row_major_linears,
)
from adaptive_spec.files import user_data_dir, write_json_atomic

__all__ = [
    "CACHE_NAME",
    "ORDER_ENV",
    "PACKED_FROM",
    "SIZES",
    "ShapeChoice",
    "arrange_linears",
    "cpu_name",
    "measure_shape",
    "shape_choices",
    "weight_order_setting",
]

ORDER_ENV = "ADAPTIVE_SPEC_WEIGHT_ORDER"
"""The environment variable that overrides the choice: ``auto`` (default), ``column``, ``packed`` or ``row``."""
ORDERS = ("auto", "column", "packed", "row")
CACHE_NAME = "weight-order.json"
"""The cache file in the user data folder."""
CACHE_FORMAT, CACHE_VERSION = "adaptive-spec weight order", 2  # 2: the packed form measured too
SIZES = (1, 2, 3, 4, 8, 16, 32)
"""The forward sizes (rows, i.e. tokens) measured."""
WIN_MARGIN = 0.05
"""Column-major wins at a size when its median is at least this share under the stock order's."""
TIE_TOLERANCE = 0.02
"""The stock order wins at a size when column-major's median is more than this share over it."""
COPY_MEMORY_SHARE = 1 / 8
"""The most of the machine's memory that the second copies of per-size weights may take."""
PACKED_FROM = 2
"""The fewest rows a forward uses the packed copy for. At one row its timed wins did not carry over to the model:
with the packed copy chosen at one row for two or three of SmolLM2's shapes its one-row pass took 2-8 % longer (an
EPYC host, ``docs/measurements/cpu-2026-12-06f/``), each oneDNN call costing about 12 µs more than ``F.linear``'s."""
RING_BYTES = 32 << 20
"""Each timed pass multiplies by distinct weights of at least this many bytes together (past the caches)."""
MAX_TIMED_ROWS = 4096
"""A weight with more output rows (a vocabulary head) is timed on this many of them."""
MAX_RING = 16
"""At most this many weights in the ring."""
REPEATS = 5
"""Timed passes per size and order (after one untimed)."""
AGREEMENT = 0.8
"""A win also needs the winner to be the faster in at least this share of the interleaved pairs."""
BUDGET_S = 5.0
"""The most seconds one call measures for; shapes left over keep the stock order until a later call."""
RETRY_S = 3600.0
"""A shape whose measurement ran out of time (a busy machine) is tried again after this many seconds."""


def weight_order_setting(order: str | None = None) -> str:
    """``order``, else ``$ADAPTIVE_SPEC_WEIGHT_ORDER``, else ``auto``, checked.

    Raises:
        ValueError: not one of ``auto``, ``column``, ``packed``, ``row``.
    """
    value = (order or os.environ.get(ORDER_ENV) or "auto").strip().lower()
    if value not in ORDERS:
        raise ValueError(f"{ORDER_ENV} must be one of {', '.join(ORDERS)}, got {value!r}")
    return value


def cpu_name() -> str:
    """The CPU's model name (``/proc/cpuinfo``), else what ``platform`` says."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


@dataclass(frozen=True)
class ShapeChoice:
    """The measurements of one weight shape, and the order they choose (``column``, ``per-size`` or ``row``).

    ``row_ms`` / ``column_ms`` / ``packed_ms``: median milliseconds per size (``packed_ms`` None where oneDNN's
    packed linear was not available); ``column_faster`` / ``packed_faster``: the share of the interleaved rounds
    in which that form was faster than the stock order.
    """

    key: str
    sizes: tuple[int, ...]
    row_ms: tuple[float, ...]
    column_ms: tuple[float, ...]
    column_faster: tuple[float, ...]
    packed_ms: tuple[float, ...] | None = None
    packed_faster: tuple[float, ...] | None = None

    def wins(self) -> list[str]:
        """Per size: ``column``, ``packed``, ``row`` or ``tie`` (:data:`WIN_MARGIN`, :data:`TIE_TOLERANCE`,
        :data:`AGREEMENT`; the module docstring).
        """
        out = []
        for i, r in enumerate(self.row_ms):
            column = self.column_ms[i] <= (1 - WIN_MARGIN) * r and self.column_faster[i] >= AGREEMENT
            best = self.column_ms[i] if column else r  # what the packed copy has to beat: the better order
            if self.sizes[i] >= PACKED_FROM and self._packed_wins(i, best):
                out.append("packed")
            elif column:
                out.append("column")
            elif self.column_ms[i] > (1 + TIE_TOLERANCE) * r:  # no agreement asked: doubt goes the stock order's way
                out.append("row")
            else:
                out.append("tie")
        return out

    def _packed_wins(self, i: int, best: float) -> bool:
        """Whether the packed copy wins at the ``i``-th size: :data:`WIN_MARGIN` under ``best`` (the better order's
        median) and faster than the stock order in :data:`AGREEMENT` of the rounds.
        """
        if self.packed_ms is None or self.packed_faster is None:
            return False
        return self.packed_ms[i] <= (1 - WIN_MARGIN) * best and self.packed_faster[i] >= AGREEMENT

    @property
    def order(self) -> str:
        """``column`` (column-major wins somewhere, nothing else does, it loses nowhere), ``per-size`` (packed wins
        somewhere, or column-major and the stock order both do) or ``row``.
        """
        wins = self.wins()
        if "packed" in wins or ("column" in wins and "row" in wins):
            return "per-size"
        return "column" if "column" in wins else "row"

    def row_forms(self) -> tuple[tuple[str, ...], str]:
        """For a per-size weight: ``(the form of a forward of r rows, r < len; the form above)``.

        A winning form exactly where it wins; between two measured sizes where both neighbours chose it; else
        the stock order (``row``).
        """
        wins = dict(zip(self.sizes, (w if w in ("column", "packed") else "row" for w in self.wins()), strict=True))
        forms = ["row"]  # zero rows: no work either way
        for r in range(1, self.sizes[-1] + 1):
            below = wins[max((s for s in self.sizes if s <= r), default=self.sizes[0])]
            above = wins[min(s for s in self.sizes if s >= r)]
            forms.append(below if below == above else "row")
        return tuple(forms), wins[self.sizes[-1]]

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready: the shape, sizes, measurements, per-size winners and the order."""
        return {
            "shape": self.key,
            "sizes": list(self.sizes),
            "row_ms": list(self.row_ms),
            "column_ms": list(self.column_ms),
            "column_faster": list(self.column_faster),
            "packed_ms": None if self.packed_ms is None else list(self.packed_ms),
            "packed_faster": None if self.packed_faster is None else list(self.packed_faster),
            "wins": self.wins(),
            "order": self.order,
        }


def _shape_key(w: torch.Tensor, bias: bool) -> str:
    dtype = str(w.dtype).removeprefix("torch.")
    return f"{w.shape[0]}x{w.shape[1]}{' +bias' if bias else ''} {dtype}"


def _host_key() -> str:
    return f"{cpu_name()} | {torch.get_num_threads()} threads | torch {torch.__version__}"


def measure_shape(
    out: int, inp: int, dtype: torch.dtype, bias: bool, sizes: Sequence[int] = SIZES, deadline: float = math.inf
) -> dict[str, list] | None:
    """``F.linear`` with an ``[out, inp]`` weight in every form (the stock order, column-major, and oneDNN's
    packed copy where :func:`~adaptive_spec.engine.layout.packing_available`), per row count, interleaved.

    ``deadline``: a ``time.perf_counter()`` value; past it the measurement stops and returns None.

    Returns:
        ``{"sizes", "row_ms", "column_ms", "column_faster", "packed_ms", "packed_faster"}``: median milliseconds
        per weight of the ring, and the share of the rounds in which that form was faster than the stock order
        (``packed_*`` None without the packed form).
    """
    out = min(out, MAX_TIMED_ROWS)
    count = min(MAX_RING, max(1, math.ceil(RING_BYTES / (out * inp * torch.finfo(dtype).bits // 8))))
    gen = torch.Generator().manual_seed(0)
    row = [torch.randn(out, inp, generator=gen).to(dtype) for _ in range(count)]
    b = torch.zeros(out, dtype=dtype) if bias else None
    forms = {
        "row": [functools.partial(functional.linear, weight=w, bias=b) for w in row],
        "column": [functools.partial(functional.linear, weight=column_major_copy(w), bias=b) for w in row],
    }
    packed = _packed_ring(row, b)
    if packed is not None:
        forms["packed"] = packed
    names = list(forms)
    xs = {n: torch.randn(n, inp, generator=gen).to(dtype) for n in sizes}
    samples: dict[str, dict[int, list[float]]] = {name: {n: [] for n in sizes} for name in forms}
    with torch.inference_mode():
        for rep in range(1 + REPEATS):
            for n in sizes:
                if time.perf_counter() > deadline:
                    return None
                for name in names[rep % len(names) :] + names[: rep % len(names)]:  # interleaved, rotating
                    t0 = time.perf_counter()
                    for f in forms[name]:
                        f(xs[n])
                    if rep:
                        samples[name][n].append((time.perf_counter() - t0) * 1e3 / count)
    got: dict[str, list | None] = {
        "sizes": list(sizes),
        "row_ms": [statistics.median(samples["row"][n]) for n in sizes],
    }
    for name in ("column", "packed"):
        if name not in samples:
            got[f"{name}_ms"] = got[f"{name}_faster"] = None
            continue
        got[f"{name}_ms"] = [statistics.median(samples[name][n]) for n in sizes]
        got[f"{name}_faster"] = [
            sum(c < r for r, c in zip(samples["row"][n], samples[name][n], strict=True)) / REPEATS for n in sizes
        ]
    return got


def _packed_ring(weights: Sequence[torch.Tensor], bias: torch.Tensor | None) -> list | None:
    """The packed form's calls for ``weights`` (each ``x -> F.linear(x, w, bias)``), None where there is none."""
    if not packing_available():
        return None
    try:
        packed = [packed_copy(w) for w in weights]
        calls = [functools.partial(packed_linear, packed=p, bias=bias) for p in packed]
        calls[0](torch.zeros(1, weights[0].shape[1], dtype=weights[0].dtype))
    except (RuntimeError, NotImplementedError):  # e.g. a dtype oneDNN does not pack on this CPU
        return None
    return calls


def _valid_entry(entry: Any) -> bool:
    if not isinstance(entry, dict) or entry.get("sizes") != list(SIZES):
        return False
    lists = [entry.get(f) for f in ("row_ms", "column_ms", "column_faster")]
    packed = [entry.get("packed_ms"), entry.get("packed_faster")]
    if packed != [None, None]:
        lists += packed
    return all(isinstance(t, list) and len(t) == len(SIZES) for t in lists) and all(
        isinstance(x, (int, float)) and 0 <= x < math.inf for t in lists for x in t
    )


def _recently_given_up(entry: Any) -> bool:
    """Whether ``entry`` records a measurement that ran out of time less than :data:`RETRY_S` ago."""
    when = entry.get("given_up") if isinstance(entry, dict) else None
    return isinstance(when, (int, float)) and 0 <= time.time() - when < RETRY_S


def _read_cache(path: Path) -> dict[str, Any]:
    """The cache's entries, ``{}`` when the file is missing, unreadable or not a weight-order cache."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    ok = isinstance(data, dict) and data.get("format") == CACHE_FORMAT and data.get("version") == CACHE_VERSION
    return data["entries"] if ok and isinstance(data.get("entries"), dict) else {}


def shape_choices(*models: torch.nn.Module, cache: str | os.PathLike | None = None) -> dict[str, ShapeChoice]:
    """``{shape key: ShapeChoice}`` for the CPU ``Linear`` weights of ``models``: cached, else measured and cached.

    Shapes are measured largest share of the models' weights first, within :data:`BUDGET_S` seconds
    in all; a shape left unmeasured is missing from the answer (it keeps the stock order) and is
    measured on a call :data:`RETRY_S` seconds later or more.

    ``cache``: the JSON file (default ``<user data folder>/weight-order.json``).
    """
    path = Path(cache) if cache is not None else user_data_dir() / CACHE_NAME
    entries, host = _read_cache(path), _host_key()
    shapes: dict[str, tuple[torch.Tensor, bool, int]] = {}  # key: (a weight, bias, bytes of all such weights)
    for w, modules in linear_groups(*models):
        if w.device.type == "cpu" and min(w.shape) > 1:
            bias = any(m.bias is not None for m in modules)
            key = _shape_key(w, bias)
            shapes[key] = (w, bias, shapes.get(key, (w, bias, 0))[2] + w.numel() * w.element_size())
    deadline, measured = time.perf_counter() + BUDGET_S, False
    for key, (w, bias, _) in sorted(shapes.items(), key=lambda kv: -kv[1][2]):
        entry = entries.get(f"{host} | {key}")
        if _valid_entry(entry) or _recently_given_up(entry):
            continue
        entry = measure_shape(w.shape[0], w.shape[1], w.dtype, bias, deadline=deadline)
        entries[f"{host} | {key}"], measured = entry or {"given_up": time.time()}, True
    if measured:
        with contextlib.suppress(OSError):  # a read-only data folder: measured again next time
            write_json_atomic({"format": CACHE_FORMAT, "version": CACHE_VERSION, "entries": entries}, path)
    fields = ("sizes", "row_ms", "column_ms", "column_faster", "packed_ms", "packed_faster")
    return {
        key: ShapeChoice(key, *(_tuple(entries[f"{host} | {key}"].get(f)) for f in fields))
        for key in shapes
        if _valid_entry(entries.get(f"{host} | {key}"))
    }


def _tuple(values: list | None) -> tuple | None:
    return None if values is None else tuple(values)


def _physical_memory() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, OSError, ValueError):
        return None


def arrange_linears(*models: torch.nn.Module, order: str | None = None) -> dict[str, int]:
    """Give the CPU ``Linear`` weights of ``models`` this host's faster form, in place (the module docstring).

    ``order``: ``auto``, ``column``, ``packed`` or ``row`` (default ``$ADAPTIVE_SPEC_WEIGHT_ORDER``, else
    ``auto``). Same values and state dict whatever the order; call
    :func:`~adaptive_spec.engine.layout.row_major_linears` before ``save_pretrained``.

    Returns:
        ``{"column": n, "per-size": n, "row": n}``: how many CPU weights got each order (a weight with a packed
        copy counts as ``per-size``).

    Raises:
        ValueError: an unknown ``order``, or ``packed`` where this torch has no oneDNN packed linear.
    """
    order = weight_order_setting(order)
    row_major_linears(*models)
    groups = [(w, m) for w, m in linear_groups(*models) if w.device.type == "cpu" and min(w.shape) > 1]
    if order == "packed":
        if groups and not packing_available():
            raise ValueError(f"{ORDER_ENV}=packed needs torch built with oneDNN (mkldnn); use auto, column or row")
        packed = sum(per_size_linears(w, modules, (), "packed") for w, modules in groups)
        return {"column": 0, "per-size": packed, "row": len(groups) - packed}
    if order != "auto":
        column = column_major_linears(*models) if order == "column" else 0
        return {"column": column, "per-size": 0, "row": len(groups) - column}
    choices = shape_choices(*models)
    choice = {id(w): choices.get(_shape_key(w, any(m.bias is not None for m in modules))) for w, modules in groups}
    forms = {k: c.row_forms() for k, c in choice.items() if c is not None and c.order == "per-size"}
    extra = sum(_copy_bytes(w, *forms[id(w)]) for w, _ in groups if id(w) in forms)
    memory = _physical_memory()
    copies = not extra or (memory is not None and extra <= COPY_MEMORY_SHARE * memory)
    counts = {"column": 0, "per-size": 0, "row": 0}
    with torch.no_grad():
        for w, modules in groups:
            how = choice[id(w)].order if choice[id(w)] is not None else "row"
            if how == "column":
                w.data = column_major_copy(w)
            elif how == "per-size":
                how = "per-size" if copies and per_size_linears(w, modules, *forms[id(w)]) else "row"
            counts[how] += 1
    return counts


def _copy_bytes(w: torch.Tensor, row_forms: Sequence[str], above: str) -> int:
    """Bytes of the copies a per-size weight keeps: a column-major one and a packed one, where its forms use them."""
    used = {*row_forms, above}
    return w.numel() * w.element_size() * (("column" in used) + ("packed" in used))
