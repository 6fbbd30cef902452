"""``adaptive-spec bench e2e``: end-to-end speed of plans against autoregressive and HF assisted decoding.

On the same prompts, interleaved per prompt (so that drift in machine speed hits every
method alike) and over every temperature of ``--temperatures`` in the same run: the
autoregressive target baseline, each plan, and transformers' own assisted generation
(``target.generate(assistant_model=draft)``). Reports, per temperature, tokens/s, speedup over
the autoregressive baseline, block efficiency (tokens per target decoding pass) and the ratio
to HF assisted generation.

Plans are plan strings (``chain:4/block``, ``lookup:8/block``, ``source:chain:2/block`` for the
per-step choice between lookup and the model, :mod:`adaptive_spec.planner.sources`) or names:

* ``adaptive``: the learned selector (:class:`~adaptive_spec.selector.runtime.AdaptivePlanner`)
  from ``--selector``, else the first of
  :func:`~adaptive_spec.selector.runtime.default_selector_paths` (the user data folder, the
  package's copy, ``data/selector/selector.onnx``); its rows add the chosen actions (top 10) and the median
  decision latency. The engine gets the latency model of ``--profile`` (default
  ``data/profile/profile.json`` if it exists) for the selector's latency features.
* ``in-draft``: the in-draft planner, a drafting policy that grows the tree from the draft's
  own confidence (:mod:`adaptive_spec.trees.policy`), tuned per temperature by
  ``adaptive-spec tune policies`` (``configs/plans/in-draft.yaml``).
* ``best-static``: the best single static action for the temperature, chosen on the selector's
  training prompts (the selector's metadata), else the plan of ``configs/plans/best-static.yaml``
  (``adaptive-spec tune plans``).

Prompts: JSON Lines (``.gz`` accepted; each record has a ``prompt`` string or a ``turns``
list, the first turn is used) or ``.txt`` (one prompt per line), read by
:func:`adaptive_spec.files.read_prompts` before the models load.
"""

from __future__ import annotations

import logging
import sys
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from adaptive_spec.temperatures import temperature_key

ADAPTIVE, BEST_STATIC, IN_DRAFT = "adaptive", "best-static", "in-draft"
TOP_ACTIONS = 10


class _Tally:
    def __init__(self) -> None:
        self.tokens = 0
        self.seconds = 0.0
        self.steps = 0
        self.accept_lengths: list[int] = []
        self.tree_sizes: list[int] = []
        self.phase_times_s: dict[str, float] = {}
        self.choices: Counter[str] = Counter()  # planners that count their choices (AdaptivePlanner)
        self.decision_s: list[float] = []
        self.draft_forwards = 0
        self.policy_levels = 0
        self.policy_decision_s = 0.0
        self.depth_reached: Counter[int] = Counter()  # steps whose accepted path reached depth d
        self.timeline: list[list[int]] | None = None  # the first generation: [tree nodes, accepted] per step

    def add(self, stats) -> None:
        self.tokens += stats.new_tokens
        self.seconds += stats.wall_time_s
        self.steps += stats.steps
        self.accept_lengths += list(stats.accept_lengths)
        self.tree_sizes += list(stats.tree_sizes)
        for k, v in stats.phase_times_s.items():
            self.phase_times_s[k] = self.phase_times_s.get(k, 0.0) + v
        self.draft_forwards += stats.draft_forwards
        self.policy_levels += stats.policy_levels
        self.policy_decision_s += stats.policy_decision_s
        for tau in stats.accept_lengths:
            for d in range(1, tau + 1):
                self.depth_reached[d] += 1
        if self.timeline is None:
            self.timeline = [[n, a] for n, a in zip(stats.tree_sizes, stats.accept_lengths, strict=True)]

    def summary(self, ar_tps: float | None, hf_tps: float | None, gen_tps: float | None = None) -> dict:
        tps = self.tokens / self.seconds if self.seconds > 0 else 0.0
        return {
            "tokens_per_s": tps,
            "speedup_vs_ar": tps / ar_tps if ar_tps else None,
            "ratio_to_hf_assisted": tps / hf_tps if hf_tps else None,
            "ratio_to_hf_generate": tps / gen_tps if gen_tps else None,
            "block_efficiency": self.tokens / self.steps if self.steps else None,
            "ms_per_step": 1e3 * self.seconds / self.steps if self.steps else None,
            "new_tokens": self.tokens,
            "seconds": self.seconds,
            "mean_tree_size": sum(self.tree_sizes) / len(self.tree_sizes) if self.tree_sizes else None,
            "accept_histogram": {str(k): self.accept_lengths.count(k) for k in sorted(set(self.accept_lengths))},
            "phase_times_s": self.phase_times_s,
            # Accepted length per depth: the share of steps whose accepted path reached depth d.
            "accepted_by_depth": {str(d): c / self.steps for d, c in sorted(self.depth_reached.items())}
            if self.steps
            else {},
            # The trees chosen during one generation (the first prompt): [tree nodes, accepted] per step.
            "timeline": self.timeline or [],
            **self._policy_cost(),
        }

    def _policy_cost(self) -> dict:
        """The drafting policy's decision cost per level, against one draft forward (dynamic plans)."""
        if not self.policy_levels:
            return {}
        per_level = self.policy_decision_s / self.policy_levels
        fwd = self.phase_times_s.get("draft", 0.0) / self.draft_forwards if self.draft_forwards else None
        return {
            "policy_decision_us_per_level": 1e6 * per_level,
            "draft_phase_ms_per_forward": 1e3 * fwd if fwd else None,
            "policy_decision_share_of_draft_forward": per_level / fwd if fwd else None,
        }

    def planner_summary(self, top: int = TOP_ACTIONS) -> dict:
        """The chosen actions (``top`` most frequent, with their share) and decision latency (µs)."""
        n = sum(self.choices.values())
        lat = [t * 1e6 for t in sorted(self.decision_s)]
        return {
            "chosen_actions": {
                "decisions": n,
                "distinct": len(self.choices),
                "top": [{"action": a, "count": c, "share": c / n} for a, c in self.choices.most_common(top)],
            },
            "decision_latency_us": {
                "n": len(lat),
                "median": _median(lat),
                "p90": lat[min(len(lat) - 1, int(0.9 * len(lat)))] if lat else None,
                "mean": sum(lat) / len(lat) if lat else None,
            },
        }


def _median(xs: list[float]) -> float | None:
    if not xs:
        return None
    m = len(xs) // 2
    return xs[m] if len(xs) % 2 else (xs[m - 1] + xs[m]) / 2


class _PlannerProbe:
    """What a counting planner (``choice_counts`` + ``decision_times_s``) did during one generation."""

    def __init__(self, planner: Any) -> None:
        self.planner = planner
        self.counts = planner.choice_counts.copy()
        self.times = len(planner.decision_times_s)

    def delta(self) -> _PlannerProbe:
        """What the planner did since the probe was made, frozen now."""
        p = self.planner
        out = _PlannerProbe.__new__(_PlannerProbe)
        out.planner = p
        out.counts = p.choice_counts - self.counts
        out.times = list(p.decision_times_s[self.times :])
        return out

    def add_to(self, tally: _Tally) -> None:
        """Add a :meth:`delta`'s choices and decision times to ``tally``."""
        for i in self.counts.nonzero()[0]:
            tally.choices[self.planner.actions[i]] += int(self.counts[i])
        tally.decision_s += self.times


# transformers (5.x) warns once per process that "Passing `generation_config` together with
# generation-related arguments ... is deprecated" during assisted generation. The call it warns
# about is transformers' own: its AssistedCandidateGenerator calls the assistant's ``generate``
# with its ``generation_config`` and ``min_new_tokens``/``max_new_tokens`` (and ``use_cache``)
# together; the baseline's call passes no ``generation_config``. Nothing to fix on our side,
# so the assisted baseline drops that one message.
_INNER_ASSISTANT_WARNING = "Passing `generation_config` together with generation-related"


class _DropInnerAssistantWarning(logging.Filter):
    """Drops transformers' deprecation warning about its own assistant ``generate`` call (see above)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(_INNER_ASSISTANT_WARNING)


def _hf_generate(
    engine, prompt: str | list[int], temperature: float, max_new_tokens: int, seed: int, **how: Any
) -> tuple[int, float]:
    """Transformers' own ``generate`` of the target with ``how``.

    ``how`` is ``assistant_model=`` (assisted generation) or ``prompt_lookup_num_tokens=`` (prompt lookup).
    Generation settings go as keyword arguments only (no ``generation_config``).
    """
    import torch

    if isinstance(prompt, str):
        ids = engine.tokenizer(prompt, return_tensors="pt").input_ids.to(engine.device)
    else:
        ids = torch.tensor([list(prompt)], device=engine.device)
    sampling = {"do_sample": False}
    if temperature > 0:
        sampling = {"do_sample": True, "temperature": temperature, "top_k": None, "top_p": None}
    torch.manual_seed(seed)
    hf_log, drop = logging.getLogger("transformers.generation.utils"), _DropInnerAssistantWarning()
    hf_log.addFilter(drop)
    t0 = time.perf_counter()
    try:
        with torch.inference_mode():
            out = engine.target.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=max_new_tokens,
                **how,
                pad_token_id=engine.tokenizer.pad_token_id or engine.tokenizer.eos_token_id,
                **sampling,
            )
    finally:
        hf_log.removeFilter(drop)
    if engine.device.type == "cuda":
        torch.cuda.synchronize(engine.device)
    return out.shape[1] - ids.shape[1], time.perf_counter() - t0


def _per_temperature(plans: Sequence[Any] | Mapping[str, Any], keys: list[str]) -> dict[str, dict[str, Any]]:
    if not isinstance(plans, Mapping):
        plans = {str(p): p for p in plans}
    out = {}
    for name, value in plans.items():
        if isinstance(value, Mapping):
            missing = [k for k in keys if k not in value]
            if missing:
                raise ValueError(f"plan {name!r} has no entry for temperature(s) {missing}")
            out[str(name)] = {k: value[k] for k in keys}
        else:
            out[str(name)] = dict.fromkeys(keys, value)
    return out


def _check_plans(engine: Any, table: dict[str, dict[str, Any]], temps: list[float], keys: list[str]) -> None:
    """Every static plan checked against the engine at its temperatures (``SpecEngine.check_plan``) before anything
    runs: one that the engine cannot play (a datastore it lacks, a greedy-only verifier at T > 0) fails at once.
    """
    for by_key in table.values():
        for t, k in zip(temps, keys, strict=True):
            engine.check_planner(by_key[k], t == 0)


def measure(
    engine,
    prompts: list[str],
    plans: Sequence[Any] | Mapping[str, Any],
    temperatures: float | Sequence[float],
    max_new_tokens: int,
    seed: int = 0,
    hf: bool = True,
    progress: bool = True,
    keep_outputs: bool = False,
    long_prompts: str = "skip",
    hf_draft: Any = None,
    lookup: bool = False,
    lookup_tokens: int = 10,
    hf_generate: bool = False,
) -> dict:
    """Run the baseline, every plan and (optionally) HF assisted generation, interleaved per prompt.

    Every temperature is measured in the same loop: for each prompt, for each temperature, every
    method in turn (prompt ``i`` uses seed ``seed + i`` for all of them).

    Args:
        engine: a :class:`~adaptive_spec.engine.SpecEngine`.
        prompts: the prompts.
        plans: plans, plan strings or planners (named by ``str``), or a mapping from a row name to
            one of those or to a ``{temperature key: plan or planner}`` mapping (a plan that
            depends on the temperature, e.g. the best static one). A planner with
            ``choice_counts`` and ``decision_times_s`` (:class:`AdaptivePlanner`) also gets its
            chosen actions and decision latency reported; it may be shared between temperatures.
        temperatures: one temperature or several.
        max_new_tokens: new tokens per generation.
        seed: base seed.
        hf: also run transformers' assisted generation (``assistant_model=``): with ``hf_draft`` (a
            transformers causal LM with the target's tokenizer), else with the engine's draft when it is
            a plain causal LM (not an EAGLE head).
        lookup: also run transformers' prompt lookup decoding (``prompt_lookup_num_tokens=lookup_tokens``).
        hf_generate: also run transformers' plain ``generate`` (the baseline the engine's own plain
            decoding is compared with: ``ratio_to_hf_generate`` in every row).
        progress: show a tqdm bar.
        long_prompts: ``"skip"`` (with a warning) or ``"error"``: a prompt that does not fit the
            context window with ``max_new_tokens`` more tokens; checked before the run.
        keep_outputs: also return every generation's token ids, ``outputs[temperature key][row
            name][prompt index]`` (``autoregressive`` for the baseline), for identity checks
            and text-quality figures.

    Returns:
        ``{"runs": {temperature key: {"results": [...], "baselines": {"autoregressive": ...,
        "hf_assisted": ...}}}}``; each row has tokens/s, speedup over autoregressive, ratio to HF
        assisted, block efficiency, new tokens, the accepted-length histogram and the phase times;
        rows of a temperature-dependent static plan add ``static_plan``, rows of a counting planner
        ``chosen_actions`` (top 10) and ``decision_latency_us``.
    """
    from tqdm.auto import tqdm

    from adaptive_spec.files import render_prompt

    temps = [float(temperatures)] if isinstance(temperatures, (int, float)) else [float(t) for t in temperatures]
    keys = [temperature_key(t) for t in temps]
    table = _per_temperature(plans, keys)
    _check_plans(engine, table, temps, keys)
    baselines = _hf_baselines(engine, hf, hf_draft, lookup, lookup_tokens, hf_generate)
    hf = HF in baselines
    run = _Run(keys, table, keep_outputs)
    prompts = [render_prompt(engine.tokenizer, p) for p in prompts]  # chat records through the chat template
    prompts, skipped = _fitting_prompts(engine, prompts, max_new_tokens, long_prompts)
    _warm_up(engine, prompts, temps, keys, table, max_new_tokens)
    compiled_before, kernels_before = _compile_seconds(engine), fused_kernels_compiled()
    drafts_before = _draft_capture_seconds(engine)
    with tqdm(total=len(prompts) * len(temps), desc=f"bench e2e T={','.join(keys)}", disable=not progress) as bar:
        for i, prompt in prompts:
            # Every method on this prompt first, then the tallies: a generation that fails drops this
            # prompt for all methods alike (the comparison stays paired) and the run goes on.
            try:
                done = []
                for t, k in zip(temps, keys, strict=True):
                    done += _one_prompt(engine, prompt, t, k, table, baselines, run.hf_error, max_new_tokens, seed + i)
                    bar.update()
            except (RuntimeError, ValueError, TypeError, IndexError) as err:
                run.errors.append({"prompt": i, "error": f"{type(err).__name__}: {err}"})
                print(f"warning: prompt {i + 1} failed and is left out for every method: {err}", file=sys.stderr)
                continue
            run.add(done)
    summary = run.summary(hf, lookup, HF_PLAIN in baselines)
    out: dict[str, Any] = {"runs": summary, "skipped_prompts": skipped, "failed_prompts": run.errors}
    if compiled_before is not None:  # compiling inside the timed runs counts in their tok/s: said, not hidden
        out["compiled_while_timed_s"] = round(_compile_seconds(engine) - compiled_before, 2)
    if drafts_before is not None:  # draft graphs captured inside the timed runs (a depth or bucket the warm-up missed)
        out["drafts_captured_while_timed_s"] = round(_draft_capture_seconds(engine) - drafts_before, 3)
    if kernels_before is not None:  # the fused kernels' compiles inside the timed runs (a second or so each on a GPU)
        out["kernels_compiled_while_timed"] = fused_kernels_compiled() - kernels_before
    if keep_outputs:
        out["outputs"] = run.outputs
    return out


# transformers' assisted generation, prompt lookup and plain generate, in a run's records
HF, LOOKUP, HF_PLAIN = "__hf__", "__lookup__", "__generate__"


def _hf_baselines(
    engine: Any, hf: bool, hf_draft: Any, lookup: bool, lookup_tokens: int, generate: bool = False
) -> dict[str, dict]:
    """Transformers' baselines to run, with their ``generate`` arguments: assisted generation with ``hf_draft``
    (else the engine's draft when it is a plain causal LM), prompt lookup decoding, plain ``generate``.
    """
    from adaptive_spec.engine.eagle import is_eagle_head

    assistant = hf_draft if hf_draft is not None else (None if is_eagle_head(engine.draft) else engine.draft)
    out: dict[str, dict] = {}
    if hf and assistant is not None:
        out[HF] = {"assistant_model": assistant}
    if lookup:
        out[LOOKUP] = {"prompt_lookup_num_tokens": lookup_tokens}
    if generate:
        out[HF_PLAIN] = {}
    return out


def _compile_seconds(engine: Any) -> float | None:
    """Seconds the engine's slots have spent compiling forwards so far, or None when it does not compile."""
    if not getattr(engine, "compiles", False):
        return None
    return sum(sum(times.values()) for times in engine.compile_times().values())


def _draft_capture_seconds(engine: Any) -> float | None:
    """Seconds the engine's draft slots have spent capturing whole-chain graphs so far; None off CUDA graphs."""
    if not (getattr(engine, "cuda_graphs", False) and engine.device.type == "cuda"):
        return None
    return engine.draft_graphs()["capture_s"]


def fused_kernels_compiled() -> int | None:
    """How many compiled variants of the fused (Triton) kernels this process holds, or None where none are compiled
    (no fused kernel loaded yet, or Triton's interpreter). Triton compiles a kernel for each new specialisation of a
    launch; the kernels are written so that a plan's launches share a few (``tests/engine/test_kernel_variants.py``).
    """
    count = None
    for module in ("adaptive_spec.verifiers._triton", "adaptive_spec.engine._triton_draft"):
        for fn in vars(sys.modules.get(module, object)).values():
            caches = getattr(fn, "device_caches", None)
            if isinstance(caches, dict):
                count = (count or 0) + sum(len(c[0]) for c in caches.values())
    return count


def _warm_up(
    engine: Any,
    prompts: list,
    temps: list[float],
    keys: list[str],
    table: dict[str, dict[str, Any]],
    max_new_tokens: int,
) -> None:
    """First calls pay for lazy initialisation: one short generation (4 tokens) per method and temperature.

    With compiled forwards, which compile each row bucket when first used, the warm-up is the longest prompt
    with the timed runs' ``max_new_tokens``: the static caches then hold every timed request from the start (a
    cache that grows drops its graphs and compiles them again) and most buckets compile before the timed runs
    (the seconds are in the report's ``config.compile_s``; those that still fell inside: ``compiled_while_timed_s``).
    """
    first, tokens = prompts[0][1], 4
    if getattr(engine, "compiles", False):
        tokens = max_new_tokens
        first = max(
            (p for _, p in prompts),
            key=lambda p: len(engine.tokenizer(p)["input_ids"]) if isinstance(p, str) else len(p),
        )
    for t, k in zip(temps, keys, strict=True):
        engine.generate(first, max_new_tokens=tokens, temperature=t, plan=None)
        for name in table:
            engine.generate(first, max_new_tokens=tokens, temperature=t, plan=table[name][k])


def _one_prompt(
    engine: Any,
    prompt: Any,
    t: float,
    k: str,
    table: dict[str, dict[str, Any]],
    baselines: dict[str, dict[str, Any]],
    hf_error: dict[tuple[str, str], str],
    max_new_tokens: int,
    seed: int,
) -> list[tuple]:
    """Every method on one prompt at one temperature: ``(temperature key, method, result, planner delta)`` records.

    The baseline first (method None), then each plan, then transformers' baselines (a failing one is
    reported once in ``hf_error`` and left out from then on).
    """
    done: list[tuple] = []
    for name, plan in [(None, None), *((n, table[n][k]) for n in table)]:
        probe = _PlannerProbe(plan) if hasattr(plan, "choice_counts") else None
        r = engine.generate(prompt, max_new_tokens=max_new_tokens, temperature=t, plan=plan, seed=seed)
        done.append((k, name, r, probe.delta() if probe is not None else None))
    for key, how in baselines.items():
        res = None
        if (key, k) not in hf_error:
            try:
                res = _hf_generate(engine, prompt, t, max_new_tokens, seed, **how)
            except (RuntimeError, ValueError, TypeError) as err:  # report, keep benchmarking the rest
                hf_error[(key, k)] = f"{type(err).__name__}: {err}"
        done.append((k, key, res, None))
    return done


class _Run:
    """The tallies of one :func:`measure` call: per temperature, the baseline, transformers' baselines, each plan."""

    def __init__(self, keys: list[str], table: dict[str, dict[str, Any]], keep_outputs: bool) -> None:
        self.keys, self.table, self.keep_outputs = keys, table, keep_outputs
        self.ar = {k: _Tally() for k in keys}
        self.hf = {k: {HF: _Tally(), LOOKUP: _Tally(), HF_PLAIN: _Tally()} for k in keys}
        self.plans = {k: {name: _Tally() for name in table} for k in keys}
        self.hf_error: dict[tuple[str, str], str] = {}
        self.errors: list[dict] = []
        self.outputs: dict[str, dict[str, list[list[int]]]] = {k: {} for k in keys}

    def add(self, done: list[tuple]) -> None:
        """Tally one prompt's records (see :func:`_one_prompt`)."""
        for k, name, r, delta in done:
            if name in (HF, LOOKUP, HF_PLAIN):
                if r is not None:
                    self.hf[k][name].tokens += r[0]
                    self.hf[k][name].seconds += r[1]
                continue
            tally = self.ar[k] if name is None else self.plans[k][name]
            tally.add(r.stats)
            if delta is not None:
                delta.add_to(tally)
            if self.keep_outputs:
                self.outputs[k].setdefault(name or "autoregressive", []).append(list(r.token_ids))

    def _tps(self, k: str, key: str) -> float | None:
        tally = self.hf[k][key]
        return tally.tokens / tally.seconds if tally.seconds and (key, k) not in self.hf_error else None

    def summary(self, hf: bool, lookup: bool, generate: bool = False) -> dict[str, Any]:
        """Per temperature key: ``{"results": [per plan], "baselines": {...}}``."""
        runs = {}
        for k in self.keys:
            ar = self.ar[k]
            ar_tps = ar.tokens / ar.seconds if ar.seconds else None
            tps = (ar_tps, self._tps(k, HF), self._tps(k, HF_PLAIN))
            results = [self._plan_row(k, name, tally, *tps) for name, tally in self.plans[k].items()]
            baselines = {"autoregressive": {"plan": "autoregressive", **ar.summary(*tps)}}
            labels = (
                (HF, hf, "hf_assisted"),
                (LOOKUP, lookup, "hf_prompt_lookup"),
                (HF_PLAIN, generate, "hf_generate"),
            )
            for key, on, label in labels:
                if on:
                    row = {
                        "plan": label,
                        **self.hf[k][key].summary(*tps),
                        "block_efficiency": None,
                        "ms_per_step": None,
                    }
                    if (key, k) in self.hf_error:
                        row["error"] = self.hf_error[(key, k)]
                    baselines[label] = row
            runs[k] = {"results": results, "baselines": baselines}
        return runs

    def _plan_row(
        self, k: str, name: str, tally: _Tally, ar_tps: float | None, hf_tps: float | None, gen_tps: float | None
    ) -> dict:
        row = {"plan": name, **tally.summary(ar_tps, hf_tps, gen_tps)}
        plan = self.table[name][k]
        if hasattr(plan, "choice_counts"):
            row.update(tally.planner_summary())
        elif not hasattr(plan, "choose") and str(plan) != name:
            row["static_plan"] = str(plan)
        return row


def _fitting_prompts(engine, prompts: list, max_new_tokens: int, long_prompts: str) -> tuple[list, list[dict]]:
    """(index, prompt) pairs whose prompt plus ``max_new_tokens`` fit the context window, and the skipped ones.

    Checked before anything runs. ``long_prompts="error"`` raises instead of skipping.
    """
    window = engine.max_positions
    keep, skipped = [], []
    for i, prompt in enumerate(prompts):
        if window is not None:
            n = len(engine.tokenizer(prompt)["input_ids"]) if isinstance(prompt, str) else len(prompt)
            if n + max_new_tokens > window:
                msg = (
                    f"prompt {i + 1} has {n} tokens: with {max_new_tokens} new tokens it exceeds the "
                    f"{window}-token context window"
                )
                if long_prompts == "error":
                    raise ValueError(msg)
                skipped.append({"prompt": i, "tokens": n, "reason": msg})
                print(f"warning: {msg}; skipped", file=sys.stderr)
                continue
        keep.append((i, prompt))
    if not keep:
        raise ValueError("no prompt fits the context window; shorten the prompts or lower --max-new-tokens")
    return keep, skipped


def resolve_plans(
    names: Sequence[str],
    temperatures: Sequence[float],
    *,
    selector: str | Path | None = None,
    best_static_file: str | Path | None = None,
    in_draft_file: str | Path | None = None,
    pair_file: str | Path | None = None,
    device: str | None = None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Turn plan names into what :func:`measure` takes, resolving ``adaptive`` and ``best-static``.

    A pair with its own per-step planner file (``pair_file``: a fetched model's
    ``adaptive_spec/zoo/<model>/adaptive.yaml``, from ``adaptive-spec tune sources``) plays it as
    ``adaptive`` (a source rule per temperature) and takes ``best-static`` from the best static
    plan measured with it (lookup plans included); other pairs use the selector.

    Args:
        names: plan strings, ``adaptive`` or ``best-static``.
        temperatures: the temperatures to measure (``best-static`` is chosen per temperature).
        selector: the selector file (default: :func:`~adaptive_spec.selector.runtime.find_selector`'s lookup).
        best_static_file: the ``best-static.yaml`` used when the selector records no best static
            action (default: :func:`~adaptive_spec.planner.presets.load_best_static`'s lookup).
        in_draft_file: the in-draft planner's plan file (default: ``configs/plans/in-draft.yaml``, the
            built-in pair's; a shipped pair has its own, :func:`~adaptive_spec.engine.models.in_draft_file`).
        device: the device type the plans run on: a pair file's plans tuned on that kind of device come first
            (:func:`~adaptive_spec.planner.presets.plan_sections`).

    Returns:
        ``(plans, info)``: the name -> plan/planner mapping, and ``info`` with the selector's path
        (None if none was used), its runtime (``"runtime"``) and where the best static plans came from.

    Raises:
        FileNotFoundError: ``adaptive`` without any selector, or ``best-static`` without a selector
            that records it and without a best-static file (the messages say how to make them).
        ValueError: a malformed plan string or selector (:class:`SelectorLoadError`), or
            ``best-static`` has no plan for a temperature.
    """
    from adaptive_spec.planner.plan import Plan
    from adaptive_spec.planner.sources import SOURCE_PREFIX, parse_source_rule
    from adaptive_spec.selector.runtime import AdaptivePlanner, SelectorRuntime, find_selector

    names = list(dict.fromkeys(n.strip() for n in names if n.strip()))
    keys = [temperature_key(t) for t in temperatures]
    info: dict[str, Any] = {"selector": None, "runtime": None, "best_static": None}
    runtime = None
    has_pair = pair_file is not None and Path(pair_file).is_file()
    pair = _pair_plans(pair_file, temperatures, keys, device) if has_pair else None
    if pair is not None:
        info["pair_file"] = str(pair_file)
    elif ADAPTIVE in names:
        runtime = SelectorRuntime(find_selector(selector))
    elif BEST_STATIC in names:
        try:  # a selector records the best static action of its training prompts
            runtime = SelectorRuntime(find_selector(selector))
        except FileNotFoundError:
            if selector is not None:
                raise
    if runtime is not None:
        info["selector"], info["runtime"] = str(runtime.path), runtime
    plans: dict[str, Any] = {}
    for name in names:
        if name in (ADAPTIVE, BEST_STATIC) and pair is not None:
            if len(pair[name]) < len(keys):
                raise ValueError(f"{pair_file} records no best static plan; rerun `adaptive-spec tune sources`")
            plans[name] = pair[name]
            chosen = {k: str(p) for k, p in pair[name].items()}
            info["adaptive" if name == ADAPTIVE else "best_static"] = {
                "source": str(pair_file),
                "plans": chosen,
                "tuned_on": pair["tuned_on"],  # per temperature: the device kind whose section it came from
            }
        elif name == ADAPTIVE:
            plans[name] = AdaptivePlanner(runtime)
        elif name == BEST_STATIC:
            plans[name], info["best_static"] = _best_static(runtime, temperatures, keys, best_static_file, device)
        elif name == IN_DRAFT:
            from adaptive_spec.planner.presets import in_draft_path, load_in_draft

            source = in_draft_file if in_draft_file is not None else in_draft_path()
            plans[name] = {k: load_in_draft(t, source, device) for t, k in zip(temperatures, keys, strict=True)}
            info["in_draft"] = {"source": str(source), "plans": {k: str(p) for k, p in plans[name].items()}}
        elif name.startswith(SOURCE_PREFIX):  # the per-step source rule over a model plan (a planner)
            plans[name] = parse_source_rule(name)
        else:
            plans[str(Plan.parse(name))] = Plan.parse(name)
    return plans, info


def _pair_plans(path, temperatures, keys, device: str | None = None) -> dict[str, dict[str, Any]]:
    """``{adaptive: {key: source rule}, best-static: {key: plan}, tuned_on: {key: device kind}}`` from a pair's
    ``adaptive.yaml``.

    Each temperature takes the entry of the nearest tuned temperature of the same kind (greedy or sampling), among
    the plans tuned on ``device``'s kind first (:func:`~adaptive_spec.planner.presets.plan_sections`).
    """
    import yaml

    from adaptive_spec.engine.auto_plan import parse_plan_or_rule
    from adaptive_spec.planner.presets import nearest_section_entry, plan_sections

    data = yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}
    entries = data.get("plans") if isinstance(data, dict) else None
    if not isinstance(entries, dict) or not entries:
        raise ValueError(f"{path}: not a plan file (no 'plans' mapping); rerun `adaptive-spec tune sources`")
    sections = plan_sections(data, device)
    out: dict[str, dict[str, Any]] = {ADAPTIVE: {}, BEST_STATIC: {}, "tuned_on": {}}
    for t, key in zip(temperatures, keys, strict=True):
        found = nearest_section_entry(sections, t)
        if found is None:
            raise ValueError(f"{path} has no plan for temperature {t:g} (tuned: {', '.join(map(str, entries))})")
        entry = sections[found[0]][found[1]]
        out["tuned_on"][key] = "cpu" if found[0] == len(sections) - 1 else device  # the section it came from
        out[ADAPTIVE][key] = parse_plan_or_rule(entry["plan"], base_dir=Path(path).parent)
        if "best_static" in entry:
            out[BEST_STATIC][key] = parse_plan_or_rule(entry["best_static"]["plan"])
    return out


def _best_static(runtime, temperatures, keys, path, device=None) -> tuple[dict[str, Any], dict[str, Any]]:
    from adaptive_spec.planner.presets import load_best_static

    if runtime is not None and runtime.best_static_groups:
        try:
            chosen = {k: runtime.best_static(t) for t, k in zip(temperatures, keys, strict=True)}
        except LookupError as err:
            raise ValueError(str(err)) from None
        source = f"selector metadata ({runtime.path}): best mean tokens/s on its training prompts"
    else:
        try:
            chosen = {k: load_best_static(t, path, device) for t, k in zip(temperatures, keys, strict=True)}
        except FileNotFoundError as err:
            why = "the selector records no best static action" if runtime is not None else "no selector was found"
            raise FileNotFoundError(
                f"'{BEST_STATIC}' needs the best static plan per temperature: {why}, and {err}. Build a selector "
                "with `make selector` (`adaptive-spec selector pipeline --install`) or pass --selector PATH"
            ) from None
        except LookupError as err:
            raise ValueError(str(err)) from None
        source = str(path) if path is not None else "configs/plans/best-static.yaml (adaptive-spec tune plans)"
    return chosen, {"source": source, "plans": {k: str(p) for k, p in chosen.items()}}


def print_table(rows: list[dict]) -> None:
    """Print one line per method: tokens/s, speedup vs AR and vs HF assisted, block efficiency, ms per step."""

    def fmt(x: float | None, spec: str) -> str:  # "-" for a missing value, right-aligned in the column's width
        return format(x, spec) if x is not None else format("-", f">{spec.split('.')[0]}")

    names = [f"{r['plan']} ({r['static_plan']})" if r.get("static_plan") else r["plan"] for r in rows]
    w = max([32, *map(len, names)])
    gen = any(r.get("ratio_to_hf_generate") is not None for r in rows)
    head = f"{'plan':<{w}} {'tok/s':>9} {'vs AR':>7} {'vs HF':>7}" + (f" {'vs gen':>7}" if gen else "")
    head += f" {'BE':>6} {'ms/step':>8} {'tokens':>8}"
    print(head)
    print("-" * len(head))
    for name, r in zip(names, rows, strict=True):
        vs_gen = f" {fmt(r.get('ratio_to_hf_generate'), '7.2f')}" if gen else ""
        print(
            f"{name:<{w}} {fmt(r['tokens_per_s'], '9.1f')} {fmt(r['speedup_vs_ar'], '7.2f')} "
            f"{fmt(r['ratio_to_hf_assisted'], '7.2f')}{vs_gen} {fmt(r['block_efficiency'], '6.2f')} "
            f"{fmt(r.get('ms_per_step'), '8.2f')} {r['new_tokens']:>8}"
        )
    for r in rows:
        if "chosen_actions" in r:
            print(f"  {planner_line(r)}")


def planner_line(row: dict) -> str:
    """One line on a selector's row: decisions, median decision latency and the most chosen actions."""
    ch, lat = row["chosen_actions"], row["decision_latency_us"]
    median = "-" if lat["median"] is None else f"{lat['median']:.0f}"
    top = ", ".join(f"{a['action']} {100 * a['share']:.0f}%" for a in ch["top"][:5])
    return f"{row['plan']}: {ch['decisions']} decisions, median {median} us each; {ch['distinct']} actions used: {top}"
