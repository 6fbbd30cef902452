"""``adaptive-spec profile``: measure a draft/target pair's latency profile on this device.

Three measurements, all through the engine's own code paths, saved as one JSON profile that
:class:`adaptive_spec.planner.latency.LatencyModel` reads:

1. **Forwards.** For each context length ``c`` and block size ``t`` of the grid: one
   ``ModelRunner.block_forward`` of ``t`` tokens under a tree (here causal) mask over a KV
   cache prefilled to ``c`` rows, rolled back after each call. Draft and target calls
   alternate (warm-up calls first, then ``repeats`` timed pairs), so that changes in machine
   load hit both alike; the profile keeps medians and quartiles in milliseconds.
2. **Verifiers.** Each registered lossless verifier (``greedy`` included, for temperature 0),
   on every drafting law it accepts, on synthetic trees of several sizes at the models'
   vocabulary size (target logits ~ N(0, 3^2), draft logits = target + N(0, 1)): median
   milliseconds per ``verify`` call against the tree's node count.
3. **Bookkeeping.** The engine generates from a few prompts with a few calibration plans;
   for every step, the measured time (the sum of ``StepResult.times``) minus the predicted
   forwards and verifier is fitted by non-negative least squares as ``const_ms +
   per_level_ms * depth + per_node_ms * nodes + first_step_ms * [first step]``: the
   per-level term is the draft's sampling and host sync after each forward, the per-node
   term turning logits into probabilities and the tree masks, the first-step term the slower
   first target block after a prefill.

``adaptive-spec bench latency-model`` then checks the predictions against other plans' steps.
"""

from __future__ import annotations

import datetime as dt
import platform
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from adaptive_spec.files import write_json_atomic
from adaptive_spec.planner import Planner, as_plan

DEFAULT_CONTEXTS = (32, 128, 256, 512)
DEFAULT_TOKENS = (1, 2, 4, 8, 16, 32, 48, 64)
# Trees of about 2..48 nodes per drafting law, for the verifier curves.
VERIFY_SHAPES = {
    "chain": ("chain:1", "chain:3", "chain:7", "chain:15", "chain:31", "chain:47"),
    "iid": ("iid:2x1", "iid:2x2", "iid:2x4", "iid:4x4", "iid:4x8", "iid:4x12"),
    "delayed": ("delayed:1x2x1", "delayed:1x2x3", "delayed:2x2x7", "delayed:1x3x10", "delayed:3x4x11"),
    "without_replacement": ("wor:2", "wor:2x2", "wor:2x2x2", "wor:2x2x2x2", "wor:3x2x2x2"),
}
# Calibration plans for the bookkeeping fit: depths 1..8, 2..33 nodes, every law.
CALIBRATION_PLANS = (
    "chain:1/token,chain:4/block,chain:8/traversal,iid:4x8/gbv,delayed:1x3x4/specinfer,wor:3x2x1/rrsw,iid:2x3/nss"
)


# ---------------------------------------------------------------------- helpers
def _sync_fn(device: Any) -> Callable[[], None]:
    import torch

    if torch.device(device).type == "cuda":
        return lambda: torch.cuda.synchronize(device)
    return lambda: None


def _quartiles(xs: Sequence[float]) -> tuple[float, float, float]:
    if len(xs) == 1:
        return xs[0], xs[0], xs[0]
    q = statistics.quantiles(xs, n=4, method="inclusive")
    return q[0], statistics.median(xs), q[2]


def device_info(device: Any) -> dict[str, Any]:
    """Device type and name (GPU model or CPU), torch threads, versions."""
    import torch
    import transformers

    device = torch.device(device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else _cpu_name()
    return {
        "type": device.type,
        "name": name,
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
    }


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def model_info(model: Any, label: str | None = None) -> dict[str, Any]:
    """What identifies a model in a profile: name or path, class, sizes, dtype."""
    cfg = model.config.get_text_config()
    return {
        "name": label or getattr(model, "name_or_path", "") or type(model).__name__,
        "class": type(model).__name__,
        "parameters": int(sum(p.numel() for p in model.parameters())),
        "layers": getattr(cfg, "num_hidden_layers", None),
        "hidden_size": getattr(cfg, "hidden_size", None),
        "vocab_size": getattr(cfg, "vocab_size", None),
        "dtype": str(model.dtype).removeprefix("torch."),
    }


# ---------------------------------------------------------------------- 1) forwards
def measure_forwards(
    target: Any,
    draft: Any,
    contexts: Sequence[int] = DEFAULT_CONTEXTS,
    tokens: Sequence[int] = DEFAULT_TOKENS,
    warmup: int = 3,
    repeats: int = 10,
    seed: int = 0,
    progress: bool = True,
) -> dict[str, Any]:
    """Median block-forward milliseconds of both models over the (context, tokens) grid.

    Returns:
        ``{"contexts", "tokens", "draft_ms", "target_ms", "draft_q1_ms", "draft_q3_ms",
        "target_q1_ms", "target_q3_ms"}``: medians and quartiles, grids indexed ``[context][tokens]``.

    Raises:
        ValueError: a grid point does not fit a model's context window, or bad sizes.
    """
    import torch
    from tqdm.auto import tqdm

    from adaptive_spec.engine.runner import ModelRunner

    contexts, tokens = sorted(set(contexts)), sorted(set(tokens))
    if not contexts or contexts[0] < 0 or not tokens or tokens[0] < 1:
        raise ValueError(f"contexts must be >= 0 and tokens >= 1, got {contexts} and {tokens}")
    if warmup < 0 or repeats < 1:
        raise ValueError(f"warmup must be >= 0 and repeats >= 1, got {warmup} and {repeats}")
    runners = {"draft": ModelRunner(draft), "target": ModelRunner(target)}
    for name, r in runners.items():
        window = getattr(r.model.config.get_text_config(), "max_position_embeddings", None)
        if window and contexts[-1] + tokens[-1] > window:
            raise ValueError(
                f"the {name} model's context window is {window} tokens, but the grid needs "
                f"{contexts[-1]} + {tokens[-1]}; lower --contexts or --tokens"
            )
    device = runners["target"].device
    sync = _sync_fn(device)
    vocab = min(r.model.get_input_embeddings().weight.shape[0] for r in runners.values())
    gen = torch.Generator().manual_seed(seed)
    prefill = torch.randint(0, vocab, (contexts[-1],), generator=gen).to(device)
    block = torch.randint(0, vocab, (tokens[-1],), generator=gen).to(device)
    samples = {name: [[[] for _ in tokens] for _ in contexts] for name in runners}

    def timed(r: ModelRunner, ctx: int, n: int) -> float:
        anc = torch.ones(n, n, dtype=torch.bool, device=device).tril_()  # [n, n] a chain: one path of n nodes
        pos = torch.arange(ctx, ctx + n, device=device)
        sync()
        t0 = time.perf_counter()
        r.block_forward(block[:n], pos, anc, logits_to_keep=n)
        sync()
        out = time.perf_counter() - t0
        r.rollback(ctx)
        return out

    bar = tqdm(total=len(contexts) * len(tokens), desc="profile forwards", disable=not progress)
    with torch.inference_mode():
        for r in runners.values():
            r.rollback(0)
        for ci, ctx in enumerate(contexts):
            for r in runners.values():  # extend both caches to ctx rows
                r.chain_forward(prefill[r.cached : ctx], logits_to_keep=1)
            for ti, n in enumerate(tokens):
                for i in range(warmup + repeats):
                    for name, r in runners.items():  # interleaved: load drift hits both models alike
                        t = timed(r, ctx, n)
                        if i >= warmup:
                            samples[name][ci][ti].append(t * 1e3)
                bar.update()
    bar.close()
    out: dict[str, Any] = {"contexts": contexts, "tokens": tokens}
    for name in runners:
        q = [[_quartiles(s) for s in row] for row in samples[name]]
        out[f"{name}_ms"] = [[m for _, m, _ in row] for row in q]
        out[f"{name}_q1_ms"] = [[lo for lo, _, _ in row] for row in q]
        out[f"{name}_q3_ms"] = [[hi for _, _, hi in row] for row in q]
    return out


# ---------------------------------------------------------------------- 2) verifiers
def measure_verifiers(
    vocab: int,
    device: Any = "cpu",
    verifiers: Sequence[str] | None = None,
    repeats: int = 10,
    warmup: int = 2,
    trees_per_size: int = 3,
    seed: int = 0,
    progress: bool = True,
) -> dict[str, dict[str, dict[str, list]]]:
    """Median milliseconds per ``verify`` call, per verifier and drafting law, against tree size.

    Args:
        vocab: vocabulary size of the rows (the engine's ``vocab_size``).
        device: where the rows live.
        verifiers: names to measure (default: every lossless verifier, ``greedy`` included).
        repeats: timed calls per tree.
        warmup: untimed calls per tree.
        trees_per_size: distinct sampled trees per shape (their times are pooled).
        seed: seeds the synthetic rows and trees.
        progress: show a progress bar.

    Returns:
        ``{verifier: {law: {"nodes": [...], "ms": [...], "shapes": [...]}}}``, nodes being each
        shape's largest node count (what the latency model predicts with).
    """
    import torch
    from tqdm.auto import tqdm

    from adaptive_spec.trees import TreeShape, sample_tree
    from adaptive_spec.verifiers import REGISTRY, verify

    names = list(verifiers) if verifiers else [n for n, s in REGISTRY.items() if s.lossless]
    unknown = [n for n in names if n not in REGISTRY]
    if unknown:
        raise ValueError(f"unknown verifiers {unknown}; known: {', '.join(REGISTRY)}")
    device = torch.device(device)
    sync = _sync_fn(device)
    gen = torch.Generator().manual_seed(seed)
    cache: dict[tuple[int, ...], tuple[torch.Tensor, torch.Tensor]] = {}

    def rows(prefix: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
        if prefix not in cache:
            t = torch.randn(vocab, generator=gen) * 3  # [V]
            d = t + torch.randn(vocab, generator=gen)
            cache[prefix] = (torch.softmax(t, 0).to(device), torch.softmax(d, 0).to(device))
        return cache[prefix]

    # Trees per law and shape, shared by all verifiers (and their target rows, soft and one-hot).
    trees: dict[str, list[tuple[str, int, list]]] = {}
    for law, shapes in VERIFY_SHAPES.items():
        trees[law] = []
        for text in shapes:
            shape = TreeShape.parse(text)
            batch = []
            for k in range(trees_per_size):
                tree_gen = torch.Generator(device=device).manual_seed(seed + 1000 * k + 1)
                tree = sample_tree(shape, lambda c: rows(c)[1], tree_gen)
                soft = torch.stack([rows(p)[0] for p in tree.prefixes])  # [N, V]
                hard = torch.nn.functional.one_hot(soft.argmax(-1), vocab).to(soft.dtype)
                batch.append((tree, soft, hard))
            trees[law].append((text, shape.max_nodes, batch))

    jobs = [(n, law) for n in names for law in VERIFY_SHAPES if any(x.value == law for x in REGISTRY[n].laws)]
    out: dict[str, dict[str, dict[str, list]]] = {}
    vgen = torch.Generator(device=device).manual_seed(seed)
    for name, law in tqdm(jobs, desc="profile verifiers", disable=not progress):
        greedy = REGISTRY[name].greedy_only
        curve: dict[str, list] = {"nodes": [], "ms": [], "shapes": []}
        for text, nodes, batch in trees[law]:
            if curve["nodes"] and nodes <= curve["nodes"][-1]:
                continue
            times = []
            for tree, soft, hard in batch:
                probs = hard if greedy else soft
                for i in range(warmup + repeats):
                    sync()
                    t0 = time.perf_counter()
                    verify(name, tree, probs, vgen, allow_lossy=True, check_inputs=False)
                    sync()
                    if i >= warmup:
                        times.append((time.perf_counter() - t0) * 1e3)
            curve["nodes"].append(nodes)
            curve["ms"].append(statistics.median(times))
            curve["shapes"].append(text)
        out.setdefault(name, {})[law] = curve
    return out


# ---------------------------------------------------------------------- 3) engine steps
class RecordingPlanner(Planner):
    """A static plan that records each step's committed context length (for predictions)."""

    def __init__(self, plan: Any) -> None:
        self.plan = as_plan(plan)
        self.contexts: list[int] = []

    def choose(self, state: Any) -> Any:
        self.contexts.append(state.context_length)
        return self.plan


def measure_steps(
    engine: Any,
    prompts: Sequence[Any],
    plans: Sequence[Any],
    max_new_tokens: int = 48,
    temperature: float = 1.0,
    seed: int = 0,
    progress: bool = True,
    desc: str = "engine steps",
) -> list[dict[str, Any]]:
    """Run the engine with each static plan on each prompt (interleaved per prompt); one row per step.

    Each row: ``plan`` (the plan the step ran, after any truncation to the budget),
    ``requested`` (the static plan), ``prompt`` index, ``step``, ``context_length``,
    ``measured_s`` (the sum of the step's phase times), ``times`` (per phase),
    ``num_nodes`` (real tree size) and ``num_accepted``. A short warm-up generation per plan
    comes first and is not recorded.
    """
    from tqdm.auto import tqdm

    if not prompts or not plans:
        raise ValueError("measure_steps needs at least one prompt and one plan")
    for plan in plans:  # warm-up: first calls pay for lazy initialisation
        engine.generate(prompts[0], max_new_tokens=4, temperature=temperature, plan=plan, seed=seed)
    rows: list[dict[str, Any]] = []
    for i, prompt in enumerate(tqdm(prompts, desc=desc, disable=not progress)):
        for plan in plans:
            rec = RecordingPlanner(plan)
            res = engine.generate(
                prompt, max_new_tokens=max_new_tokens, temperature=temperature, plan=rec, seed=seed + i
            )
            for k, (step, ctx) in enumerate(zip(res.steps, rec.contexts, strict=True)):
                rows.append(
                    {
                        "plan": str(step.plan),
                        "requested": str(rec.plan),
                        "prompt": i,
                        "step": k,
                        "context_length": ctx,
                        "measured_s": float(sum(step.times.values())),
                        "times": dict(step.times),
                        "num_nodes": step.num_nodes,
                        "num_accepted": step.num_accepted,
                    }
                )
    return rows


def _robust_nnls(A: Any, b: Any) -> tuple[Any, Any]:
    """NNLS, then once more without the points whose residual is > 4 MADs from the median; (coef, kept)."""
    import numpy as np
    from scipy.optimize import nnls

    coef, _ = nnls(A, b)
    resid = b - A @ coef
    dev = np.abs(resid - np.median(resid))
    mad = float(np.median(dev)) or 1e-9
    keep = dev <= 4 * 1.4826 * mad
    if keep.sum() >= A.shape[1] and not keep.all():
        coef, _ = nnls(A[keep], b[keep])
    else:
        keep = np.ones(len(b), dtype=bool)
    return coef, keep


def fit_overhead(profile: dict[str, Any], steps: Sequence[dict[str, Any]], temperature: float) -> dict[str, Any]:
    """Fit the steps' time beyond the predicted forwards and verifier (see the module docstring).

    Model: ``const_ms + per_level_ms * depth + per_node_ms * nodes + first_step_ms * [step == 0]``,
    fitted phase by phase with non-negative least squares, so that the noisy target phase does
    not blur the draft's per-level cost: the draft phase's excess over the predicted draft
    forwards on ``(1, depth)``; the target phase's excess over the predicted target forward on
    ``(1, nodes, first step)`` (the first step of a generation runs the first target block after
    the prefill, which is slower); ``verify + other`` beyond the predicted verifier on
    ``(1, nodes)``. Each fit drops, once, the steps more than 4 median absolute deviations from
    the median residual (load spikes on a shared machine). The coefficients add up.
    """
    import numpy as np

    from adaptive_spec.planner.actions import plan_structure
    from adaptive_spec.planner.latency import LatencyModel

    if not steps:
        raise ValueError("fit_overhead needs at least one measured step")
    base = LatencyModel({**profile, "overhead": {}})
    feats, excess = [], {"draft": [], "target": [], "rest": []}
    for row in steps:
        s = plan_structure(row["plan"])
        pred = base.predict(row["plan"], row["context_length"], temperature=temperature)
        t = row["times"]
        feats.append((s.depth, s.num_nodes, float(row["step"] == 0)))
        excess["draft"].append(1e3 * (t.get("draft", 0.0) - pred.draft_s))
        excess["target"].append(1e3 * (t.get("target", 0.0) - pred.target_s))
        excess["rest"].append(1e3 * (t.get("verify", 0.0) + t.get("other", 0.0) - pred.verify_s))
    F = np.asarray(feats)  # [steps, 3]: depth, nodes, first step
    one = np.ones(len(F))
    designs = {
        "draft": np.stack([one, F[:, 0]], 1),  # const, per level
        "target": np.stack([one, F[:, 1], F[:, 2]], 1),  # const, per node, first step
        "rest": np.stack([one, F[:, 1]], 1),  # const, per node
    }
    fits, total_resid, kept = {}, 0.0, np.ones(len(F), dtype=bool)
    for phase, A in designs.items():
        b = np.asarray(excess[phase])
        coef, keep = _robust_nnls(A, b)
        fits[phase] = coef
        total_resid = total_resid + (b - A @ coef)
        kept &= keep
    per_phase = {
        "draft": {"const_ms": float(fits["draft"][0]), "per_level_ms": float(fits["draft"][1])},
        "target": {
            "const_ms": float(fits["target"][0]),
            "per_node_ms": float(fits["target"][1]),
            "first_step_ms": float(fits["target"][2]),
        },
        "verify_other": {"const_ms": float(fits["rest"][0]), "per_node_ms": float(fits["rest"][1])},
    }
    return {
        "model": "const_ms + per_level_ms * depth + per_node_ms * nodes + first_step_ms * [step == 0] (NNLS per phase)",
        "const_ms": float(fits["draft"][0] + fits["target"][0] + fits["rest"][0]),
        "per_level_ms": float(fits["draft"][1]),
        "per_node_ms": float(fits["target"][1] + fits["rest"][1]),
        "first_step_ms": float(fits["target"][2]),
        "per_phase": per_phase,
        "residual_rms_ms": float(np.sqrt(np.mean(total_resid[kept] ** 2))),
        "steps": len(steps),
        "outliers": int((~kept).sum()),
        "plans": sorted({r["requested"] for r in steps}),
        "temperature": temperature,
    }


# ---------------------------------------------------------------------- the whole profile
def measure_profile(
    engine: Any,
    contexts: Sequence[int] = DEFAULT_CONTEXTS,
    tokens: Sequence[int] = DEFAULT_TOKENS,
    warmup: int = 3,
    repeats: int = 10,
    calibration_plans: Sequence[Any] | None = None,
    calibration_prompts: Sequence[Any] | None = None,
    calibration_tokens: int = 48,
    temperature: float = 1.0,
    seed: int = 0,
    progress: bool = True,
    models: dict[str, Any] | None = None,
    verify_trees: int = 3,
) -> dict[str, Any]:
    """Measure a full latency profile (forwards, verifiers, bookkeeping) for ``engine``'s pair.

    Args:
        engine: a :class:`~adaptive_spec.engine.SpecEngine`.
        contexts: KV-cache lengths of the forward grid.
        tokens: block sizes (tokens per forward) of the forward grid.
        warmup: untimed calls per grid point.
        repeats: timed calls per grid point (per model).
        calibration_plans: plans whose engine steps fit the bookkeeping term (default
            :data:`CALIBRATION_PLANS`); empty to skip the fit (the term is then 0).
        calibration_prompts: prompts for the calibration run (text or token ids).
        calibration_tokens: new tokens per calibration generation.
        temperature: sampling temperature of the calibration run.
        seed: seeds the synthetic inputs and the calibration run.
        progress: show progress bars.
        models: labels for the profile's ``models`` section (default: from the models).
        verify_trees: sampled trees per shape for the verifier curves.

    Returns:
        The profile dict (see :mod:`adaptive_spec.planner.latency`).
    """
    from adaptive_spec.planner.actions import parse_plans
    from adaptive_spec.planner.latency import PROFILE_FORMAT, PROFILE_VERSION

    t0 = time.perf_counter()
    fwd = measure_forwards(engine.target, engine.draft, contexts, tokens, warmup, repeats, seed, progress)
    verify_ms = measure_verifiers(
        engine.vocab_size, engine.device, repeats=repeats, trees_per_size=verify_trees, seed=seed, progress=progress
    )
    models = models or {}
    profile: dict[str, Any] = {
        "format": PROFILE_FORMAT,
        "version": PROFILE_VERSION,
        "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "device": device_info(engine.device),
        "dtype": str(engine.target.dtype).removeprefix("torch."),
        "models": {
            "target": model_info(engine.target, models.get("target")),
            "draft": model_info(engine.draft, models.get("draft")),
        },
        "vocab_size": engine.vocab_size,
        "settings": {"warmup": warmup, "repeats": repeats, "verify_trees": verify_trees, "seed": seed},
        **fwd,
        "verify_ms": verify_ms,
        "overhead": {},
    }
    plans = parse_plans(CALIBRATION_PLANS) if calibration_plans is None else list(calibration_plans)
    if plans:
        prompts = list(calibration_prompts) if calibration_prompts else _calibration_prompts(engine, seed)
        steps = measure_steps(
            engine, prompts, plans, calibration_tokens, temperature, seed, progress, desc="profile bookkeeping"
        )
        profile["overhead"] = fit_overhead(profile, steps, temperature)
    profile["settings"]["seconds"] = round(time.perf_counter() - t0, 2)
    return profile


def cached_profile_path(engine: Any) -> Path:
    """Where :func:`latency_for_selector` keeps a profile measured on first use.

    ``<user data>/profiles/<target>-<draft>-<device>-<dtype>.json``: one per pair (by weight
    fingerprint), device type and dtype, since a profile is only valid for those.
    """
    from adaptive_spec.engine.fingerprint import pair_fingerprints
    from adaptive_spec.files import user_data_dir

    fp = pair_fingerprints(engine.target, engine.draft)
    dtype = str(engine.target.dtype).removeprefix("torch.")
    name = f"{fp['target'][:12]}-{fp['draft'][:12]}-{engine.device.type}-{dtype}.json"
    return user_data_dir() / "profiles" / name


def latency_for_selector(
    engine: Any, runtime: Any, profile: str | Path | None = None, progress: bool = True
) -> tuple[Any, str | None]:
    """The latency model for a selector's latency features, measured on first use if none exists.

    First :func:`adaptive_spec.selector.runtime.latency_model_for` (``profile``, the selector's
    own profile beside its file, the default ``data/profile/profile.json``). If none is found and
    the selector was trained with latency features, a profile of ``engine``'s pair on this
    device is measured once (about half a minute on a CPU, with progress bars) and cached at
    :func:`cached_profile_path`, where later runs find it.

    Args:
        engine: the :class:`~adaptive_spec.engine.SpecEngine` that will run the selector.
        runtime: the :class:`~adaptive_spec.selector.runtime.SelectorRuntime` (None: no selector).
        profile: an explicit latency profile JSON.
        progress: show progress bars while measuring.

    Returns:
        ``(model or None, note or None)``: the note says where a profile was measured or read
        from the cache (or why the latency features stay 0), for the caller to show.
    """
    from adaptive_spec.planner.latency import LatencyModel
    from adaptive_spec.selector.runtime import latency_model_for

    model, warning = latency_model_for(runtime, profile)
    if model is not None or warning is None:
        return model, None
    path = cached_profile_path(engine)
    if path.is_file():
        return LatencyModel.load(path), f"latency profile of this pair and device from {path}"
    windows = [
        getattr(m.config.get_text_config(), "max_position_embeddings", None) or 10**9
        for m in (engine.target, engine.draft)
    ]
    tokens = [t for t in DEFAULT_TOKENS if t <= min(windows) // 2] or [1]
    contexts = [c for c in DEFAULT_CONTEXTS if c + tokens[-1] <= min(windows)] or [0]
    t0 = time.perf_counter()
    measured = measure_profile(engine, contexts, tokens, progress=progress)
    write_json_atomic(measured, path)
    model = LatencyModel(measured)
    model.source = str(path)
    note = (
        f"the selector {runtime.path} has no latency profile here: measured one for this pair on this device in "
        f"{time.perf_counter() - t0:.0f} s, cached at {path}"
    )
    return model, note


def _calibration_prompts(engine: Any, seed: int, count: int = 2) -> list[Any]:
    """Built-in prompts from the end of the list when a tokenizer exists, else random token ids."""
    import torch

    if engine.tokenizer is not None:
        from adaptive_spec.files import default_prompts

        prompts = default_prompts()
        if prompts:
            return prompts[-count:]
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, engine.input_vocab_size, (24,), generator=gen).tolist() for _ in range(count)]


# ---------------------------------------------------------------------- plot
def plot_profile(profile: dict[str, Any], path: str | Path) -> Path:
    """Three panels: draft and target forward latency against tokens (one line per context), verifiers."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    tokens = profile["tokens"]
    for ax, name in zip(axes[:2], ("draft", "target"), strict=True):
        q1, q3 = profile.get(f"{name}_q1_ms"), profile.get(f"{name}_q3_ms")
        for ci, (ctx, row) in enumerate(zip(profile["contexts"], profile[f"{name}_ms"], strict=True)):
            line = ax.plot(tokens, row, marker="o", ms=3, label=f"context {ctx}")[0]
            if q1 and q3:  # interquartile band
                ax.fill_between(tokens, q1[ci], q3[ci], color=line.get_color(), alpha=0.15, lw=0)
        model = profile.get("models", {}).get(name, {})
        ax.set_title(f"{name} forward ({model.get('parameters', 0) / 1e6:.1f}M params)")
        ax.set_xlabel("tokens per forward")
        ax.set_ylabel("median ms")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    ax = axes[2]
    for name, laws in sorted(profile.get("verify_ms", {}).items()):
        law = next((x for x in ("iid", "chain") if x in laws), next(iter(laws)))
        ax.plot(laws[law]["nodes"], laws[law]["ms"], marker="o", ms=3, label=f"{name} ({law})")
    ax.set_title(f"verifiers (V = {profile.get('vocab_size', '?')})")
    ax.set_xlabel("tree nodes")
    ax.set_ylabel("median ms per verify")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    dev = profile.get("device", {})
    fig.suptitle(
        f"latency profile: {dev.get('name', '?')} ({dev.get('type', '?')}, {dev.get('torch_threads', '?')} threads), "
        f"{profile.get('dtype', '?')}, {profile.get('created', '')}",
        fontsize=10,
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def print_summary(profile: dict[str, Any]) -> None:
    """A few lines: one-token and largest forwards at the smallest and largest context; the fit."""
    dev = profile["device"]
    print(f"device {dev['name']} ({dev['type']}, {dev['torch_threads']} threads), dtype {profile['dtype']}")
    t_lo, t_hi = profile["tokens"][0], profile["tokens"][-1]
    for name in ("draft", "target"):
        grid = profile[f"{name}_ms"]
        for ci in (0, len(profile["contexts"]) - 1):
            print(
                f"  {name:<6} context {profile['contexts'][ci]:>5}: {grid[ci][0]:8.3f} ms at {t_lo} tokens, "
                f"{grid[ci][-1]:8.3f} ms at {t_hi}"
            )
    ovh = profile.get("overhead") or {}
    if ovh:
        print(
            f"  bookkeeping: {ovh['const_ms']:.3f} ms + {ovh['per_level_ms']:.3f} ms/level + "
            f"{ovh['per_node_ms']:.4f} ms/node, +{ovh['first_step_ms']:.2f} ms on a first step "
            f"(rms residual {ovh['residual_rms_ms']:.2f} ms over {ovh['steps']} steps)"
        )
