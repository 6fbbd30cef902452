"""The captured path on a CPU: a stand-in for a CUDA graph that replays by running its recorded function again.

A :class:`~adaptive_spec.engine.graphs.ModelSlot` captures only on CUDA. :func:`capture_on_cpu` makes every slot made
after it capture as on CUDA with the stand-in instead, so that a CPU runs the engine's captured path, the one an
accelerator runs: the tests check it there (``tests/helpers/graphs.py``), and ``bench overhead --stand-in-graphs``
times the host's work a step on it, the replays left out (on a GPU a replay is one launch).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator

from adaptive_spec.engine.graphs import ModelSlot
from adaptive_spec.rng import accelerator_path_on_cpu


class StandInGraph:
    """A CUDA graph's stand-in on a CPU: each replay runs the recorded function again (it sets the cache's rows, width
    and attention form itself, as the recorded kernels have them) and writes its outputs in place, as a replay of the
    recorded kernels does. ``replays`` counts them; ``seconds`` (the class's) adds up the time every replay took.
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


def capture_on_cpu(set_attr: Callable, record: Callable = record_eagerly, replay_ms: Callable | None = None) -> None:
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
