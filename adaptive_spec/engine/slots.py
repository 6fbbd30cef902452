"""The engine's static caches and captured forwards, lent to one run at a time and reused across runs.

:class:`SlotsMixin` holds the idle :class:`~adaptive_spec.engine.graphs.ModelSlot` of each model of
:class:`~adaptive_spec.engine.engine.SpecEngine` (``_idle_slots``, by role: ``"target"``, ``"draft"``), lends one to a
run if it still fits the model's weights (:meth:`SlotsMixin._lend`), and reports what their graphs measured
(:meth:`~SlotsMixin.compile_times`, :meth:`~SlotsMixin.attention_forms`, :meth:`~SlotsMixin.draft_graphs`).

The mixin reads the engine's ``device``, ``cuda_graphs`` and ``compile_forwards``.
"""

from __future__ import annotations

import logging
from typing import Any

from transformers import PreTrainedModel

from adaptive_spec.engine.eagle import is_eagle_head
from adaptive_spec.engine.graphs import ModelSlot
from adaptive_spec.engine.runner import fast_path_parts

_log = logging.getLogger("adaptive_spec.engine")


class SlotsMixin:
    """The static caches of :class:`~adaptive_spec.engine.engine.SpecEngine`: lent, given back, reported."""

    _idle_slots: dict[str, list[ModelSlot]]

    def _init_slots(self) -> None:
        """No idle static cache yet: the first run of each model makes its own (and its graphs, on first use)."""
        self._idle_slots = {"target": [], "draft": []}

    def _lend(self, role: str, model: PreTrainedModel, capacity: int) -> ModelSlot | None:
        """An idle static cache for ``model`` with room for ``capacity`` rows, or None for a dynamic cache."""
        if fast_path_parts(model) is None and not is_eagle_head(model):
            return None
        idle = self._idle_slots[role]
        while idle and not idle[-1].fits(model):
            stale = idle.pop()  # its graphs read tensors replaced since (or constants of buffers written): dropped
            _log.info(
                "the %s's weights changed since its static cache was made: making a new one%s",
                role,
                " (its forwards are captured again)" if stale.captured else "",
            )
        slot = (
            idle.pop() if idle else ModelSlot(model, capacity, graphs=self.cuda_graphs, compiled=self.compile_forwards)
        )
        slot.ensure(capacity)
        return slot

    def _give_back(self, slots: dict[str, ModelSlot]) -> None:
        """A run's static caches, idle again (for the next run of the same models)."""
        for role, slot in slots.items():
            self._idle_slots[role].append(slot)

    @property
    def compiles(self) -> bool:
        """Whether forwards are compiled: ``compile_forwards`` with CUDA graphs on a CUDA device (else it is idle)."""
        return self.compile_forwards and self.cuda_graphs and self.device.type == "cuda"

    def compile_times(self) -> dict[str, dict[int, float]]:
        """Seconds spent compiling and capturing each row bucket, per model (``"target"``, ``"draft"``), summed
        over the idle static caches (empty without ``compile_forwards``, off CUDA, or before a first request).
        """
        out: dict[str, dict[int, float]] = {}
        for role, slots in self._idle_slots.items():
            out[role] = {}
            for slot in slots:  # two slots of a model (concurrent requests) each compile their own buckets
                for b, t in slot.compile_s.items():
                    out[role][b] = out[role].get(b, 0.0) + t
        return out

    def attention_forms(self) -> dict[str, dict[int, dict[str, Any]]]:
        """Per model (``"target"``, ``"draft"``) and captured row bucket, the attention form its graph kept and each
        form's replay ms (``{"kept": "matmul", "ms": {"sdpa": 4.1, "matmul": 2.6}}``; see
        :func:`~adaptive_spec.engine.decoder.attend`), from the idle static caches (empty off CUDA or before a first
        request; with several caches of a model, the last one's).
        """
        out: dict[str, dict[int, dict[str, Any]]] = {}
        for role, slots in self._idle_slots.items():
            out[role] = {
                b: {"kept": form, "ms": dict(slot.form_times.get(b, {}))}
                for slot in slots
                for b, form in slot.forms.items()
            }
        return out

    def draft_graphs(self) -> dict[str, Any]:
        """The draft's whole-draft graphs (:meth:`~adaptive_spec.engine.graphs.ModelSlot.draft_graph`) over its idle
        static caches: ``{"graphs": [{"bucket", "depth", "kind", "greedy", "kept", "ms"}], "capture_s", "failed"}``
        (``ms``: each form's replay; none off CUDA, before a first request or with ``ADAPTIVE_SPEC_DRAFT_GRAPHS=0``).
        """
        slots = self._idle_slots["draft"]
        graphs = [
            {
                "bucket": b,
                "depth": d,
                "kind": key[0],  # "chain", or "eagle" (an EAGLE-style tree without replacement)
                "greedy": key[-1],
                "kept": t["kept"],
                "ms": {f: v for f, v in t.items() if f != "kept"},
            }
            for slot in slots
            for (b, d, key), t in slot.draft_times.items()
        ]
        failed = next((s.draft_failed for s in slots if s.draft_failed), None)
        return {"graphs": graphs, "capture_s": sum(s.draft_capture_s for s in slots), "failed": failed}
