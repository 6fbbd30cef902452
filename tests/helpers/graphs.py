"""The captured path on a CPU in tests: the stand-in for a CUDA graph (:mod:`adaptive_spec.bench.stand_in`) that
replays the recorded aten ops with the values they were recorded with, as a graph replays its kernels, and refuses
here, as a capture would, what a CUDA graph cannot record (:class:`CaptureGuard`)."""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from adaptive_spec.bench import stand_in
from adaptive_spec.engine.graphs import ModelSlot

#: aten ops a CUDA graph cannot record: host reads (the capture fails, or the value is baked in), random draws (the
#: recorded kernels would replay the same offsets unless the generator is registered with the graph: the engine draws
#: a draft's noise before the replay) and tensors made from host data (a host-to-device copy while capturing).
UNRECORDABLE = frozenset(
    {
        "_local_scalar_dense", "item", "is_nonzero", "nonzero", "nonzero_static", "masked_select", "equal",
        "allclose", "unique_consecutive", "_unique", "_unique2", "unique_dim", "lift_fresh", "uniform_",
        "exponential_", "normal_", "bernoulli_", "bernoulli", "random_", "multinomial", "randperm", "rand",
        "randn", "randint", "rand_like", "randn_like", "randint_like", "poisson", "geometric_", "cauchy_",
        "log_normal_",
    }
)  # fmt: skip


#: torch's factories, which make a tensor on the CPU unless given a device: on CUDA one made in a recorded function
#: without a device would be a host tensor, which its kernels cannot read
FACTORIES = ("arange", "zeros", "ones", "full", "empty", "eye", "linspace", "logspace", "rand", "randn")


class CaptureGuard(TorchDispatchMode):
    """While active, an op a CUDA graph cannot record (:data:`UNRECORDABLE`, boolean-mask indexing, ``tolist``, a
    factory without a device) raises, naming it: run around every call of a recorded function on a CPU, where nothing
    else would say so.
    """

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func._schema.name.split("::")[-1]
        masked = name in ("index", "index_put", "index_put_") and any(
            isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in (args[1] if len(args) > 1 else ()) or ()
        )
        if name in UNRECORDABLE or masked:
            raise AssertionError(f"{func} inside a captured function: a CUDA graph cannot record it")
        return func(*args, **kwargs)

    def __enter__(self):
        self._tolist = torch.Tensor.tolist
        self._factories = {name: getattr(torch, name) for name in FACTORIES}

        def refused(t):
            raise AssertionError("Tensor.tolist inside a captured function: a CUDA graph cannot record it")

        def placed(name, make):
            def factory(*args, **kwargs):
                if kwargs.get("device") is None and kwargs.get("out") is None:
                    raise AssertionError(
                        f"torch.{name} without a device inside a captured function (a CUDA graph cannot record it: "
                        "on CUDA a host tensor)"
                    )
                return make(*args, **kwargs)

            return factory

        torch.Tensor.tolist = refused
        for name, make in self._factories.items():
            setattr(torch, name, placed(name, make))
        return super().__enter__()

    def __exit__(self, *exc):
        torch.Tensor.tolist = self._tolist
        for name, make in self._factories.items():
            setattr(torch, name, make)
        return super().__exit__(*exc)


def guarded(run):
    """``run`` under a :class:`CaptureGuard`."""

    def call():
        with CaptureGuard():
            return run()

    return call


def record_ops(self: ModelSlot, run):
    """``ModelSlot._record`` with the stand-in graph that replays the recorded ops (:func:`.stand_in.record_ops`):
    ``(graph, outputs)``; the recording refuses what a CUDA graph cannot record (:class:`CaptureGuard`), and a replay
    runs the ops recorded, nothing else.
    """
    return stand_in.record_ops(self, run, guarded)


def record_eagerly(self: ModelSlot, run):
    """``ModelSlot._record`` with the stand-in graph that runs the recorded function again at each replay
    (:func:`.stand_in.record_eagerly`), under a :class:`CaptureGuard` each time: a negative control's, since it
    reads afresh at every replay what a graph would have baked in."""
    return stand_in.record_eagerly(self, run, guarded)


def slots_as_on_cuda(monkeypatch, time=None, record=record_ops) -> None:
    """Every :class:`ModelSlot` made from now on captures as on CUDA, with the guarded stand-in graph (``record``);
    ``time(slot, graph)``: a replay's ms (default: its bucket's rows, so that smaller buckets are faster).
    """
    stand_in.capture_on_cpu(monkeypatch.setattr, record, time)
