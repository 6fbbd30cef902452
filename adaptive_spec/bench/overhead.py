"""``adaptive-spec bench overhead``: how much of a step is spent outside the two models' forwards.

Forward hooks on the target and the draft time every forward pass (pre-hook to hook, with a
CUDA synchronisation on GPUs); the rest of each generation's wall time is engine overhead:
tree bookkeeping, sampling, verification, cache commits and Python. Reported per plan as a
fraction of the wall time, with the per-phase split from the engine's own timers.

It also counts the *host synchronisations* per step (:class:`HostSyncCounter`): every call
that makes the host wait for a device value, ``.item()``, ``.tolist()``, ``float()``/``int()``/
``bool()`` of a tensor (Python branching on a tensor value) and ``.numpy()``. On a CPU they
cost nothing; on a GPU each one drains the launch queue. Calls made inside the models'
forwards (by transformers) are counted apart from the engine's own.
"""

from __future__ import annotations

import time

SIXTEEN_NODE_PLANS = "delayed:3x3x4/traversal,iid:3x5/specinfer,chain:15/block,wor:3x2x2x1/traversal"  # 16-node trees


def forward_bounds(model) -> tuple:
    """(first, last) modules of a forward pass: the model itself, or, where the engine's runner calls
    the model's parts itself (:func:`~adaptive_spec.engine.runner.fast_path_parts`), its input
    embedding and LM head. Hooks on those two do not turn the fast path off (hooks on the model do).
    """
    from adaptive_spec.engine.runner import fast_path_parts

    parts = fast_path_parts(model)
    return (model, model) if parts is None else (parts[0], parts[-1])


class ForwardClock:
    """Accumulates the wall time spent inside a model's forward passes (see :func:`forward_bounds`)."""

    def __init__(self, model, sync_device=None) -> None:
        import torch

        self.seconds = 0.0
        self.calls = 0
        self._t0 = 0.0
        self._sync = (lambda: torch.cuda.synchronize(sync_device)) if sync_device is not None else (lambda: None)
        first, last = forward_bounds(model)
        self._handles = [
            first.register_forward_pre_hook(self._start),
            last.register_forward_hook(self._stop),
        ]

    def _start(self, *_: object) -> None:
        self._sync()
        self._t0 = time.perf_counter()

    def _stop(self, *_: object) -> None:
        self._sync()
        self.seconds += time.perf_counter() - self._t0
        self.calls += 1

    def close(self) -> None:
        for h in self._handles:
            h.remove()


_SYNC_METHODS = ("item", "tolist", "numpy", "__bool__", "__float__", "__int__", "__index__")


class HostSyncCounter:
    """Counts host synchronisations on tensors while active (a context manager).

    ``engine`` counts the calls outside any model forward, ``model`` those inside one (the
    forward hooks of ``modules`` mark where a forward starts and ends).
    """

    def __init__(self, modules=()) -> None:
        self.engine = 0
        self.model = 0
        self.by_method: dict[str, int] = {}
        self._depth = 0
        self._modules = modules
        self._saved: dict[str, object] = {}
        self._handles: list = []

    def __enter__(self) -> HostSyncCounter:
        import torch

        for name in _SYNC_METHODS:
            original = getattr(torch.Tensor, name)
            self._saved[name] = original
            setattr(torch.Tensor, name, self._wrap(name, original))
        for m in self._modules:
            first, last = forward_bounds(m)
            self._handles.append(first.register_forward_pre_hook(self._enter_forward))
            self._handles.append(last.register_forward_hook(self._exit_forward))
        return self

    def __exit__(self, *exc: object) -> None:
        import torch

        for name, original in self._saved.items():
            setattr(torch.Tensor, name, original)
        for h in self._handles:
            h.remove()

    def _enter_forward(self, *_: object) -> None:
        self._depth += 1

    def _exit_forward(self, *_: object) -> None:
        self._depth -= 1

    def _wrap(self, name: str, original):
        counter = self

        def wrapped(tensor, *args, **kwargs):
            if counter._depth:
                counter.model += 1
            else:
                counter.engine += 1
                counter.by_method[name] = counter.by_method.get(name, 0) + 1
            return original(tensor, *args, **kwargs)

        return wrapped


def count_host_syncs(engine, prompts: list[str], plans: list, temperature: float, max_new_tokens: int) -> list[dict]:
    """Per plan: host synchronisations per speculative step, in the engine and inside the models."""
    rows = []
    for plan in plans:
        engine.generate(prompts[0], max_new_tokens=8, temperature=temperature, plan=plan, seed=0)  # warm-up
        steps = 0
        with HostSyncCounter([engine.target, engine.draft]) as counter:
            for i, prompt in enumerate(prompts):
                r = engine.generate(prompt, max_new_tokens=max_new_tokens, temperature=temperature, plan=plan, seed=i)
                steps += r.stats.steps
        rows.append(
            {
                "plan": str(plan),
                "temperature": temperature,
                "steps": steps,
                "engine_syncs_per_step": counter.engine / steps if steps else None,
                "model_syncs_per_step": counter.model / steps if steps else None,
                "engine_syncs_by_method": counter.by_method,
            }
        )
    return rows


def measure_overhead(engine, prompts: list[str], plans: list, temperature: float, max_new_tokens: int) -> list[dict]:
    """Per plan: wall time, time inside target and draft forwards, overhead fraction."""
    sync = engine.device if engine.device.type == "cuda" else None
    rows = []
    for plan in plans:
        engine.generate(prompts[0], max_new_tokens=8, temperature=temperature, plan=plan, seed=0)  # warm-up
        clocks = {"target": ForwardClock(engine.target, sync), "draft": ForwardClock(engine.draft, sync)}
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
        fwd = clocks["target"].seconds + clocks["draft"].seconds
        rows.append(
            {
                "plan": str(plan),
                "steps": steps,
                "new_tokens": tokens,
                "wall_s": wall,
                "target_forward_s": clocks["target"].seconds,
                "draft_forward_s": clocks["draft"].seconds,
                "overhead_s": wall - fwd,
                "overhead_fraction": (wall - fwd) / wall if wall else None,
                "overhead_ms_per_step": 1e3 * (wall - fwd) / steps if steps else None,
                "phase_times_s": phases,
            }
        )
    return rows
