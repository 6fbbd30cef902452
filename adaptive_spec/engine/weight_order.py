"""The CPU weight order of a model's ``Linear`` layers, chosen by measuring on this host: once, cached.

Which memory order of a ``Linear`` weight is faster (:mod:`adaptive_spec.engine.layout`) depends on
the CPU's BLAS, the weight's shape and the rows (tokens) of the forward: on one EPYC host
column-major wins at one to three tokens and ties above; on another it wins at one token (111
against 128 ms) and loses at eight (292 against 272 ms). So :func:`arrange_linears` measures, for
each distinct weight shape, ``F.linear`` in both orders at the forward sizes of :data:`SIZES`
(interleaved pairs, alternating which goes first, on a ring of distinct random weights of about
:data:`RING_BYTES` so that they come from memory as a model's do; a larger weight, a vocabulary
head, on :data:`MAX_TIMED_ROWS` of its output rows), and caches the medians in
``<user data folder>/weight-order.json`` per host (CPU model, torch threads, torch version), shape and
dtype. Later loads read them. An unreadable or malformed cache, or entry, is measured again; delete
the file to re-measure (e.g. after a measurement on a busy machine). One call measures for at most
:data:`BUDGET_S` seconds, the shapes holding most of the weights first; a shape left over (a busy
machine) keeps the stock order and is measured on a load at least :data:`RETRY_S` seconds later.

At each size column-major **wins** when its median is at least :data:`WIN_MARGIN` under the stock
order's and it was the faster in at least :data:`AGREEMENT` of the pairs; the stock order wins when
column-major's median is more than :data:`TIE_TOLERANCE` over; anything else is a tie (no measurable
difference). Then, per shape:

- column-major wins somewhere and the stock order nowhere: stored column-major (one copy);
- both win somewhere: both copies, each forward picking by its row count
  (:class:`~adaptive_spec.engine.layout.PerSizeLinear`: column-major where it wins, the stock order
  at ties; a size between two measured ones takes column-major only where both neighbours do,
  larger forwards follow the largest size), when all such second copies together take at most
  :data:`COPY_MEMORY_SHARE` of the machine's memory; else the stock order;
- else the stock order, untouched.

So no forward size runs where the stock order measured faster. ``ADAPTIVE_SPEC_WEIGHT_ORDER``
overrides the choice: ``auto`` (the default, as above), ``column`` (every weight column-major, no
measurement) or ``row`` (the stock order).
"""

from __future__ import annotations

import contextlib
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

from adaptive_spec.engine.layout import column_major_linears, linear_groups, per_size_linears, row_major_linears
from adaptive_spec.files import user_data_dir, write_json_atomic

__all__ = [
    "CACHE_NAME",
    "ORDER_ENV",
    "SIZES",
    "ShapeChoice",
    "arrange_linears",
    "cpu_name",
    "measure_shape",
    "shape_choices",
    "weight_order_setting",
]

ORDER_ENV = "ADAPTIVE_SPEC_WEIGHT_ORDER"
"""The environment variable that overrides the choice: ``auto`` (default), ``column`` or ``row``."""
ORDERS = ("auto", "column", "row")
CACHE_NAME = "weight-order.json"
"""The cache file in the user data folder."""
CACHE_FORMAT, CACHE_VERSION = "adaptive-spec weight order", 1
SIZES = (1, 2, 3, 4, 8, 16, 32)
"""The forward sizes (rows, i.e. tokens) measured."""
WIN_MARGIN = 0.05
"""Column-major wins at a size when its median is at least this share under the stock order's."""
TIE_TOLERANCE = 0.02
"""The stock order wins at a size when column-major's median is more than this share over it."""
COPY_MEMORY_SHARE = 1 / 8
"""The most of the machine's memory that the second copies of per-size weights may take."""
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
        ValueError: not one of ``auto``, ``column``, ``row``.
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

    ``row_ms`` / ``column_ms``: median milliseconds per size; ``column_faster``: the share of the
    interleaved pairs in which column-major was the faster.
    """

    key: str
    sizes: tuple[int, ...]
    row_ms: tuple[float, ...]
    column_ms: tuple[float, ...]
    column_faster: tuple[float, ...]

    def wins(self) -> list[str]:
        """Per size: ``column``, ``row`` or ``tie`` (:data:`WIN_MARGIN`, :data:`TIE_TOLERANCE`, :data:`AGREEMENT`)."""
        out = []
        for r, c, share in zip(self.row_ms, self.column_ms, self.column_faster, strict=True):
            if c <= (1 - WIN_MARGIN) * r and share >= AGREEMENT:
                out.append("column")
            elif c > (1 + TIE_TOLERANCE) * r:  # no agreement asked: any doubt goes the stock order's way
                out.append("row")
            else:
                out.append("tie")
        return out

    @property
    def order(self) -> str:
        """``column`` (wins somewhere, loses nowhere), ``per-size`` (both win somewhere) or ``row``."""
        wins = self.wins()
        if "column" not in wins:
            return "row"
        return "per-size" if "row" in wins else "column"

    def column_rows(self) -> tuple[tuple[bool, ...], bool]:
        """For a per-size weight: ``(column-major for r rows, r < len; column-major above)``.

        Column-major exactly where it wins; between two measured sizes where both neighbours win.
        """
        wins = dict(zip(self.sizes, (w == "column" for w in self.wins()), strict=True))
        rows = [False]  # zero rows: no work either way
        for r in range(1, self.sizes[-1] + 1):
            below = max((s for s in self.sizes if s <= r), default=self.sizes[0])
            above = min(s for s in self.sizes if s >= r)
            rows.append(wins[below] and wins[above])
        return tuple(rows), wins[self.sizes[-1]]

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready: the shape, sizes, measurements, per-size winners and the order."""
        return {
            "shape": self.key,
            "sizes": list(self.sizes),
            "row_ms": list(self.row_ms),
            "column_ms": list(self.column_ms),
            "column_faster": list(self.column_faster),
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
    """``F.linear`` with an ``[out, inp]`` weight in both orders, per row count, interleaved.

    ``deadline``: a ``time.perf_counter()`` value; past it the measurement stops and returns None.

    Returns:
        ``{"sizes", "row_ms", "column_ms", "column_faster"}``: median milliseconds per weight of
        the ring, and the share of the timed pairs in which column-major was the faster.
    """
    out = min(out, MAX_TIMED_ROWS)
    count = min(MAX_RING, max(1, math.ceil(RING_BYTES / (out * inp * torch.finfo(dtype).bits // 8))))
    gen = torch.Generator().manual_seed(0)
    row = [torch.randn(out, inp, generator=gen).to(dtype) for _ in range(count)]
    orders = {"row": row, "column": [w.t().contiguous().t() for w in row]}
    b = torch.zeros(out, dtype=dtype) if bias else None
    xs = {n: torch.randn(n, inp, generator=gen).to(dtype) for n in sizes}
    samples: dict[str, dict[int, list[float]]] = {name: {n: [] for n in sizes} for name in orders}
    with torch.inference_mode():
        for rep in range(1 + REPEATS):
            for n in sizes:
                if time.perf_counter() > deadline:
                    return None
                for name in ("row", "column") if rep % 2 else ("column", "row"):  # interleaved, alternating
                    t0 = time.perf_counter()
                    for w in orders[name]:
                        functional.linear(xs[n], w, b)
                    if rep:
                        samples[name][n].append((time.perf_counter() - t0) * 1e3 / count)
    row_ms, col_ms = samples["row"], samples["column"]
    return {
        "sizes": list(sizes),
        "row_ms": [statistics.median(row_ms[n]) for n in sizes],
        "column_ms": [statistics.median(col_ms[n]) for n in sizes],
        "column_faster": [sum(c < r for r, c in zip(row_ms[n], col_ms[n], strict=True)) / REPEATS for n in sizes],
    }


def _valid_entry(entry: Any) -> bool:
    if not isinstance(entry, dict) or entry.get("sizes") != list(SIZES):
        return False
    ms = [entry.get("row_ms"), entry.get("column_ms")]
    share = entry.get("column_faster")
    lists = all(isinstance(t, list) and len(t) == len(SIZES) for t in [*ms, share])
    return lists and all(isinstance(x, (int, float)) and 0 <= x < math.inf for t in [*ms, share] for x in t)


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
    fields = ("sizes", "row_ms", "column_ms", "column_faster")
    return {
        key: ShapeChoice(key, *(tuple(entries[f"{host} | {key}"][f]) for f in fields))
        for key in shapes
        if _valid_entry(entries.get(f"{host} | {key}"))
    }


def _physical_memory() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, OSError, ValueError):
        return None


def arrange_linears(*models: torch.nn.Module, order: str | None = None) -> dict[str, int]:
    """Give the CPU ``Linear`` weights of ``models`` this host's faster order, in place (the module docstring).

    ``order``: ``auto``, ``column`` or ``row`` (default ``$ADAPTIVE_SPEC_WEIGHT_ORDER``, else ``auto``).
    Same values and state dict whatever the order; call
    :func:`~adaptive_spec.engine.layout.row_major_linears` before ``save_pretrained``.

    Returns:
        ``{"column": n, "per-size": n, "row": n}``: how many CPU weights got each order.

    Raises:
        ValueError: an unknown ``order``.
    """
    order = weight_order_setting(order)
    row_major_linears(*models)
    groups = [(w, m) for w, m in linear_groups(*models) if w.device.type == "cpu" and min(w.shape) > 1]
    if order != "auto":
        column = column_major_linears(*models) if order == "column" else 0
        return {"column": column, "per-size": 0, "row": len(groups) - column}
    choices = shape_choices(*models)
    choice = {id(w): choices.get(_shape_key(w, any(m.bias is not None for m in modules))) for w, modules in groups}
    order_of = {k: c.order if c is not None else "row" for k, c in choice.items()}
    extra = sum(w.numel() * w.element_size() for w, _ in groups if order_of[id(w)] == "per-size")
    memory = _physical_memory()
    copies = not extra or (memory is not None and extra <= COPY_MEMORY_SHARE * memory)
    counts = {"column": 0, "per-size": 0, "row": 0}
    with torch.no_grad():
        for w, modules in groups:
            how = order_of[id(w)]
            if how == "column":
                w.data = w.data.t().contiguous().t()
            elif how == "per-size":
                how = "per-size" if copies and per_size_linears(w, modules, *choice[id(w)].column_rows()) else "row"
            counts[how] += 1
    return counts
