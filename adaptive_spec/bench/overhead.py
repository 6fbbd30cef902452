"""``adaptive-spec bench overhead``: how much of a step is spent outside the two models' forwards.

The runners' forward entry (:data:`FORWARD_ENTRY`, patched on the class) times every forward
pass (with a CUDA synchronisation on GPUs); the rest of each generation's wall time is engine
overhead: tree bookkeeping, sampling, verification, cache commits and Python. Reported per plan
as a fraction of the wall time, with the per-phase split from the engine's own timers.

With ``--syncs`` it counts instead (:class:`HostSyncCounter`), per speculative step:

- the *host synchronisations*, by kind (:data:`SYNC_KINDS`) and by where they happen
  (:data:`WHERE`): outside the forwards (``engine``), inside them in the project's own model code
  (``runner``: the runners and the EAGLE head) or in transformers' code (``transformers``), as a mean per step and
  in the step with the most;
- the aten ops dispatched outside the models' forwards, by the engine's phase, per draft level
  (draft forward) and for the target's block, verification and commit.

On a CPU nothing waits, so the counter counts the operations that would make the host wait on
a device; see :class:`HostSyncCounter` for how it tells host tensors from device ones there. It counts
the accelerator's path (:func:`adaptive_spec.rng.accelerator_path`): a verifier that works lazily on a CPU
and ahead on an accelerator (traversal) runs ahead, and draws without replacement take the race, while counted.
"""

from __future__ import annotations

import functools
import os
import statistics
import sys
import time
import weakref
from collections import Counter

SIXTEEN_NODE_PLANS = "delayed:3x3x4/traversal,iid:3x5/specinfer,chain:15/block,wor:3x2x2x1/traversal"  # 16-node trees
# One plan per family: static (chain, iid, delayed, wor, and a 48-node i.i.d. tree), policy-grown
# (conf-chain, cum-chain, conf-delayed, eagle, learned-chain), lookup (chain, trie, and trie with the draft's path)
# and hybrid.
FAMILY_PLANS = (
    "chain:4/block,iid:3x5/specinfer,delayed:1x3x2/traversal,wor:2x2x1/rrsw,iid:4x12/specinfer,"
    "conf-chain:6:0.3/block,cum-chain:6:0.2/block,conf-delayed:6:0.5:3/traversal,eagle:5:12:3:2:wor/traversal,"
    "eagle:5:12:3:2/specinfer,"
    "learned-chain:6:0.15/block,lookup:8/block,lookup:3x8/nss,lookup:3x8+m3/nss,hybrid:2:2/block,"
    "conf-delayed:6:0.5:3:0.3/specinfer"
)
PLAN_PRESETS = {"families": FAMILY_PLANS, "sixteen": SIXTEEN_NODE_PLANS}

#: The one method every forward of the engine's runners goes through (``ModelRunner`` and every
#: subclass that overrides it, e.g. the EAGLE runner). The instruments patch it on the classes, so
#: a forward counts however it runs inside (the fast path, the model's own forward, a CUDA graph).
FORWARD_ENTRY = "_run_model"
#: ``SpecEngine`` methods run once per generation (not per step): counted apart (``setup``).
PER_GENERATION = ("_setup", "_prefill", "_finish")

#: Kinds of host synchronisation. ``item``: ``.item()``, ``int()``/``float()``/``__index__`` of a
#: tensor; ``bool``: ``bool()`` of a tensor (Python branching), ``torch.equal``/``allclose``;
#: ``tolist``/``numpy``; ``d2h``: ``.cpu()``, ``.to("cpu")``; ``nonzero``: ``nonzero``, ``argwhere``,
#: one-argument ``where``; ``mask_index``: boolean-mask indexing (read, or write of a tensor value),
#: ``masked_select``; ``data_dependent``: other ops whose output shape depends on the values
#: (``unique``, ``repeat_interleave`` without ``output_size``, ``bincount``); ``tensor_of_tensors``:
#: ``torch.tensor``/``as_tensor`` of tensors (one per tensor read); ``h2d``: host-to-device copies
#: (``torch.tensor(host data, device=...)``, ``.to(device)`` of a host tensor, ``t[i, j] = 1`` of one element
#: of a device tensor: torch copies the Python number to it from a host scalar, where a write of several
#: elements, ``t[i] = 1`` of a row, is a ``fill_`` with the number as the kernel's argument).
SYNC_KINDS = (
    "item",
    "bool",
    "tolist",
    "numpy",
    "d2h",
    "nonzero",
    "mask_index",
    "data_dependent",
    "tensor_of_tensors",
    "h2d",
)
#: Where a count happens: outside the forwards, or inside one in the project's code, transformers' or other code.
WHERE = ("engine", "runner", "transformers", "other")
#: The issue's goals: host syncs per step, aten ops outside the forwards per draft level and for
#: the target's block, verification and commit together.
GOALS = {"syncs_per_step": 2, "draft_ops_per_level": 40, "verify_commit_ops_per_step": 60}

_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_THIS_FILE = os.path.abspath(__file__)


def forward_bounds(model) -> tuple:
    """(first, last) modules of a forward pass: the model itself, or, where the engine's runner calls
    the model's parts itself (:func:`~adaptive_spec.engine.runner.fast_path_parts`), its input
    embedding and LM head. Hooks on those two do not turn the fast path off (hooks on the model do).
    For models run outside the engine's runners (the runners' forwards are seen at :data:`FORWARD_ENTRY`).
    """
    from adaptive_spec.engine.runner import fast_path_parts

    parts = fast_path_parts(model)
    return (model, model) if parts is None else (parts[0], parts[-1])


# ---------------------------------------------------------------------- the runners' forward entry
_LISTENERS: list = []  # objects with enter_forward(runner) / exit_forward(runner), while active
_SAVED: dict[type, object] = {}  # runner class -> its own FORWARD_ENTRY, while patched


def _runner_classes() -> list[type]:
    """``ModelRunner`` and its subclasses that define :data:`FORWARD_ENTRY` themselves."""
    import adaptive_spec.engine.eagle  # noqa: F401  (its runner subclass)
    from adaptive_spec.engine.runner import ModelRunner

    if FORWARD_ENTRY not in vars(ModelRunner):
        raise AttributeError(f"ModelRunner has no {FORWARD_ENTRY}: update adaptive_spec.bench.overhead.FORWARD_ENTRY")
    found, todo, seen = [], [ModelRunner], set()
    while todo:
        cls = todo.pop()
        if cls in seen:
            continue
        seen.add(cls)
        todo.extend(cls.__subclasses__())
        if FORWARD_ENTRY in vars(cls):
            found.append(cls)
    return found


def _entry(original):
    @functools.wraps(original)
    def entry(runner, *args, **kwargs):
        listeners = tuple(_LISTENERS)
        for listener in listeners:
            listener.enter_forward(runner)
        try:
            return original(runner, *args, **kwargs)
        finally:
            for listener in reversed(listeners):
                listener.exit_forward(runner)

    return entry


def _listen(listener) -> None:
    """Call ``listener`` at every runner forward's start and end (patching the classes on the first one)."""
    if not _LISTENERS:
        for cls in _runner_classes():
            _SAVED[cls] = vars(cls)[FORWARD_ENTRY]
            setattr(cls, FORWARD_ENTRY, _entry(_SAVED[cls]))
    _LISTENERS.append(listener)


def _unlisten(listener) -> None:
    """Stop calling ``listener``; restore the classes after the last one."""
    _LISTENERS.remove(listener)
    if not _LISTENERS:
        for cls, original in _SAVED.items():
            setattr(cls, FORWARD_ENTRY, original)
        _SAVED.clear()


class ForwardClock:
    """Accumulates the wall time spent inside ``model``'s forward passes through the engine's runners (``model``
    None: every runner's), nested ones counted once.
    """

    def __init__(self, model, sync_device=None) -> None:
        import torch

        self.seconds = 0.0
        self.calls = 0
        self._model = model
        self._depth = 0
        self._t0 = 0.0
        self._sync = (lambda: torch.cuda.synchronize(sync_device)) if sync_device is not None else (lambda: None)
        _listen(self)

    def enter_forward(self, runner) -> None:
        if self._model is not None and runner.model is not self._model:
            return
        self._depth += 1
        if self._depth == 1:
            self._sync()
            self._t0 = time.perf_counter()

    def exit_forward(self, runner) -> None:
        if self._model is not None and runner.model is not self._model:
            return
        self._depth -= 1
        if self._depth == 0:
            self._sync()
            self.seconds += time.perf_counter() - self._t0
            self.calls += 1

    def close(self) -> None:
        _unlisten(self)


# ---------------------------------------------------------------------- host syncs and aten ops
def _aten_kinds() -> dict:
    """The aten op overload packets whose dispatch is a host synchronisation, and their kind."""
    import torch

    aten = torch.ops.aten
    kinds = {
        "item": (aten.item, aten._local_scalar_dense),
        "bool": (aten.is_nonzero, aten.equal, aten.allclose),
        "nonzero": (aten.nonzero, aten.nonzero_numpy, aten.argwhere),
        "mask_index": (aten.masked_select,),
        "data_dependent": (aten._unique, aten._unique2, aten.unique_dim, aten.unique_consecutive, aten.bincount),
    }
    return {packet: kind for kind, packets in kinds.items() for packet in packets}


def _has_mask(indices) -> bool:
    import torch

    return any(i is not None and i.dtype in (torch.bool, torch.uint8) for i in indices)


def _tensor_args(args, kwargs):
    """The tensors among an op's arguments (and inside list arguments)."""
    import torch

    for a in (*args, *kwargs.values()):
        if isinstance(a, torch.Tensor):
            yield a
        elif isinstance(a, (list, tuple)):
            yield from (x for x in a if isinstance(x, torch.Tensor))


def _count_tensors(data, limit: int = 1 << 16) -> int:
    """Tensors inside nested lists/tuples ``data`` (the first ``limit`` items looked at)."""
    import torch

    n, todo, seen = 0, [data], 0
    while todo and seen < limit:
        x = todo.pop()
        seen += 1
        if isinstance(x, torch.Tensor):
            n += 1
        elif isinstance(x, (list, tuple)):
            todo.extend(x)
    return n


class HostSyncCounter:
    """Counts host synchronisations and aten ops while active (a context manager).

    A ``TorchDispatchMode`` sees every aten op: it counts them, and the syncs among them (``item``,
    ``is_nonzero``, ``nonzero``, boolean-mask ``index``/``index_put_``, ``masked_select``, ...).
    Python-level patches count what the dispatcher does not show: ``tolist``, ``numpy``,
    ``.cpu()``/``.to(device)`` and ``torch.tensor``/``torch.as_tensor`` (of tensors, or of host
    data onto a device).

    Forwards are the engine's runner forwards (:data:`FORWARD_ENTRY`) and those of ``modules``
    (module hooks, :func:`forward_bounds`); inside one, each count is attributed by the innermost
    frame of this package (``runner``) or of transformers (``transformers``) on the Python stack (else ``other``).
    ``SpecEngine``'s per-generation methods (:data:`PER_GENERATION`) count as stage ``setup``, the
    rest as ``step``; ops outside the forwards are tagged with the engine's current phase
    (``PhaseTimer``; ``untimed`` between phases).

    On a device (``device`` not a CPU) a tensor on the CPU is a host tensor and a copy counts when
    it crosses devices. On a CPU the counter tracks where each tensor was made: on the host (results
    of ``.cpu()``/``.to("cpu")``, ``torch.tensor``/``as_tensor`` of host data without a device,
    Python scalars made tensors, outputs of ops whose tensor inputs all are host tensors), on the
    device (outputs of ops inside a forward or with a device tensor among their inputs, copies to
    the device), or unknown (factories such as ``torch.zeros(..., device=...)`` outside the
    forwards); views inherit their base's. Reads of host tensors are no syncs, reads of the others
    are; a ``.to(<torch.device>)`` outside the forwards counts as a host-to-device copy unless the
    tensor is a device tensor (inside the forwards such calls are same-device no-ops). There, moves
    between host and device return copies, as they do from a device, so that the tensor moved
    keeps being what it was.

    Attributes:
        syncs: Counter over ``(stage, where, kind)``.
        sites: Counter over ``(stage, where, kind, "file:line function")``.
        ops: Counter over ``(stage, phase)`` of aten ops outside the forwards.
        model_ops: Counter over ``(stage, where)`` of aten ops inside the forwards.
        forwards: Counter over ``(stage, role)`` of forwards (roles from ``roles``, else ``model``).
        launches: Counter over ``(stage, phase)`` of fused kernel launches (each also one of ``ops``).
        step_syncs: the syncs of each engine step (``StepMixin._step``), in order: the most in one step is the
            goal's strict reading ("at most 2 per step, whatever the tree"), where the totals give the mean.
    """

    def __init__(self, modules=(), roles: dict | None = None, device=None) -> None:
        import torch

        self.syncs: Counter = Counter()
        self.sites: Counter = Counter()
        self.ops: Counter = Counter()
        self.model_ops: Counter = Counter()
        self.forwards: Counter = Counter()
        self.launches: Counter = Counter()
        self.step_syncs: list[int] = []
        self._modules = modules
        self._roles = {id(m): role for role, m in (roles or {}).items() if m is not None}
        self._device_host = torch.device(device if device is not None else "cpu").type == "cpu"
        self._where_made: dict[int, tuple] = {}  # id -> (weakref, "host" or "device"), on a CPU (see _is_host)
        self._depth = 0  # forward depth
        self._setup = 0  # depth inside PER_GENERATION methods
        self._quiet = 0  # inside a Python-level counted call: its aten ops are not syncs again
        self._paused = 0  # the counter's own ops (copies it makes): not counted at all
        self._phase = "untimed"
        self._restore: list = []
        self._mode = None
        self._aten = _aten_kinds()
        self._reads = set(SYNC_KINDS) - {"h2d", "d2h"}

    # -- totals (engine: outside any forward; model: inside one)
    @property
    def engine(self) -> int:
        return sum(n for (_, where, _), n in self.syncs.items() if where == "engine")

    @property
    def model(self) -> int:
        return sum(n for (_, where, _), n in self.syncs.items() if where != "engine")

    def by_kind(self, where: str | None = None, stage: str | None = None) -> dict[str, int]:
        """Sync counts per kind (``where``/``stage``: only there)."""
        out: dict[str, int] = {}
        for (s, w, kind), n in self.syncs.items():
            if (where is None or w == where) and (stage is None or s == stage):
                out[kind] = out.get(kind, 0) + n
        return out

    # -- context manager
    def _start(self) -> HostSyncCounter:
        """Patch, hook and enter the dispatch mode (each step recorded in ``_restore``)."""
        import torch
        from torch.utils._python_dispatch import TorchDispatchMode

        from adaptive_spec.engine import draft_kernels
        from adaptive_spec.engine.engine import SpecEngine
        from adaptive_spec.engine.metrics import PhaseTimer
        from adaptive_spec.engine.step import StepMixin
        from adaptive_spec.rng import accelerator_path_on_cpu
        from adaptive_spec.verifiers import kernels

        counter = self

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                kwargs = kwargs or {}
                if counter._paused:
                    return func(*args, **kwargs)
                counter._on_op(func, args, kwargs)
                out = func(*args, **kwargs)
                if counter._device_host and not counter._quiet:
                    counter._propagate(func, args, kwargs, out)
                return out

        self._patch(torch.Tensor, "tolist", self._method("tolist"))
        self._patch(torch.Tensor, "numpy", self._method("numpy"))
        self._patch(torch.Tensor, "cpu", self._cpu)
        self._patch(torch.Tensor, "to", self._to)
        if self._device_host:  # on a device the dispatcher sees the copy itself
            self._patch(torch.Tensor, "__setitem__", self._setitem)
        self._patch(torch, "tensor", self._construct(torch.tensor, has_device_positional=False))
        self._patch(torch, "as_tensor", self._construct(torch.as_tensor, has_device_positional=True))
        self._patch(PhaseTimer, "switch", self._switch)
        self._patch(StepMixin, "_step", self._per_step)
        for module in (kernels, draft_kernels):
            for name in module.LAUNCHES:
                self._patch(module, name, self._launch)
        for name in PER_GENERATION:
            if name in vars(SpecEngine):
                self._patch(SpecEngine, name, self._per_generation)
        for m in self._modules:
            first, last = forward_bounds(m)
            h1 = first.register_forward_pre_hook(lambda _mod, _args, m=m: self._enter(m))
            h2 = last.register_forward_hook(lambda _mod, _args, _out: self.exit_forward(None))
            self._restore += [h1.remove, h2.remove]
        _listen(self)
        self._restore.append(lambda: _unlisten(self))
        ahead = accelerator_path_on_cpu()  # count the accelerator's path (see the module docstring)
        ahead.__enter__()
        self._restore.append(lambda: ahead.__exit__(None, None, None))
        self._mode = Mode()
        self._mode.__enter__()
        return self

    def __enter__(self) -> HostSyncCounter:
        try:
            return self._start()
        except BaseException:
            self._undo()
            raise

    def __exit__(self, *exc: object) -> None:
        self._mode.__exit__(*exc)
        self._mode = None
        self._undo()

    def _undo(self) -> None:
        """Undo every patch and hook, last first."""
        for undo in reversed(self._restore):
            undo()
        self._restore.clear()

    def _patch(self, owner, name: str, make) -> None:
        own = name in vars(owner)  # else inherited (torch.Tensor's methods from its C base)
        original = vars(owner)[name] if own else getattr(owner, name)
        setattr(owner, name, make(original))
        self._restore.append(lambda: setattr(owner, name, original) if own else delattr(owner, name))

    # -- forwards, phases, stages
    def enter_forward(self, runner) -> None:
        """A runner's forward starts."""
        self._enter(runner.model)

    def _enter(self, model) -> None:
        self._depth += 1
        if self._depth == 1:
            self.forwards[self._stage, self._roles.get(id(model), "model")] += 1

    def exit_forward(self, runner) -> None:  # noqa: ARG002
        """A forward ends."""
        self._depth -= 1

    @property
    def _stage(self) -> str:
        return "setup" if self._setup else "step"

    def _switch(self, original):
        counter = self

        def switch(timer, phase):
            original(timer, phase)
            counter._phase = phase or "untimed"

        return switch

    def _per_step(self, original):
        """An engine step: its syncs appended to :attr:`step_syncs`."""
        counter = self

        @functools.wraps(original)
        def step(*args, **kwargs):
            before = sum(counter.by_kind(stage="step").values())
            try:
                return original(*args, **kwargs)
            finally:
                counter.step_syncs.append(sum(counter.by_kind(stage="step").values()) - before)

        return step

    def _launch(self, original):
        """A fused kernel (:mod:`adaptive_spec.verifiers.kernels`, :mod:`adaptive_spec.engine.draft_kernels`) counts
        as one op, a launch, whatever runs it (on a CPU, Triton's interpreter, whose own work is not counted).
        """
        counter = self

        @functools.wraps(original)
        def launch(*args, **kwargs):
            if not counter._paused:
                counter.ops[counter._stage, counter._phase] += 1
                counter.launches[counter._stage, counter._phase] += 1
            counter._paused += 1
            try:
                return original(*args, **kwargs)
            finally:
                counter._paused -= 1

        return launch

    def _per_generation(self, original):
        counter = self

        @functools.wraps(original)
        def method(*args, **kwargs):
            counter._setup += 1
            try:
                return original(*args, **kwargs)
            finally:
                counter._setup -= 1

        return method

    # -- counting
    def _where(self) -> tuple[str, str]:
        """(where, site) of the current Python frame: the innermost frame of this package or transformers."""
        f = sys._getframe(1)
        while f is not None:
            path = f.f_code.co_filename
            own = path.startswith(_PACKAGE_DIR) and path != _THIS_FILE
            if own or f"{os.sep}transformers{os.sep}" in path:
                where = "engine" if not self._depth else ("runner" if own else "transformers")
                short = path[len(_PACKAGE_DIR) :] if own else path[path.rfind(f"{os.sep}transformers{os.sep}") + 1 :]
                return where, f"{short}:{f.f_lineno} {f.f_code.co_name}"
            f = f.f_back
        return ("engine" if not self._depth else "other"), "?"

    def _count(self, kind: str, n: int = 1) -> None:
        if n <= 0 or self._paused:
            return
        where, site = self._where()
        self.syncs[self._stage, where, kind] += n
        self.sites[self._stage, where, kind, site] += n

    def _is_host(self, t) -> bool:
        import torch

        if not isinstance(t, torch.Tensor):
            return True
        if not self._device_host:
            return t.device.type == "cpu"
        return self._made(t) == "host"

    def _made(self, t) -> str | None:
        """On a CPU: where the counter saw ``t`` (or the tensor it views) made, "host" or "device", else None."""
        for x in (t, t._base):
            entry = self._where_made.get(id(x)) if x is not None else None
            if entry is not None and entry[0]() is x:
                return entry[1]
        return None

    def _mark(self, t, where: str | None) -> None:
        """Record that ``t`` was made on the host or the device (None: forget it)."""
        key, table = id(t), self._where_made
        if where is None:
            table.pop(key, None)
            return

        def forget(ref) -> None:
            entry = table.get(key)
            if entry is not None and entry[0] is ref:
                del table[key]

        table[key] = (weakref.ref(t, forget), where)

    def _mark_host(self, t) -> None:
        self._mark(t, "host")

    def _propagate(self, func, args, kwargs, out) -> None:
        """On a CPU: an op's outputs are device tensors inside a forward or when one of its tensor inputs
        is; host tensors when all its inputs are (a Python scalar made a tensor, ``lift_fresh``, is one).
        Factories outside the forwards stay unknown.
        """
        import torch

        if self._depth:
            where = "device"
        elif func is torch.ops.aten.lift_fresh.default:
            where = "host"
        else:
            made = [self._made(a) for a in _tensor_args(args, kwargs)]
            where = "device" if "device" in made else ("host" if made and all(m == "host" for m in made) else None)
        if where is not None:
            for t in out if isinstance(out, (list, tuple)) else (out,):
                if isinstance(t, torch.Tensor):
                    self._mark(t, where)

    def _on_op(self, func, args, kwargs) -> None:
        import torch

        if self._depth:
            self.model_ops[self._stage, self._where()[0]] += 1
        else:
            self.ops[self._stage, self._phase] += 1
        if self._quiet:
            return
        aten = torch.ops.aten
        packet = func.overloadpacket
        kind = self._aten.get(packet)
        if kind is None:
            if func is aten.where.default:
                kind = "nonzero"
            elif func is aten.index.Tensor and _has_mask(args[1]):
                kind = "mask_index"
            elif packet in (aten.index_put_, aten.index_put, aten._index_put_impl_) and _has_mask(args[1]):
                value, masks = args[2], [i for i in args[1] if i is not None]
                # A lone mask with a host scalar value runs as masked_fill_: no sync.
                if not (len(masks) == 1 and value.numel() == 1 and self._is_host(value)):
                    kind = "mask_index"
            elif packet in (aten.index, aten.index_put_, aten.index_put, aten._index_put_impl_):
                # A device tensor indexed by host index tensors: they are copied to the device.
                if not self._is_host(args[0]) and any(i is not None and self._is_host(i) for i in args[1]):
                    kind = "h2d"
            elif packet is aten.repeat_interleave and func is aten.repeat_interleave.Tensor:
                kind = "data_dependent" if kwargs.get("output_size") is None else None
            elif packet in (aten.copy_, aten._to_copy, aten.to):
                kind = self._cross_device(func, args, kwargs)
        if kind in self._reads and isinstance(args[0], torch.Tensor) and self._is_host(args[0]):
            kind = None  # a read of a host tensor: nothing to wait for
        if kind is not None:
            self._count(kind)

    def _cross_device(self, func, args, kwargs) -> str | None:
        """A copy between devices seen by the dispatcher (on a device host only)."""
        import torch

        if self._device_host:
            return None
        if func.overloadpacket is torch.ops.aten.copy_:
            dst, src = args[0].device, args[1].device
        else:  # _to_copy, to.*: the device as a keyword, a positional device or another tensor
            src, dst = args[0].device, kwargs.get("device")
            for a in args[1:2]:
                dst = a.device if isinstance(a, torch.Tensor) else (a if isinstance(a, (str, torch.device)) else dst)
            dst = dst if dst is not None else src
        if src == dst:
            return None
        return "d2h" if torch.device(dst).type == "cpu" else "h2d"

    def _method(self, kind: str):
        counter = self

        def make(original):
            @functools.wraps(original)
            def method(tensor, *args, **kwargs):
                if not counter._is_host(tensor):
                    counter._count(kind)
                counter._quiet += 1
                try:
                    return original(tensor, *args, **kwargs)
                finally:
                    counter._quiet -= 1

            return method

        return make

    def _transfer(self, tensor, device) -> str | None:
        """The kind of moving ``tensor`` to ``device`` (str, torch.device or a tensor), None for no copy."""
        import torch

        text = isinstance(device, str)
        dst = device.device if isinstance(device, torch.Tensor) else torch.device(device)
        src = tensor.device
        if src != dst and not (src.type == dst.type == "cpu"):
            return "d2h" if dst.type == "cpu" else "h2d"
        if not self._device_host or dst.type != "cpu":
            return None  # the same device: no copy
        if text:  # .to("cpu") on a CPU host: a device-to-host move in intent
            return None if self._is_host(tensor) else "d2h"
        # .to(device) outside the forwards: a copy unless the tensor is known to be on the device already
        # (inside a forward, .to(x.device) is a same-device no-op)
        return None if self._depth or self._made(tensor) == "device" else "h2d"

    def _cpu(self, original):
        counter = self

        @functools.wraps(original)
        def cpu(tensor, *args, **kwargs):
            host = counter._is_host(tensor)
            counter._quiet += 1
            try:
                out = original(tensor, *args, **kwargs)
            finally:
                counter._quiet -= 1
            if host:
                return out
            counter._count("d2h")
            return counter._moved(tensor, out, "d2h")

        return cpu

    def _to(self, original):
        import torch

        counter = self

        @functools.wraps(original)
        def to(tensor, *args, **kwargs):
            device = kwargs.get("device")
            if device is None and args and isinstance(args[0], (str, torch.device, torch.Tensor)):
                device = args[0]
            if device is None:
                return original(tensor, *args, **kwargs)
            kind = counter._transfer(tensor, device)
            counter._quiet += 1
            try:
                out = original(tensor, *args, **kwargs)
            finally:
                counter._quiet -= 1
            if kind is None:
                return out
            counter._count(kind)
            return counter._moved(tensor, out, kind)

        return to

    def _setitem(self, original):
        """On a CPU: ``t[i, j] = number`` of one element of a device tensor counts as a host-to-device copy.

        On CUDA torch makes the number a host scalar and copies it into a one-element destination
        (``at::indexing::copy_to``: a larger one is filled, the number passed to the kernel).
        """
        counter = self

        @functools.wraps(original)
        def setitem(tensor, index, value):
            number = isinstance(value, (bool, int, float))
            if number and _one_element(index, tensor.dim()) and not counter._is_host(tensor):
                counter._count("h2d")
            return original(tensor, index, value)

        return setitem

    def _moved(self, src, out, kind: str):
        """On a CPU, a move between host and device (``kind``) returns a copy, as it does on a device,
        tagged by where it lands (the tensor moved keeps its own).
        """
        if not self._device_host:
            return out
        if out is src:
            self._paused += 1
            try:
                out = out.clone()
            finally:
                self._paused -= 1
        self._mark(out, "host" if kind == "d2h" else "device")
        return out

    def _construct(self, original, has_device_positional: bool):
        import torch

        counter = self

        def make(_unused):
            @functools.wraps(original)
            def construct(data, *args, **kwargs):
                device = kwargs.get("device")
                if device is None and has_device_positional and len(args) >= 2:
                    device = args[1]
                on_host = device is None or (isinstance(device, str) and torch.device(device).type == "cpu")
                kind, n = None, 1
                if isinstance(data, torch.Tensor):
                    kind = None if device is None else counter._transfer(data, device)
                else:
                    n = _count_tensors(data) if isinstance(data, (list, tuple)) else 0
                    if n:
                        kind = "tensor_of_tensors"  # each tensor read on the host
                    elif not on_host and not (isinstance(data, (list, tuple)) and not data):  # empty: no copy
                        kind, n = ("h2d" if counter._device_host or torch.device(device).type != "cpu" else None), 1
                counter._quiet += 1
                try:
                    out = original(data, *args, **kwargs)
                finally:
                    counter._quiet -= 1
                if kind is not None:
                    counter._count(kind, n)
                if isinstance(data, torch.Tensor):
                    return out if kind is None else counter._moved(data, out, kind)
                if counter._device_host:
                    counter._mark(out, "host" if on_host else "device")
                return out

            return construct

        return make


def _one_element(index, dims: int) -> bool:
    """Whether ``index`` (of a tensor of ``dims`` dimensions) picks one element by integers alone."""
    parts = index if isinstance(index, tuple) else (index,)
    return len(parts) == dims and all(isinstance(i, int) and not isinstance(i, bool) for i in parts)


def _per(n: float, d: float) -> float | None:
    return n / d if d else None


def summarize_counts(counter: HostSyncCounter, steps: int, generations: int) -> dict:
    """Per-step figures of a counter run over ``generations`` generations of ``steps`` steps in all."""
    step_syncs = {k: n for k, n in counter.syncs.items() if k[0] == "step"}
    total = sum(step_syncs.values())
    by_where = {w: 0 for w in WHERE}
    by_where_kind: dict[str, dict[str, float]] = {w: {} for w in WHERE}
    for (_, where, kind), n in step_syncs.items():
        by_where[where] = by_where.get(where, 0) + n
        by_where_kind.setdefault(where, {})[kind] = by_where_kind.get(where, {}).get(kind, 0) + n / steps
    by_kind = {kind: n / steps for kind, n in counter.by_kind(stage="step").items()}
    ops = {phase: n for (stage, phase), n in counter.ops.items() if stage == "step"}
    levels = counter.forwards["step", "draft"]
    verify_commit = sum(n for phase, n in ops.items() if phase not in ("draft", "target"))
    sites = sorted(
        ((n, where, kind, site) for (stage, where, kind, site), n in counter.sites.items() if stage == "step"),
        reverse=True,
    )
    row = {
        "steps": steps,
        "generations": generations,
        "syncs_per_step": _per(total, steps),
        "most_syncs_in_a_step": max(counter.step_syncs, default=None),
        "steps_over_sync_goal": sum(n > GOALS["syncs_per_step"] for n in counter.step_syncs),
        "syncs_per_step_by_kind": dict(sorted(by_kind.items())),
        "syncs_per_step_by_where": {w: n / steps for w, n in by_where.items()} if steps else {},
        "syncs_per_step_by_where_kind": {w: dict(sorted(v.items())) for w, v in by_where_kind.items() if v},
        "sync_sites": [
            {"where": where, "kind": kind, "site": site, "per_step": n / steps} for n, where, kind, site in sites[:15]
        ],
        "engine_syncs_per_step": _per(by_where["engine"], steps),
        "model_syncs_per_step": _per(total - by_where["engine"], steps),
        "target_forwards_per_step": _per(counter.forwards["step", "target"], steps),
        "draft_levels_per_step": _per(levels, steps),
        "ops_per_step": _per(sum(ops.values()), steps),
        "ops_per_step_by_phase": {phase: n / steps for phase, n in sorted(ops.items())} if steps else {},
        "draft_ops_per_step": _per(ops.get("draft", 0), steps),
        "draft_ops_per_level": _per(ops.get("draft", 0), levels),
        "target_ops_per_step": _per(ops.get("target", 0), steps),
        "verify_commit_ops_per_step": _per(verify_commit, steps),
        "fused_launches_per_step": _per(sum(n for (stage, _), n in counter.launches.items() if stage == "step"), steps),
        "model_ops_per_step_by_where": {
            where: n / steps for (stage, where), n in sorted(counter.model_ops.items()) if stage == "step"
        }
        if steps
        else {},
        "setup_syncs_per_generation": _per(sum(n for k, n in counter.syncs.items() if k[0] == "setup"), generations),
        "setup_ops_per_generation": _per(sum(n for k, n in counter.ops.items() if k[0] == "setup"), generations),
    }
    row["meets_goals"] = {
        "syncs_per_step": row["syncs_per_step"] is not None and row["syncs_per_step"] <= GOALS["syncs_per_step"],
        "syncs_in_every_step": row["most_syncs_in_a_step"] is not None
        and row["most_syncs_in_a_step"] <= GOALS["syncs_per_step"],
        "no_syncs_in_forwards": not row["model_syncs_per_step"],
        "draft_ops_per_level": row["draft_ops_per_level"] is None
        or row["draft_ops_per_level"] <= GOALS["draft_ops_per_level"],
        "verify_commit_ops_per_step": row["verify_commit_ops_per_step"] is not None
        and row["verify_commit_ops_per_step"] <= GOALS["verify_commit_ops_per_step"],
    }
    return row


def count_host_syncs(engine, prompts: list[str], plans: list, temperature: float, max_new_tokens: int) -> list[dict]:
    """Per plan: host synchronisations and aten ops per speculative step (see :func:`summarize_counts`)."""
    from adaptive_spec.rng import accelerator_path_on_cpu

    rows = []
    roles = {"target": engine.target, "draft": engine.draft}
    for plan in plans:
        # warm-up, on the path the counter takes (its device tensors made once: the plan's own and, as the request
        # ends, its depth cuts', which are slices of the plan's when it was drafted first)
        with accelerator_path_on_cpu():
            engine.generate(prompts[0], max_new_tokens=max_new_tokens, temperature=temperature, plan=plan, seed=0)
        steps = 0
        with HostSyncCounter(roles=roles, device=engine.device) as counter:
            for i, prompt in enumerate(prompts):
                r = engine.generate(prompt, max_new_tokens=max_new_tokens, temperature=temperature, plan=plan, seed=i)
                steps += r.stats.steps
        rows.append({"plan": str(plan), "temperature": temperature, **summarize_counts(counter, steps, len(prompts))})
    return rows


class ReplayClock(ForwardClock):
    """A :class:`ForwardClock` of every runner's forwards that also times every stand-in graph replay or stand-in
    capture (``bench overhead --stand-in-graphs``, :mod:`adaptive_spec.bench.stand_in`) and fused kernel (Triton's
    interpreter on a CPU), nested ones counted once: what the host would not spend on an accelerator, where a replay
    or a kernel is one launch. ``close()`` undoes its patches.
    """

    def __init__(self) -> None:
        from adaptive_spec.bench.stand_in import StandInGraph
        from adaptive_spec.engine import draft_kernels
        from adaptive_spec.engine.graphs import ModelSlot
        from adaptive_spec.verifiers import kernels

        super().__init__(None)
        self._saved = [(StandInGraph, "replay", StandInGraph.replay), (ModelSlot, "_record", ModelSlot._record)]
        self._saved += [(m, name, getattr(m, name)) for m in (kernels, draft_kernels) for name in m.LAUNCHES]
        for owner, name, original in self._saved:
            setattr(owner, name, self._timed(original))

    def _timed(self, original):
        clock = self

        @functools.wraps(original)
        def timed(*args, **kwargs):
            clock.enter_forward(None)
            try:
                return original(*args, **kwargs)
            finally:
                clock.exit_forward(None)

        return timed

    def close(self) -> None:
        super().close()
        for owner, name, original in self._saved:
            setattr(owner, name, original)


def measure_overhead(
    engine,
    prompts: list[str],
    plans: list,
    temperature: float,
    max_new_tokens: int,
    repeat: int = 1,
    stand_in: bool = False,
) -> list[dict]:
    """Per plan: wall time, time inside target and draft forwards, overhead fraction.

    ``repeat`` rounds, the plans interleaved in each (round 1 every plan, round 2 every plan, ...): a plan's row
    holds the sums over the rounds, its ms per step outside the forwards is the median round's
    (``overhead_ms_per_step``; every round's in ``rounds_ms_per_step``), so that a host's drift between
    rounds moves every plan alike and one slow round does not decide a figure.

    ``stand_in``: the engine's slots capture with the stand-in graph, on the accelerator's paths
    (:func:`~adaptive_spec.bench.stand_in.stand_in_graphs`, entered by the caller before the engine's first
    request): the overhead leaves out every forward, replay and capture (:class:`ReplayClock`), so it is the host's
    work a step on the captured path, as an accelerator's host does it (``replayed_s`` in each row).
    """
    if repeat < 1:
        raise ValueError(f"repeat must be at least 1, got {repeat}")
    for plan in plans:
        engine.generate(prompts[0], max_new_tokens=8, temperature=temperature, plan=plan, seed=0)  # warm-up
    once = functools.partial(
        _measure_once, engine, prompts, temperature=temperature, max_new_tokens=max_new_tokens, stand_in=stand_in
    )
    rounds = [[once(plan) for plan in plans] for _ in range(repeat)]
    rows = []
    for i, plan in enumerate(plans):
        runs = [r[i] for r in rounds]
        row = {"plan": str(plan)}
        for key in ("steps", "new_tokens", "wall_s", "target_forward_s", "draft_forward_s", "replayed_s", "overhead_s"):
            row[key] = sum(r[key] for r in runs)
        row["phase_times_s"] = {k: sum(r["phase_times_s"].get(k, 0.0) for r in runs) for k in runs[0]["phase_times_s"]}
        row["overhead_fraction"] = row["overhead_s"] / row["wall_s"] if row["wall_s"] else None
        per_round = [r["overhead_ms_per_step"] for r in runs]
        row["rounds_ms_per_step"] = per_round
        row["overhead_ms_per_step"] = statistics.median(per_round) if None not in per_round else None
        rows.append(row)
    return rows


def _measure_once(
    engine, prompts: list[str], plan, *, temperature: float, max_new_tokens: int, stand_in: bool = False
) -> dict:
    """One pass of ``plan`` over ``prompts``: wall time, forwards' time, steps, phases (``stand_in``: see
    :func:`measure_overhead`).
    """
    sync = engine.device if engine.device.type == "cuda" else None
    clocks = {"target": ForwardClock(engine.target, sync), "draft": ForwardClock(engine.draft, sync)}
    if stand_in:
        clocks["replayed"] = ReplayClock()
    wall, tokens, steps, phases = 0.0, 0, 0, {}
    try:
        for i, prompt in enumerate(prompts):
            r = engine.generate(prompt, max_new_tokens=max_new_tokens, temperature=temperature, plan=plan, seed=i)
            wall += r.stats.wall_time_s
            tokens += r.stats.new_tokens
            steps += r.stats.steps
            for k, v in r.stats.phase_times_s.items():
                phases[k] = phases.get(k, 0.0) + v
    finally:
        for c in clocks.values():
            c.close()
    fwd = clocks["replayed"].seconds if stand_in else clocks["target"].seconds + clocks["draft"].seconds
    return {
        "steps": steps,
        "new_tokens": tokens,
        "wall_s": wall,
        "target_forward_s": clocks["target"].seconds,
        "draft_forward_s": clocks["draft"].seconds,
        "replayed_s": clocks["replayed"].seconds if stand_in else 0.0,
        "overhead_s": wall - fwd,
        "overhead_ms_per_step": 1e3 * (wall - fwd) / steps if steps else None,
        "phase_times_s": phases,
    }
