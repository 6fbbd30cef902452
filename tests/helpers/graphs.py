"""The captured path on a CPU: a stand-in for a CUDA graph that replays by running the recorded function again."""

from __future__ import annotations

from adaptive_spec.engine.graphs import ModelSlot


class StandInGraph:
    """A CUDA graph's stand-in on a CPU: each replay runs the recorded function again (it sets the cache's rows, width
    and attention form itself, as the recorded kernels have them) and writes its outputs in place, as a replay of the
    recorded kernels does. ``replays`` counts them.
    """

    def __init__(self, run, outputs, form: str = "sdpa") -> None:
        self._run, self._outputs = run, outputs
        self.form = form  # the attention form it was captured in
        self.replays = 0

    def replay(self) -> None:
        self.replays += 1
        for out, new in zip(self._outputs, self._run(), strict=True):
            out.copy_(new)


def record_eagerly(self: ModelSlot, run):
    """``ModelSlot._record`` with a stand-in for the graph (see above): ``(graph, outputs)``."""
    form = self.kv.attention_form  # the form the slot captures in (``run`` sets it, then resets the cache's)
    outputs = tuple(o.clone() for o in run())
    return StandInGraph(run, outputs, form), outputs


def slots_as_on_cuda(monkeypatch, time=None) -> None:
    """Every :class:`ModelSlot` made from now on captures as on CUDA, with the stand-in graph; ``time(slot, graph)``:
    a replay's ms (default: its bucket's rows, so that smaller buckets are faster).
    """
    monkeypatch.setattr(ModelSlot, "_record", record_eagerly)
    monkeypatch.setattr(ModelSlot, "_time", time or (lambda self, g: float(g.rows.numel())))
    made = ModelSlot.__init__

    def as_on_cuda(self, *args, **kwargs):
        made(self, *args, **kwargs)
        self.graphs_on = True

    monkeypatch.setattr(ModelSlot, "__init__", as_on_cuda)
