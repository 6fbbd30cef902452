"""Captured forwards: one CUDA graph per row bucket of a model's forward against its static KV cache.

On a GPU a small model's eager forward is bound by kernel launches and Python: SmolLM2-135M
costs about 18 ms eagerly for 1 to 128 rows on an H200, where a CUDA graph of the same kernels
replays in about 5. A :class:`ModelSlot` keeps a model's :class:`~.static_cache.StaticKV` and, on
CUDA, a graph per bucket of rows (:data:`BUCKETS`) of the runner's core forward
(``ids, positions, mask[, features] -> logits, hidden``), captured on first use and reused by every
later request of the engine. A forward of ``n`` rows replays a bucket ``b >= n`` (below): its
``b - n`` padding rows read stale inputs, write their keys and values into the cache's scratch
rows (:data:`~.static_cache.SCRATCH`), which no pass reads (a captured pass attends over the cache's
``capacity`` rows, its mask hiding those not committed or in the block), and are never returned.

A larger bucket is not always slower: on an H100 SmolLM2's captured pass cost 9.1 and 9.5 ms at 8 and
16 rows but 6.7 at 32 (the matrix kernels chosen per shape differ). So each bucket is timed when it
is captured (median of three replays), and ``n`` rows replay the fastest captured bucket of at
least ``n`` rows; a larger bucket is taken only when it is at least 10 % faster than a smaller one
(:func:`fastest_bucket`). The first forward of ``n`` rows captures every bucket from ``n``'s up, so
the choice is made among all of them, once per slot.

A capture that fails (an operation that cannot be captured, out of memory, ...) logs one line
saying why, and the slot runs eagerly from then on: same results, slower.

A whole draft is one graph too (:meth:`ModelSlot.draft_graph`, recorded from the drafters' ``captured_*`` functions
in :mod:`~adaptive_spec.engine.drafting`: chains, hybrid drafts, static trees, EAGLE-style trees of either law):
the pending rows' forward as a bucket's, then every draw and every level, each level's cache rows, positions and mask
computed on the device from the graph's inputs. Replayed once a step, it drafts with no Python a level: on an H200 a
``chain:3/block`` step spent 1.9 ms of host time launching three levels whose kernels ran 0.1 ms each, and the
48-node EAGLE tree's 5.4 ms (``docs/measurements/gpu-h200-2026-11-28c/``).

``compiled=True`` (``SpecEngine(..., compile_forwards=True)``, off by default) also captures
``torch.compile``'s code of the forward: fewer, fused kernels per replay (a small model's captured
pass is bound by its kernel count: SmolLM2's one-row pass is about a thousand small kernels). On an
H200, a SmolLM2-shaped Llama's replay took 3.42 ms compiled against 4.68 eager-captured at 1 row and
4.21 against 5.49 at 4 rows, but 7.68 compiled at 16 rows against 6.22 for the eager 32-row graph
(``docs/measurements/gpu-h200-2026-11-27/``). So the bucket a forward needs is compiled when first
needed, if it is one of :data:`COMPILED` (about 30 s each there: every bucket at once would cost
minutes; the seconds are in :attr:`ModelSlot.compile_s`), timed like the others, and ``n`` rows
replay the fastest timed graph, compiled or not. A compilation that fails logs one line and the
slot keeps its eager captures.
Compiled kernels round differently from eager ones (about 1e-5 on the logits), so the engine's law
is exactly that of the compiled target, and its greedy tokens may differ from transformers' where
two logits nearly tie.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from adaptive_spec.engine.decoder import refresh_fused, unversioned
from adaptive_spec.engine.layout import version_counter
from adaptive_spec.engine.static_cache import SCRATCH, StaticKV, round_capacity

__all__ = ["BUCKETS", "COMPILED", "DRAFT_DEPTH", "ModelSlot", "bucket_for", "fastest_bucket", "weights_key"]

_log = logging.getLogger("adaptive_spec.engine")

#: Row counts a forward is captured for; a forward of more rows than the last runs eagerly.
BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)
assert BUCKETS[-1] <= SCRATCH


def bucket_for(n: int) -> int | None:
    """The smallest bucket of at least ``n`` rows, or None when ``n`` is past the largest."""
    return next((b for b in BUCKETS if b >= n), None)


#: Buckets captured from ``torch.compile``'s code too when a slot compiles (``compiled=True``): on an H200 a
#: SmolLM2-shaped pass replayed faster compiled at 1 and 4 rows (3.42 vs 4.68 ms, 4.21 vs 5.49) and slower at
#: 16 (7.68 vs 6.22 for the eager 32-row graph), and each bucket took about 30 s to compile; a prefill's
#: larger blocks would compile for one use.
COMPILED = (1, 2, 4)


#: The deepest draft made in one replay (:meth:`ModelSlot.draft_graph`) whose cuts share its key (chains, EAGLE-style
#: trees); deeper ones are drafted level by level. Its first use captures every depth below it too, each capture
#: running its levels three times eagerly (two warm-ups, the capture) in each attention form: a chain of 8 is 36
#: levels a bucket. A static tree, whose cuts are other shapes, captures its own depth alone, at any depth.
DRAFT_DEPTH = 8


#: A larger bucket replaces a smaller one only when it is at least this much faster (timing noise).
FASTER = 0.9


def fastest_bucket(n: int, times: dict[int, float]) -> int | None:
    """The bucket ``n`` rows replay: the fastest timed bucket of at least ``n`` rows.

    ``times``: milliseconds per replay of each captured bucket. Buckets are scanned from the
    smallest up and a larger one is taken only when it costs less than :data:`FASTER` times the
    one taken so far. None when no timed bucket holds ``n`` rows.
    """
    best = None
    for b in sorted(b for b in times if b >= n):
        if best is None or times[b] < FASTER * times[best]:
            best = b
    return best


def weights_key(model: Any) -> tuple[tuple, tuple]:
    """What a model's static cache and captured forwards were made from: ``(parameters, buffers)``, each tensor's
    storage, version counter (None where it keeps none: an inference tensor), dtype, device and shape; an EAGLE head's
    bound embedding table among its parameters.

    A graph reads the tensors it was captured with. A parameter replaced (``load_state_dict(assign=True)``,
    ``.to(dtype)``, ``.half()``) leaves it reading freed memory; a buffer written in place leaves stale a slot's
    constants made from it (an EAGLE head's draft vocabulary, ``set_vocabulary``); a parameter written in place
    (``load_state_dict``) is read where it is, but leaves stale the stacked copies a fused capture form multiplies by
    (:func:`~.decoder.fused_weights`) until they are written again. So the engine lends a slot only to the weights it
    was made from (:meth:`ModelSlot.fits`). Nothing in a run writes them: a slot serves request after request.
    """
    params = list(model.parameters())
    with contextlib.suppress(AttributeError, NotImplementedError, ValueError):  # an EAGLE head's target's table
        params.append(model.get_input_embeddings().weight)

    def key(tensors: Any) -> tuple:
        return tuple((t.data_ptr(), version_counter(t), t.dtype, t.device, t.shape) for t in tensors)

    return key(params), key(model.buffers())


def _why(err: BaseException) -> str:
    """One line on a failure: its type and its message's first line."""
    return f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"


def _compiled(core: Callable[..., tuple[torch.Tensor, ...]]) -> Callable[..., tuple[torch.Tensor, ...]]:
    """``torch.compile`` of a runner's core forward for one static shape (a bucket's): fused kernels, no
    graphs of its own (the slot captures the compiled code in its own CUDA graph).

    Every bucket, model and cache size is a recompilation of one code object (the runners' core), past
    dynamo's default limit of 8, after which it would run the eager kernels without a word: the limit
    is raised to 64 (a process-wide setting, changed only when forwards are compiled).
    """
    import torch._dynamo.config as dynamo_config

    for name in ("recompile_limit", "cache_size_limit"):  # the first in recent torch, the second before
        if getattr(dynamo_config, name, 64) < 64:
            setattr(dynamo_config, name, 64)
            break
    return torch.compile(core, dynamic=False, mode="default")


@dataclass
class _Graph:
    graph: Any  # torch.cuda.CUDAGraph
    inputs: list[torch.Tensor]  # static inputs: ids [b], positions [b], mask [1, 1, b, W], extra [b, ...]
    rows: torch.Tensor  # [b] cache rows written (padding rows: scratch rows)
    scratch: torch.Tensor  # [b] the scratch rows, copied over ``rows`` before the real ones
    outputs: tuple[torch.Tensor, ...]  # logits [b, V'], hidden [b, H]
    # a mask-less replay's first mask row: its first ``open`` columns 0, the rest the lowest value (None: not known)
    open: int | None = None


@dataclass
class _DraftGraph(_Graph):
    """A whole draft's graph (:meth:`ModelSlot.draft_graph`): a bucket's inputs for the pending rows, plus the root's
    row among them and the draft's noise (a chain's uniforms, a tree's exponentials; unused at temperature 0).
    """

    last: torch.Tensor | None = None  # [1] long: the root's row among the pending rows (n - 1)
    noise: torch.Tensor | None = None


class ModelSlot:
    """A model's static KV cache and captured forwards, owned by the engine and reused across requests.

    Args:
        model: the model (its dtype and device size the cache).
        capacity: committed rows the cache holds (grown on demand).
        graphs: capture forwards as CUDA graphs (only on a CUDA device).
        compiled: capture ``torch.compile``'s code of each bucket's forward (with ``graphs`` only; see
            the module docstring).
        drafts: capture whole drafts too (a chain, an EAGLE-style tree), one graph each (with ``graphs`` only;
            :meth:`draft_graph`). None (the default): on, unless the environment's ``ADAPTIVE_SPEC_DRAFT_GRAPHS`` is
            ``0`` (benchmarks' A/B).

    ``early_pass``: the target's pass is queued without waiting for this draft's replay: a captured EAGLE-style
    tree's one read waits until the pass is queued (:class:`~adaptive_spec.engine.drafting.DeferredTree`), and a
    lookup trie beside this draft's path is copied without blocking (``queued`` of
    :func:`~adaptive_spec.trees.lookup.trie_with_path`); on unless the environment's ``ADAPTIVE_SPEC_EARLY_PASS``
    is ``0`` (benchmarks' A/B).
    """

    def __init__(
        self, model: Any, capacity: int, graphs: bool = False, compiled: bool = False, drafts: bool | None = None
    ) -> None:
        self.model = model
        self.weights = weights_key(model)  # what the slot was made from (fits)
        self.graphs_on = bool(graphs) and model.device.type == "cuda"
        self.compile_on = bool(compiled) and self.graphs_on
        self.kv = StaticKV.for_model(model, self._rows(capacity))
        self.failed: str | None = None  # why a capture failed: eager from then on
        self.compile_failed: str | None = None  # why a compiled capture failed: eager captures only from then on
        self._graphs: dict[int, _Graph] = {}
        self.times: dict[int, float] = {}  # milliseconds per replay of each captured bucket
        self._compiled: dict[int, _Graph] = {}  # graphs of torch.compile's code, per bucket (compiled only)
        self.compiled_times: dict[int, float] = {}  # milliseconds per replay of each of those
        # seconds spent compiling and capturing each bucket (compiled only; summed when a grown cache recompiles)
        self.compile_s: dict[int, float] = {}
        # attention forms (engine.decoder.attend): each bucket's kept form and every form's milliseconds a replay,
        # the graphs not kept (alive: they share the pool), and forms whose capture failed (why), skipped after
        self.forms: dict[int, str] = {}
        self.form_times: dict[int, dict[str, float]] = {}
        self._spare: list[_Graph] = []
        self.form_failed: dict[str, str] = {}
        self._pool: Any = None
        # whole drafts in one graph each (draft_graph), per (bucket, depth, draft and sampling key); their kept form and
        # every form's replay ms; why a draft capture failed (drafts made level by level from then on)
        self.drafts_on = os.environ.get("ADAPTIVE_SPEC_DRAFT_GRAPHS", "1").strip() != "0" if drafts is None else drafts
        self.early_pass = os.environ.get("ADAPTIVE_SPEC_EARLY_PASS", "1").strip() != "0"
        self._drafts: dict[tuple, _DraftGraph] = {}
        self.draft_times: dict[tuple, dict[str, float]] = {}
        self.draft_failed: str | None = None
        self.draft_capture_s = 0.0  # seconds spent capturing (and timing) draft graphs
        self._constants: dict[str, torch.Tensor] = {}

    @property
    def untracked(self) -> bool:
        """Whether a tensor of the model keeps no version counter: a write in place to it could not be seen, so the
        slot never captures stacked copies of the weights (fused forms).
        """
        return any(k[1] is None for part in self.weights for k in part)

    def fits(self, model: Any) -> bool:
        """Whether this slot serves ``model`` as it is now: the same model, with the weights the slot was made from
        (:func:`weights_key`). Parameters only written in place since are read by the graphs where they are: their
        stacked copies are written again in place (:func:`~.decoder.refresh_fused`) and the slot serves on. A tensor
        replaced, moved or cast, a buffer written, or compiled graphs (which may hold their own copies) make a new slot.
        """
        if model is not self.model:
            return False
        now = weights_key(model)
        if now == self.weights:
            return True
        params, buffers = now
        in_place = buffers == self.weights[1] and unversioned(params) == unversioned(self.weights[0])
        if not in_place or self._compiled or not refresh_fused(model):
            return False
        self.weights = now
        return True

    def _rows(self, capacity: int) -> int:
        """Rows to allocate for ``capacity``: rounded up, compiling or not.

        A captured pass attends over every row the cache holds (its shapes are fixed), so rows beyond a
        request's may cost time in each replay: on an H100, plain decoding with compiled forwards and caches of 2048
        rows ran at 9.2 ms a token, against 5.7 ms captured eagerly with caches sized to the requests
        (two runs in one lease, ``docs/measurements/gpu-h100-2026-11-27c/``; ``tools/gpu-check.sh --steps capacity``
        measures the rows alone). A compiling slot is therefore sized as the others, and one that
        grows compiles again (~30 s a bucket) and says so: warm it up with the longest request it will serve
        (``bench e2e`` does).
        """
        return round_capacity(capacity)

    def ensure(self, capacity: int, keep: int = 0) -> None:
        """Room for ``capacity`` committed rows (the first ``keep`` rows kept); growing drops the graphs."""
        if capacity > self.kv.capacity:
            if self._compiled:
                _log.warning(
                    "the static cache of %s grows to %d rows: its compiled forwards compile again (~30 s a bucket)",
                    type(self.model).__name__,
                    self._rows(capacity),
                )
            self.kv = self.kv.grown(self._rows(capacity), keep)
            # The graphs read the old buffers; with them goes their memory pool (a pool whose graphs
            # are all freed cannot take another capture).
            self._graphs.clear()
            self.times.clear()
            self._compiled.clear()
            self.compiled_times.clear()
            self.forms.clear()
            self.form_times.clear()
            self._spare.clear()
            self._drafts.clear()
            self.draft_times.clear()
            self._pool = None

    @property
    def captured(self) -> list[int]:
        """The buckets captured so far (from the eager kernels; :attr:`compiled_times` has the compiled ones)."""
        return sorted(self._graphs)

    def graph(
        self,
        n: int,
        core: Callable[..., tuple[torch.Tensor, ...]],
        extra: Sequence[torch.Tensor],
        forms: Sequence[str] = ("sdpa",),
    ) -> _Graph | None:
        """The graph ``n`` rows replay (captured now if needed: see the module docstring), or None: run eagerly.

        ``forms``: the attention forms a bucket is captured in (:func:`~.decoder.attend`; the runner's lean layers
        know two), each timed, the fastest kept (:meth:`_capture_forms`).
        """
        if not self.graphs_on or self.failed is not None:
            return None
        b = bucket_for(n)
        if b is None:
            return None
        if b not in self._graphs:
            try:
                for c in BUCKETS[BUCKETS.index(b) :]:  # this bucket and every larger one, each timed
                    if c not in self._graphs:
                        self._capture_forms(c, core, extra, forms)
            except Exception as err:  # noqa: BLE001 - any capture failure falls back to eager, said once
                self.failed = self._gave_up("CUDA graph capture of {} failed ({}); running its forwards eagerly", err)
                return None
        if self.compile_on and self.compile_failed is None and b in COMPILED and b not in self._compiled:
            name = type(self.model).__name__
            try:
                t0 = time.perf_counter()
                self.kv.attention_form = self.forms.get(b, "sdpa")  # the form that captured faster eagerly
                try:
                    self._compiled[b] = self._capture(b, _compiled(core), extra)
                finally:
                    self.kv.attention_form = "sdpa"
                self.compile_s[b] = self.compile_s.get(b, 0.0) + time.perf_counter() - t0
                self.compiled_times[b] = self._time(self._compiled[b])
                _log.info("compiled and captured %d rows of %s in %.1f s", b, name, self.compile_s[b])
            except Exception as err:  # noqa: BLE001 - a failed compilation keeps the eager captures, said once
                self._compiled.pop(b, None)
                self.compile_failed = self._gave_up("compiling {} failed ({}); replaying its eager captures", err)
        return self._fastest(n)

    def _capture_forms(
        self, b: int, core: Callable[..., tuple[torch.Tensor, ...]], extra: Sequence[torch.Tensor], forms: Sequence[str]
    ) -> None:
        """Capture bucket ``b`` in each attention form, time each replay and keep the fastest: :attr:`forms`,
        :attr:`form_times` (:meth:`_fastest_form`).
        """
        graph, ms, form, times = self._fastest_form(lambda: self._capture(b, core, extra), forms)
        self._graphs[b], self.times[b], self.forms[b] = graph, ms, form
        self.form_times[b] = times

    def _fastest_form(
        self, capture: Callable[[], _Graph], forms: Sequence[str]
    ) -> tuple[_Graph, float, str, dict[str, float]]:
        """``capture()`` in each attention form (the cache's ``attention_form`` while capturing), each replay timed:
        ``(the fastest graph, its ms, its form, every form's ms)``; the others are kept alive (they share the pool).

        The first form is the reference: its failure is the slot's (raised). Another's is said in one line and
        that form is not tried again.
        """
        kept: tuple[_Graph, float, str] | None = None
        times: dict[str, float] = {}
        if self.untracked:  # the projections' own weights, never stacked copies (fits); the first form still first
            forms = tuple(dict.fromkeys(f.partition("+")[0] for f in forms))
        for form in forms:
            if form in self.form_failed:
                continue
            self.kv.attention_form = form
            try:
                graph = capture()
            except Exception as err:  # a form that cannot be captured is dropped, said once
                if form == forms[0]:
                    raise
                why = f"capturing {{}} with {form} attention failed ({{}}); keeping the other forms"
                self.form_failed[form] = self._gave_up(why, err)
                continue
            finally:
                self.kv.attention_form = "sdpa"
            times[form] = ms = self._time(graph)
            if kept is None or ms < kept[1]:
                if kept is not None:
                    self._spare.append(kept[0])
                kept = (graph, ms, form)
            else:
                self._spare.append(graph)
        assert kept is not None  # the first form was captured, or raised
        return (*kept, times)

    def draft_graph(
        self,
        n: int,
        depth: int,
        key: Any,
        make: Callable[[int], tuple[Callable[..., tuple[torch.Tensor, ...]], tuple[tuple[int, ...], torch.dtype], int]],
        extra: Sequence[torch.Tensor],
        forms: Sequence[str] = ("sdpa",),
        most: Callable[[int], int] = lambda d: d + 1,
        cuts: bool = True,
    ) -> _DraftGraph | None:
        """The graph of a whole draft of ``depth`` levels after ``n`` pending rows, captured now if needed; None: draft
        it level by level (no graphs, a capture failed, too deep or too many rows). Its block rows (``make(depth)``'s)
        must be fewer than :data:`~.static_cache.SCRATCH`: a fresh graph's warm-up and timing write scratch rows only.

        ``make(d)`` is the drafter's draft of ``d`` levels (:mod:`~adaptive_spec.engine.drafting`: a chain of ``d``
        tokens, an EAGLE-style tree cut at depth ``d``): ``(core, (noise shape, noise dtype), block rows)``, where
        ``core(ids, pos, mask, *extra, rows=, last=, noise=)`` runs the pending rows' forward as a bucket's, then every
        draw (from ``noise``, drawn before each replay, at temperature > 0) and every level's forward, each cache row,
        position and mask computed on the device from the graph's inputs
        (:meth:`~adaptive_spec.engine.runner.ModelRunner.root_stage`, ``level_forward``), so that one replay drafts
        wherever the cache stands; ``block rows``: the rows it writes after the pending ones. ``key``: what else the
        recorded kernels bake in (the draft's kind and shape, the sampling settings). One graph per bucket, depth and
        key, captured in each attention form and the fastest kept (:attr:`draft_times`).

        The first request of a depth and key captures, with it, the drafts of every depth below (a request's last
        steps cut its drafts to its budget) after every bucket up to ``most(d)`` pending rows (the most a step of
        that depth leaves: an EAGLE head feeds the accepted nodes again), so that later requests capture nothing; up
        to :data:`DRAFT_DEPTH`. ``cuts`` False: the draft's cuts are other drafts with keys of their own (a static
        tree's are other shapes), so only ``depth`` is captured, at any depth. A failed capture logs one line and every
        later draft is made level by level.
        """
        if not (self.graphs_on and self.drafts_on) or self.failed is not None or self.draft_failed is not None:
            return None
        b = bucket_for(n)
        if b is None or (cuts and depth > DRAFT_DEPTH):
            return None
        if (b, depth, key) not in self._drafts:
            t0 = time.perf_counter()
            try:
                for d in range(1 if cuts else depth, depth + 1):
                    made, top = make(d), bucket_for(min(max(most(d), b if d == depth else 1), BUCKETS[-1]))
                    for c in BUCKETS[: BUCKETS.index(top) + 1]:
                        if (c, d, key) not in self._drafts:
                            self._capture_draft_forms((c, d, key), made, extra, forms)
            except Exception as err:  # noqa: BLE001 - any capture failure falls back to level-by-level drafts, said once
                self.draft_failed = self._gave_up(
                    "capturing a whole draft of {} failed ({}); drafting level by level", err
                )
                return None
            finally:
                self.draft_capture_s += time.perf_counter() - t0
        return self._drafts[b, depth, key]

    def _capture_draft_forms(self, k: tuple, made: tuple, extra: Sequence[torch.Tensor], forms: Sequence[str]) -> None:
        """Capture the draft graph ``k = (bucket, depth, key)`` in each attention form and keep the fastest."""
        core, noise, _ = made
        g, _, form, times = self._fastest_form(lambda: self._capture(k[0], core, extra, noise), forms)
        self._drafts[k] = g
        self.draft_times[k] = {"kept": form, **times}

    def constant(self, name: str, value: Any) -> Any:
        """``value`` (a tensor: a copy of it) kept as long as the slot (a captured kernel may read it after the caller's
        copy is gone): the first value given under ``name``.
        """
        if name not in self._constants:
            self._constants[name] = value.clone() if isinstance(value, torch.Tensor) else value
        return self._constants[name]

    def replay_draft(
        self,
        g: _DraftGraph,
        n: int,
        start: int,
        ids: torch.Tensor,
        pos: torch.Tensor,
        mask: torch.Tensor | None,
        extra: Sequence[torch.Tensor],
        fill: Callable[[torch.Tensor], None] | None,
    ) -> tuple[torch.Tensor, ...]:
        """Draft in one replay of ``g`` after ``n`` pending rows written at cache rows ``start ..`` (as
        :meth:`replay`'s); ``fill(noise)`` draws the draft's noise first (None at temperature 0, whose draws are
        argmaxes). Returns the graph's outputs themselves: the next replay overwrites them.
        """
        self.write_inputs(g, n, start, ids, pos, mask, extra)
        g.last.fill_(n - 1)
        if fill is not None:
            fill(g.noise)
        g.graph.replay()
        return g.outputs

    def replayed(self, n: int) -> tuple[int, float, bool] | None:
        """``(bucket, ms per replay, compiled)`` of the graph ``n`` rows replay among those captured so far: the
        fastest timed one holding them (:func:`fastest_bucket`), an eager capture or a compiled one; None if none.
        """
        best = {c: (t, False) for c, t in self.times.items()}
        for c, t in self.compiled_times.items():
            if c not in best or t < best[c][0]:
                best[c] = (t, True)
        b = fastest_bucket(n, {c: t for c, (t, _) in best.items()})
        return None if b is None else (b, *best[b])

    def _fastest(self, n: int) -> _Graph:
        """The graph of :meth:`replayed`."""
        b, _, compiled = self.replayed(n)
        return (self._compiled if compiled else self._graphs)[b]

    def _gave_up(self, message: str, err: BaseException) -> str:
        """After a failed capture: log ``message`` (its two ``{}``: the model's class, why) in one line, wait for the
        device (a broken capture may leave work queued); why, in one line (:func:`_why`).
        """
        why = _why(err)
        _log.warning(message.format(type(self.model).__name__, why))
        self._settle()
        return why

    def _settle(self) -> None:
        """After a failed capture: wait for the device (a broken capture may leave work queued)."""
        if self.kv.device.type == "cuda":
            torch.cuda.synchronize(self.kv.device)

    def _time(self, g: _Graph, repeats: int = 3) -> float:
        """Milliseconds of one replay of a fresh graph (median of ``repeats``, after one untimed).

        Its inputs are the capture's zeros and its rows the scratch rows: nothing committed is written.
        """
        g.rows.copy_(g.scratch)
        g.graph.replay()
        stream = torch.cuda.current_stream(self.kv.device)
        times = []
        for _ in range(repeats):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record(stream)
            g.graph.replay()
            end.record(stream)
            end.synchronize()
            times.append(start.elapsed_time(end))
        return sorted(times)[len(times) // 2]

    def _static_inputs(self, b: int, extra: Sequence[torch.Tensor]) -> tuple[list[torch.Tensor], torch.Tensor]:
        """A graph's static inputs for ``b`` rows, zeros: ``[ids [b], positions [b], mask [1, 1, b, capacity],
        *extra [b, ...]]``, and its scratch rows [b] (the padding rows' cache rows, past the capacity).
        """
        kv, device = self.kv, self.kv.device
        ids = torch.zeros(b, dtype=torch.long, device=device)
        pos = torch.zeros(b, dtype=torch.long, device=device)
        mask = torch.zeros(1, 1, b, kv.capacity, dtype=kv.keys[0].dtype, device=device)  # the rows a pass reads
        more = [torch.zeros(b, *e.shape[1:], dtype=e.dtype, device=device) for e in extra]
        return [ids, pos, mask, *more], kv.capacity + torch.arange(b, device=device)

    def _capture(
        self,
        b: int,
        core: Callable[..., tuple[torch.Tensor, ...]],
        extra: Sequence[torch.Tensor],
        noise: tuple[tuple[int, ...], torch.dtype] | None = None,
    ) -> _Graph:
        """Capture ``core`` over ``b`` rows (in the cache's attention form now): its static inputs, rows, outputs.

        ``noise``: a whole draft's (:meth:`draft_graph`), ``(shape, dtype)``: ``core`` is also given ``rows=``,
        ``last=`` (the root's row among the pending ones) and ``noise=``, a :class:`_DraftGraph`'s inputs. As
        captured, and as :meth:`_time` replays it, the root is then row 0 of the scratch rows and every level writes
        the scratch rows after it: nothing committed is written.
        """
        kv = self.kv
        inputs, scratch = self._static_inputs(b, extra)
        rows, form = scratch.clone(), kv.attention_form
        more: dict[str, torch.Tensor] = {}
        if noise is not None:
            last = torch.zeros(1, dtype=torch.long, device=kv.device)
            # uniforms or exponentials: 1 is a valid value of both
            more = {"rows": rows, "last": last, "noise": torch.ones(noise[0], dtype=noise[1], device=kv.device)}

        def run() -> tuple[torch.Tensor, ...]:
            kv.rows, kv.width = rows, None  # the whole capacity, the mask hiding what is not attended to
            kv.attention_form = form
            try:
                return tuple(core(*inputs, **more))
            finally:
                kv.attention_form = "sdpa"

        graph, outputs = self._record(run)
        if noise is None:
            return _Graph(graph, inputs, rows, scratch, outputs)
        return _DraftGraph(graph, inputs, rows, scratch, outputs, last=more["last"], noise=more["noise"])

    def _record(self, run: Callable[[], tuple[torch.Tensor, ...]]) -> tuple[Any, tuple[torch.Tensor, ...]]:
        """``run``'s kernels as a CUDA graph in the slot's memory pool: ``(graph, its outputs)``, after two warm-up
        calls on a side stream (lazy initialisation, cuBLAS workspaces) outside the capture.

        ``run`` sets every Python-side state its kernels depend on (the cache's rows, width and attention form)
        itself, so that the recorded kernels are its own whatever ran before; a CPU's stand-in for the graph
        (:func:`adaptive_spec.bench.stand_in.record_ops`, the tests') records its aten ops and replays those.
        """
        device = self.kv.device
        stream = torch.cuda.Stream(device)
        stream.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(stream):
            for _ in range(2):
                run()
        torch.cuda.current_stream(device).wait_stream(stream)
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            outputs = run()
        return graph, tuple(outputs)

    def write_inputs(
        self,
        g: _Graph,
        n: int,
        start: int,
        ids: torch.Tensor,
        pos: torch.Tensor,
        mask: torch.Tensor | None,
        extra: Sequence[torch.Tensor],
    ) -> None:
        """Write ``n`` rows, to go to cache rows ``start ..``, into ``g``'s static inputs (see :meth:`replay`)."""
        g_ids, g_pos, g_mask, *g_more = g.inputs
        g_ids[:n].copy_(ids)
        g_pos[:n].copy_(pos)
        width = start + n
        lowest = torch.finfo(g_mask.dtype).min
        if mask is None and g.open is not None:  # one row again: only the columns that changed since (one kernel)
            if width > g.open:
                g_mask[:, :, :1, g.open : width].zero_()
            elif width < g.open:
                g_mask[:, :, :1, width : g.open].fill_(lowest)
        else:
            if mask is None:
                g_mask[:, :, :n, :width].zero_()
            else:
                g_mask[:, :, :n, :width].copy_(mask)
            g_mask[:, :, :n, width:].fill_(lowest)
        g.open = width if mask is None else None
        for dst, src in zip(g_more, extra, strict=True):
            dst[:n].copy_(src)
        if n < g.rows.numel():  # padding rows write scratch rows
            g.rows.copy_(g.scratch)
        torch.arange(start, start + n, out=g.rows[:n])  # written in place: one kernel

    def replay(
        self,
        g: _Graph,
        n: int,
        start: int,
        ids: torch.Tensor,
        pos: torch.Tensor,
        mask: torch.Tensor | None,
        extra: Sequence[torch.Tensor],
    ) -> tuple[torch.Tensor, ...]:
        """Run ``n`` rows written at cache rows ``start ..`` through the graph; its outputs' first ``n`` rows (copies).

        ``mask``: the rows' additive mask over the first ``start + n`` cache rows ([1, 1, n, start + n]),
        or None for one row that attends to all of them.
        """
        self.write_inputs(g, n, start, ids, pos, mask, extra)
        g.graph.replay()
        return tuple(o[:n].clone() for o in g.outputs)
