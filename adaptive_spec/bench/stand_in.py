"""The captured path on a CPU: stand-ins for a CUDA graph.

A :class:`~adaptive_spec.engine.graphs.ModelSlot` captures only on CUDA. :func:`capture_on_cpu` makes every slot made
after it capture as on CUDA with a stand-in instead, so that a CPU runs the engine's captured path, the one an
accelerator runs: the tests check it there (``tests/helpers/graphs.py``), and ``bench overhead --stand-in-graphs``
times the host's work a step on it, the replays left out (on a GPU a replay is one launch).

Two stand-ins. :func:`record_eagerly`'s replays run the recorded function again. :func:`record_ops`'s replays run the
aten ops the function dispatched when it was recorded, with the arguments it gave them then, as a CUDA graph replays
its kernels: every Python value the function read (an int, a flag, a length) is baked in, and every tensor it read or
wrote is the same tensor at every replay. The tests record this way, so that a recorded function that reads state a
replay cannot see (a position kept as a Python int, a tensor replaced rather than written in place) fails on a CPU
as it would on a GPU, where the first stand-in would read it afresh.
"""

from __future__ import annotations

import contextlib
import time
import weakref
from collections.abc import Callable, Iterator

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from adaptive_spec.engine.graphs import ModelSlot
from adaptive_spec.rng import accelerator_path_on_cpu


class StandInGraph:
    """A CUDA graph's stand-in on a CPU: each replay runs what was recorded (the function again, :func:`record_eagerly`;
    its recorded ops, :func:`record_ops`) and writes its outputs in place, as a replay of the recorded kernels does.
    ``replays`` counts them; ``seconds`` (the class's) adds up the time every replay took.
    """

    seconds = 0.0

    def __init__(self, run, outputs, form: str = "sdpa") -> None:
        self._run, self._outputs = run, outputs
        self.form = form  # the attention form it was captured in
        self.replays = 0

    def replay(self) -> None:
        t0 = time.perf_counter()
        self.replays += 1
        for out, new in zip(self._outputs, self._run(), strict=True):
            out.copy_(new)
        StandInGraph.seconds += time.perf_counter() - t0


def record_eagerly(slot: ModelSlot, run: Callable, wrap: Callable[[Callable], Callable] | None = None):
    """``ModelSlot._record`` with a stand-in for the graph: ``(graph, outputs)``; ``wrap(run)``: what records and
    replays instead of ``run`` itself (a test's guard).
    """
    form = slot.kv.attention_form  # the form the slot captures in (``run`` sets it, then resets the cache's)
    run = run if wrap is None else wrap(run)
    outputs = tuple(o.clone() for o in run())
    return StandInGraph(run, outputs, form), outputs


class _Held:
    """A tensor a recorded op read that no recorded op made (the caller's), held as a CUDA graph holds it: by its
    memory, not by a reference. A replay finds it while something else keeps its memory alive (the tensor itself,
    or for a view, the tensor it views); else it raises, where a graph would read memory freed and maybe reused.
    """

    __slots__ = ("_base", "_tensor", "_view")

    def __init__(self, t: torch.Tensor) -> None:
        self._tensor = weakref.ref(t)
        base = t._base
        self._base = None if base is None else weakref.ref(base)
        self._view = None if base is None else (t.size(), t.stride(), t.storage_offset())

    def get(self) -> torch.Tensor:
        t = self._tensor()
        if t is not None:
            return t
        base = None if self._base is None else self._base()
        if base is None:
            raise AssertionError(
                "a tensor a captured function read is gone (nothing keeps it past the capture): a CUDA graph would "
                "read its freed memory at each replay; keep it where the graph is kept (ModelSlot.constant)"
            )
        return base.as_strided(*self._view)


def _outputs(out) -> tuple:
    """An op's outputs as a flat tuple (a tensor, or a tuple or list of tensors and other values)."""
    return tuple(out) if isinstance(out, (tuple, list)) else (out,)


class _OpRecorder(TorchDispatchMode):
    """Runs every aten op dispatched while active and records it (:class:`OpGraph`): its overload, and its arguments
    with each tensor an earlier recorded op made as that op's output, every other one (the caller's) as itself.
    """

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[tuple] = []
        self.made: dict[int, tuple[int, int]] = {}  # id of a tensor an op made -> (op, output)
        self._alive: list[object] = []  # every such tensor, kept alive while recording so that no id is reused

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        self.ops.append((func, *self._template(args, kwargs)))
        i = len(self.ops) - 1
        for j, t in enumerate(_outputs(out)):
            if isinstance(t, torch.Tensor):
                self.made[id(t)] = (i, j)
        self._alive.append(out)
        return out

    def source(self, t) -> tuple[int, int] | None:
        """``(op, output)`` of the recorded op that made ``t``, or None (the caller's, or not a tensor)."""
        return self.made.get(id(t)) if isinstance(t, torch.Tensor) else None

    def _template(self, args: tuple, kwargs: dict) -> tuple:
        """``(args, kwargs, fills)``: the arguments as given, with each tensor replaced by what a replay puts there:
        ``(position, index, op, output)``, ``index`` None for an argument and its place in a list argument (a
        keyword's position is its name). ``op`` -1: the caller's tensor, found by its memory at each replay
        (:class:`_Held`); else an earlier op's output (no recorded tensor kept past the recording: each replay makes
        its own).
        """
        fills: list[tuple] = []

        def place(where, k, value):
            if not isinstance(value, torch.Tensor):
                return value
            made = self.source(value)
            fills.append((where, k, *(made or (-1, 0))))
            return None if made else _Held(value)

        def template(where, value):
            if isinstance(value, (tuple, list)) and any(isinstance(x, torch.Tensor) for x in value):
                return [place(where, k, x) for k, x in enumerate(value)]
            return place(where, None, value)

        args = [template(where, value) for where, value in enumerate(args)]
        kwargs = {where: template(where, value) for where, value in kwargs.items()}
        return args, kwargs, fills


class OpGraph:
    """A recorded function's aten ops, replayed as a CUDA graph replays its kernels (:func:`record_ops`)."""

    def __init__(self, ops: list[tuple], result: list[tuple[int, int]]) -> None:
        self._ops, self._result = ops, result

    def __call__(self) -> tuple:
        made: list[tuple] = []
        for func, args, kwargs, fills in self._ops:
            if fills:
                args, kwargs = list(args), dict(kwargs)
                for where, k, i, j in fills:
                    held = kwargs if isinstance(where, str) else args
                    if k is None:
                        held[where] = made[i][j] if i >= 0 else held[where].get()
                    else:
                        items = list(held[where])
                        items[k] = made[i][j] if i >= 0 else items[k].get()
                        held[where] = items
            made.append(_outputs(func(*args, **kwargs)))
        return tuple(made[i][j] for i, j in self._result)


def record_ops(slot: ModelSlot, run: Callable, wrap: Callable[[Callable], Callable] | None = None):
    """``ModelSlot._record`` with a stand-in that replays as a CUDA graph does (see the module's docstring): ``(graph,
    outputs)``. ``wrap(run)``: what records instead of ``run`` itself (a test's guard). As a capture on CUDA, ``run``
    runs once unrecorded first (the slot's warm-up): what it makes on first use (a layer's stacked projections) is made
    there, so the recording reads it as a graph would, not the ops that made it.
    """
    form = slot.kv.attention_form
    run()
    call = run if wrap is None else wrap(run)
    recorder = _OpRecorder()
    with recorder:
        result = call()
    made = [recorder.source(t) for t in result]
    if None in made:
        raise AssertionError("a recorded function returned a tensor no recorded op made")
    graph = OpGraph(recorder.ops, made)
    outputs = tuple(t.clone() for t in result)
    return StandInGraph(graph, outputs, form), outputs


def capture_on_cpu(set_attr: Callable, record: Callable = record_ops, replay_ms: Callable | None = None) -> None:
    """Every :class:`ModelSlot` made from now on captures as on CUDA, with the stand-in graph (``record``: its
    ``_record``), through ``set_attr(owner, name, value)`` (a test's ``monkeypatch.setattr``; :func:`stand_in_graphs`
    undoes its own). ``replay_ms(slot, graph)``: a replay's ms as a slot times its forms and buckets (default: the
    bucket's rows, so that a smaller bucket is faster).
    """
    set_attr(ModelSlot, "_record", record)
    set_attr(ModelSlot, "_time", replay_ms or (lambda _slot, g: float(g.rows.numel())))
    made = ModelSlot.__init__

    def as_on_cuda(self, *args, **kwargs):
        made(self, *args, **kwargs)
        self.graphs_on = True

    set_attr(ModelSlot, "__init__", as_on_cuda)


@contextlib.contextmanager
def stand_in_graphs() -> Iterator[None]:
    """Within the block, slots made capture with the stand-in (:func:`capture_on_cpu`) and the engine takes the
    accelerator's paths (:func:`~adaptive_spec.rng.accelerator_path_on_cpu`); undone after it.
    """
    saved: list[tuple[object, str, object]] = []

    def set_attr(owner, name, value) -> None:
        saved.append((owner, name, vars(owner)[name]))
        setattr(owner, name, value)

    try:
        capture_on_cpu(set_attr)
        with accelerator_path_on_cpu():
            yield
    finally:
        for owner, name, value in reversed(saved):
            setattr(owner, name, value)
