"""``adaptive-spec bench passes``: what one target pass and one draft level cost, eager against captured.

A *pass* is what the engine runs once per step on the target: ``n`` block rows against a cache of
``context`` committed rows (:meth:`~adaptive_spec.engine.runner.ModelRunner.block_forward`, its
mask, positions and input copies included). A *draft level* is the same for the draft (an EAGLE
head or a standalone draft model) over the nodes of one tree level. Each size is timed with the
forwards eager and, on a CUDA device, replayed from the captured graphs
(:mod:`adaptive_spec.engine.graphs`), interleaved repetition by repetition, median reported; on a
GPU every timed call ends with a synchronisation.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

__all__ = ["measure_chains", "measure_passes"]


def _runner(
    engine: Any,
    role: str,
    graphs: bool,
    context: int,
    compiled: bool = False,
    capacity: int = 0,
    lean: bool = True,
    drafts: bool = False,
) -> Any:
    from adaptive_spec.engine.eagle import EagleRunner, draft_runner, is_eagle_head
    from adaptive_spec.engine.graphs import ModelSlot
    from adaptive_spec.engine.runner import ModelRunner, fast_path_parts

    model = engine.target if role == "target" else engine.draft
    static = fast_path_parts(model) is not None or is_eagle_head(model)
    size = max(capacity, context + 256)
    slot = ModelSlot(model, size, graphs=graphs, compiled=compiled, drafts=drafts) if static else None
    if role == "target":
        runner = ModelRunner(model, keep_features=is_eagle_head(engine.draft), slot=slot)
    else:
        runner = draft_runner(model, input_limit=engine.draft_input_limit, slot=slot)
    if not lean:  # the decoder layers' own modules
        runner.lean = None
    if isinstance(runner, EagleRunner):  # the target's features of the context, as the engine hands them over
        runner.set_target_features(0, torch.zeros(context, engine.hidden_sizes[1], device=engine.device))
    return runner


def _timer(engine: Any, runner: Any, context: int) -> Callable[[int], float]:
    """``timed(n)``: seconds of one forward of ``n`` chained rows after ``context`` rows, rolled back after."""
    device, vocab = engine.device, min(engine.vocab_size, engine.input_vocab_size)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, vocab, (context + 128,), generator=g).to(device)
    with torch.inference_mode():
        runner.chain_forward(ids[:context], logits_to_keep=1)

    def timed(n: int) -> float:
        block = ids[context : context + n].tolist()

        def forward() -> None:
            anc = torch.ones(n, n, dtype=torch.bool, device=device).tril_()
            pos = torch.arange(context, context + n, device=device)
            runner.block_forward(torch.tensor(block, device=device), pos, anc, logits_to_keep=n)

        return _seconds(device, runner, context, forward)

    return timed


def _seconds(device: torch.device, runner: Any, context: int, work: Callable[[], Any]) -> float:
    """Seconds of ``work()`` from a device sync to a device sync (on CUDA), the runner rolled back to ``context``
    after it.
    """
    cuda = device.type == "cuda"
    with torch.inference_mode():
        if cuda:
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        work()
        if cuda:
            torch.cuda.synchronize(device)
        seconds = time.perf_counter() - t0
        runner.rollback(context)
    return seconds


def measure_passes(
    engine: Any,
    rows: Sequence[int] = (1, 2, 4, 8, 16, 32, 64),
    draft_rows: Sequence[int] = (1, 2, 4, 8, 16),
    context: int = 256,
    repeats: int = 20,
    progress: bool = True,
    compiled: bool = False,
    capacity: int | None = None,
    layers: bool = False,
) -> list[dict[str, Any]]:
    """Median milliseconds of a target pass and a draft level per row count, eager and (on CUDA) captured.

    Returns one row per model and size: ``{"model", "rows", "eager_ms", "graph_ms", "speedup", "bucket",
    "replay_ms"}`` (``graph_ms`` None where no graph is captured: off CUDA, or past the largest bucket;
    ``bucket``: the captured bucket those rows replay, the fastest of at least that many rows;
    ``replay_ms``: that bucket's graph replay alone, timed on the device when it was captured, so
    ``graph_ms - replay_ms`` is the host's work around it: inputs, mask, the runner's bookkeeping;
    ``attention``, ``attention_replay_ms``: the attention form that bucket's graph kept and each form's replay ms,
    side by side, where it was captured in several (:func:`~adaptive_spec.engine.decoder.attend`); else None).
    ``compiled``: on CUDA, also time forwards from a slot that compiles
    (:class:`~adaptive_spec.engine.graphs.ModelSlot` with ``compiled=True``), in the same interleaving:
    ``compiled_ms``, ``compiled_bucket``, ``compiled_graph`` (whether the graph those rows replay there is the
    compiled capture, or the eager one, which is faster), ``compiled_replay_ms`` and ``compile_s`` (seconds to
    compile and capture that size's bucket; None when an earlier size compiled it or it is not compiled),
    each None elsewhere. ``capacity``: rows the static caches hold (default ``context + 256``, rounded up to
    256; a captured pass attends over all of them, an eager one over the context): ``capacity`` in each row.
    ``layers``: also time runners that call the decoder layers' own modules instead of
    :func:`~adaptive_spec.engine.decoder.decoder_layers` (the engine's default), in the same interleaving:
    ``layers_eager_ms`` and, on CUDA, ``layers_graph_ms`` (each None where the model has no lean layers).
    """
    from tqdm.auto import tqdm

    from adaptive_spec.engine.graphs import COMPILED, bucket_for

    cuda = engine.device.type == "cuda"
    modes = (["eager", "graph"] + (["compiled"] if compiled else [])) if cuda else ["eager"]
    if layers:
        modes += ["layers_eager", "layers_graph"] if cuda else ["layers_eager"]
    out = []
    jobs = [("target", n) for n in rows] + [("draft", n) for n in draft_rows]
    runners = {
        (role, mode): _runner(
            engine,
            role,
            mode.endswith("graph"),
            context,
            mode == "compiled",
            capacity or 0,
            not mode.startswith("layers"),
        )
        for role in ("target", "draft")
        for mode in modes
    }
    timers = {key: _timer(engine, runner, context) for key, runner in runners.items()}
    slots = {role: getattr(runners[(role, "eager")], "slot", None) for role in ("target", "draft")}
    capacities = {role: slot.kv.capacity if slot is not None else None for role, slot in slots.items()}
    compiled_before: dict[str, set[int]] = {"target": set(), "draft": set()}
    for role, n in tqdm(jobs, desc="passes", disable=not progress):
        samples: dict[str, list[float]] = {m: [] for m in modes}
        for i in range(repeats + 3):
            for m in modes:  # interleaved, repetition by repetition
                s = timers[(role, m)](n)
                if i >= 3:  # warm-up (the graph's capture) excluded
                    samples[m].append(s)
        eager = 1e3 * statistics.median(samples["eager"])
        graph = 1e3 * statistics.median(samples["graph"]) if "graph" in samples else None
        slot = getattr(runners.get((role, "graph")), "slot", None)
        bucket, replay, _ = (slot.replayed(n) if slot is not None else None) or (None, None, None)
        out.append(
            {
                "model": role,
                "rows": n,
                "context": context,
                "capacity": capacities[role],
                "eager_ms": eager,
                "graph_ms": graph,
                "speedup": eager / graph if graph else None,
                "bucket": bucket,
                "replay_ms": replay,
                # the attention form that bucket's graph kept and each form's replay ms (engine.decoder.attend)
                "attention": slot.forms.get(bucket) if slot is not None else None,
                "attention_replay_ms": dict(slot.form_times.get(bucket, {})) if slot is not None else None,
            }
        )
        if compiled:
            c_slot = getattr(runners.get((role, "compiled")), "slot", None)
            c_bucket, c_replay, c_graph = (c_slot.replayed(n) if c_slot is not None else None) or (None, None, None)
            b = bucket_for(n)  # the bucket compiled for n rows, the first time a size needs it
            new = c_slot is not None and b in COMPILED and b in c_slot.compile_s and b not in compiled_before[role]
            out[-1].update(
                compiled_ms=1e3 * statistics.median(samples["compiled"]) if "compiled" in samples else None,
                compiled_bucket=c_bucket,
                compiled_graph=c_graph,
                compiled_replay_ms=c_replay,
                compile_s=c_slot.compile_s[b] if new else None,
            )
            if new:
                compiled_before[role].add(b)
        if layers:
            lean = getattr(runners[(role, "eager")], "lean", None) is not None
            out[-1].update(
                {
                    f"layers_{m}_ms": 1e3 * statistics.median(samples[f"layers_{m}"]) if lean else None
                    for m in ("eager", "graph")
                    if f"layers_{m}" in samples
                }
            )
    return out


def measure_chains(
    engine: Any,
    depths: Sequence[int] = (1, 2, 3, 4, 6),
    context: int = 256,
    repeats: int = 20,
    temperature: float = 0.0,
    progress: bool = True,
) -> list[dict[str, Any]]:
    """Median milliseconds of a whole chain draft with the draft model, per depth: level by level (each level a
    forward, captured on CUDA, its draw and its row on the host's queue) against one replay of the chain's graph
    (:func:`~adaptive_spec.engine.drafting.captured_chain`; CUDA only), interleaved repetition by repetition,
    each call from one pending token after ``context`` committed rows to a device sync.

    One row per depth: ``{"depth", "levels_ms", "chain_ms", "per_level_ms" (the faster path's ms per drafted token),
    "speedup", "chain_replay_ms" (the chain graph's replay alone, timed on the device when captured; its host work is
    ``chain_ms`` minus it), "attention" (the form it kept)}``; the chain's entries None off CUDA. ``temperature``: 0
    (argmax draws) or a sampling temperature (inverse-CDF draws; the chain's uniforms drawn before its replay).
    """
    from tqdm.auto import tqdm

    from adaptive_spec.engine.drafting import draft_tree
    from adaptive_spec.engine.eagle import is_eagle_head
    from adaptive_spec.engine.logits import ProbsFn, SamplingConfig, build_logits_processor
    from adaptive_spec.trees import TreeShape

    sampling = SamplingConfig(temperature=temperature)
    token_ids = engine.draft.token_ids if is_eagle_head(engine.draft) else None  # an EAGLE head's vocabulary
    probs_fn = ProbsFn(build_logits_processor(sampling.generation_config()), engine.vocab_size, False, token_ids)
    runners = {m: _runner(engine, "draft", True, context, drafts=m == "chain") for m in ("levels", "chain")}
    if not getattr(runners["chain"].slot, "graphs_on", False):  # nothing captured (off CUDA): level by level only
        del runners["chain"]
    modes = list(runners)
    device, vocab = engine.device, min(engine.vocab_size, engine.input_vocab_size)
    ids = torch.randint(3, vocab, (context + 1,), generator=torch.Generator().manual_seed(0)).to(device)
    generator = torch.Generator(device=device).manual_seed(0)
    with torch.inference_mode():
        for r in runners.values():
            r.chain_forward(ids[:context], logits_to_keep=1)

    def timed(runner: Any, depth: int) -> float:
        shape = TreeShape.chain(depth)
        return _seconds(
            device,
            runner,
            context,
            lambda: draft_tree(runner, ids[context:], shape, probs_fn, generator, sampling.greedy),
        )

    out = []
    for depth in tqdm(depths, desc="chains", disable=not progress):
        samples: dict[str, list[float]] = {m: [] for m in modes}
        for i in range(repeats + 3):
            for m in modes:
                s = timed(runners[m], depth)
                if i >= 3:  # warm-up (the captures) excluded
                    samples[m].append(s)
        ms = {m: 1e3 * statistics.median(v) for m, v in samples.items()}
        slot = getattr(runners.get("chain"), "slot", None)
        kept = next((t for (b, d, _), t in (slot.draft_times.items() if slot else ()) if b == 1 and d == depth), None)
        chain = ms.get("chain")
        out.append(
            {
                "depth": depth,
                "context": context,
                "temperature": temperature,
                "levels_ms": ms["levels"],
                "chain_ms": chain,
                "per_level_ms": min(ms.values()) / depth,
                "speedup": ms["levels"] / chain if chain else None,
                "chain_replay_ms": kept[kept["kept"]] if kept else None,
                "attention": kept["kept"] if kept else None,
                "draft_failed": slot.draft_failed if slot is not None else None,
            }
        )
    return out
