"""Measuring a latency profile: forwards by context and block size, verifiers by tree size, engine steps.

:func:`measure_profile` runs all three and the bookkeeping fit (:mod:`.fit`) into one profile.
"""

from __future__ import annotations

import datetime as dt
import platform
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

from adaptive_spec.bench.profile.fit import fit_overhead
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

    from adaptive_spec.engine.weight_order import cpu_name

    device = torch.device(device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_name()
    return {
        "type": device.type,
        "name": name,
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
    }


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


def measure_forwards(
    target: Any,
    draft: Any,
    contexts: Sequence[int] = DEFAULT_CONTEXTS,
    tokens: Sequence[int] = DEFAULT_TOKENS,
    warmup: int = 3,
    repeats: int = 10,
    seed: int = 0,
    progress: bool = True,
    also: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Median block-forward milliseconds of both models over the (context, tokens) grid.

    ``also``: more causal LMs measured the same way, interleaved, as ``{name}_ms`` (e.g. the target
    with its weights in the stock row-major order, ``target_row_major``).

    Returns:
        ``{"contexts", "tokens", "draft_ms", "target_ms", "draft_q1_ms", "draft_q3_ms",
        "target_q1_ms", "target_q3_ms"}``: medians and quartiles, grids indexed ``[context][tokens]``.

    Raises:
        ValueError: a grid point does not fit a model's context window, or bad sizes.
    """
    import torch
    from tqdm.auto import tqdm

    contexts, tokens = sorted(set(contexts)), sorted(set(tokens))
    if not contexts or contexts[0] < 0 or not tokens or tokens[0] < 1:
        raise ValueError(f"contexts must be >= 0 and tokens >= 1, got {contexts} and {tokens}")
    if warmup < 0 or repeats < 1:
        raise ValueError(f"warmup must be >= 0 and repeats >= 1, got {warmup} and {repeats}")
    runners, eagle = _forward_runners(target, draft, also, contexts[-1], tokens[-1])
    device = runners["target"].device
    sync = _sync_fn(device)
    vocab = min(r.model.get_input_embeddings().weight.shape[0] for r in runners.values())
    gen = torch.Generator().manual_seed(seed)
    prefill = torch.randint(0, vocab, (contexts[-1],), generator=gen).to(device)
    block = torch.randint(0, vocab, (tokens[-1],), generator=gen).to(device)
    samples = {name: [[[] for _ in tokens] for _ in contexts] for name in runners}
    bar = tqdm(total=len(contexts) * len(tokens), desc="profile forwards", disable=not progress)
    with torch.inference_mode():
        for r in runners.values():
            r.rollback(0)
        for ci, ctx in enumerate(contexts):
            _extend_caches(runners, prefill, ctx, eagle)
            for ti, n in enumerate(tokens):
                for i in range(warmup + repeats):
                    for name, r in runners.items():  # interleaved: load drift hits both models alike
                        level = eagle and name == "draft"  # an EAGLE head drafts a level at a time
                        t = _time_block_forward(r, block[:n], ctx, level, sync)
                        if i >= warmup:
                            samples[name][ci][ti].append(t * 1e3)
                bar.update()
    bar.close()
    out: dict[str, Any] = {"contexts": contexts, "tokens": tokens}
    for name, grid in samples.items():
        q = [[_quartiles(s) for s in row] for row in grid]
        out[f"{name}_ms"] = [[m for _, m, _ in row] for row in q]
        out[f"{name}_q1_ms"] = [[lo for lo, _, _ in row] for row in q]
        out[f"{name}_q3_ms"] = [[hi for _, _, hi in row] for row in q]
    return out


def _forward_runners(
    target: Any, draft: Any, also: dict[str, Any] | None, context: int, tokens: int
) -> tuple[dict[str, Any], bool]:
    """``({"draft", "target", *also}: runner, whether the draft is an EAGLE head)``.

    Raises:
        ValueError: ``context`` plus ``tokens`` does not fit a model's context window.
    """
    from adaptive_spec.engine.eagle import draft_runner, is_eagle_head
    from adaptive_spec.engine.runner import ModelRunner

    eagle = is_eagle_head(draft)  # an EAGLE head reads the target's features of the context
    runners = {"draft": draft_runner(draft), "target": ModelRunner(target, keep_features=eagle)}
    runners |= {name: ModelRunner(model) for name, model in (also or {}).items()}
    for name, r in runners.items():
        window = getattr(r.model.config.get_text_config(), "max_position_embeddings", None)
        if window and context + tokens > window:
            raise ValueError(
                f"the {name} model's context window is {window} tokens, but the grid needs "
                f"{context} + {tokens}; lower --contexts or --tokens"
            )
    return runners, eagle


def _extend_caches(runners: dict[str, Any], prefill: Any, ctx: int, eagle: bool) -> None:
    """Extend every runner's KV cache to the first ``ctx`` tokens of ``prefill`` (the target's first:
    an EAGLE draft reads its features).
    """
    target, start = runners["target"], runners["target"].cached
    target.chain_forward(prefill[start:ctx], logits_to_keep=1)
    if eagle and ctx > start:
        runners["draft"].set_target_features(start, target.features)
    for r in runners.values():
        if r is not target:
            r.chain_forward(prefill[r.cached : ctx], logits_to_keep=1)


def _time_block_forward(r: Any, block: Any, ctx: int, level: bool, sync: Callable[[], None]) -> float:
    """Seconds of one ``block_forward`` of ``block`` after ``ctx`` cached tokens, rolled back after.

    The block is a chain (one path of ``n`` nodes), or with ``level`` ``n`` children of the root
    (how an EAGLE head drafts, a level at a time).
    """
    import torch

    n, device = len(block), block.device
    anc = (
        torch.eye(n, dtype=torch.bool, device=device)
        if level
        else torch.ones(n, n, dtype=torch.bool, device=device).tril_()
    )
    pos = torch.arange(ctx, ctx + n, device=device)
    sync()
    t0 = time.perf_counter()
    r.block_forward(block, pos, anc, logits_to_keep=n)
    sync()
    out = time.perf_counter() - t0
    r.rollback(ctx)
    return out


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

    from adaptive_spec.verifiers import REGISTRY, verify

    names = list(verifiers) if verifiers else [n for n, s in REGISTRY.items() if s.lossless]
    unknown = [n for n in names if n not in REGISTRY]
    if unknown:
        raise ValueError(f"unknown verifiers {unknown}; known: {', '.join(REGISTRY)}")
    device = torch.device(device)
    sync = _sync_fn(device)
    trees = _synthetic_trees(vocab, device, trees_per_size, seed)

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


def _synthetic_trees(vocab: int, device: Any, trees_per_size: int, seed: int) -> dict[str, list[tuple[str, int, list]]]:
    """Per law, per shape of :data:`VERIFY_SHAPES`: ``(shape, max nodes, [(tree, soft rows, one-hot rows)])``.

    Target logits ~ N(0, 3^2) per prefix, draft logits = target + N(0, 1); shared by all verifiers.
    """
    import torch

    from adaptive_spec.trees import TreeShape, sample_tree

    gen = torch.Generator().manual_seed(seed)
    cache: dict[tuple[int, ...], tuple[torch.Tensor, torch.Tensor]] = {}

    def rows(prefix: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
        if prefix not in cache:
            t = torch.randn(vocab, generator=gen) * 3  # [V]
            d = t + torch.randn(vocab, generator=gen)
            cache[prefix] = (torch.softmax(t, 0).to(device), torch.softmax(d, 0).to(device))
        return cache[prefix]

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
    return trees


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
    row_major_too: bool = False,
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
        row_major_too: also time copies of the target with all its ``Linear`` weights in the stock
            row-major order and all column-major, interleaved (``target_row_major_ms``,
            ``target_column_major_ms``; :mod:`adaptive_spec.engine.layout`), and record the order
            the host's calibration chose for the engine's target (``weight_order``,
            :func:`weight_order_report`).

    Returns:
        The profile dict (see :mod:`adaptive_spec.planner.latency`).
    """
    from adaptive_spec.planner.actions import parse_plans

    t0 = time.perf_counter()
    also = _weight_order_copies(engine.target) if row_major_too else {}
    fwd = measure_forwards(engine.target, engine.draft, contexts, tokens, warmup, repeats, seed, progress, also)
    verify_ms = measure_verifiers(
        engine.vocab_size, engine.device, repeats=repeats, trees_per_size=verify_trees, seed=seed, progress=progress
    )
    settings = {"warmup": warmup, "repeats": repeats, "verify_trees": verify_trees, "seed": seed}
    profile = _profile_head(engine, models or {}, settings) | fwd | {"verify_ms": verify_ms, "overhead": {}}
    if row_major_too:
        profile["weight_order"] = weight_order_report(engine.target)
    plans = parse_plans(CALIBRATION_PLANS) if calibration_plans is None else list(calibration_plans)
    if plans:
        prompts = list(calibration_prompts) if calibration_prompts else _calibration_prompts(engine, seed)
        steps = measure_steps(
            engine, prompts, plans, calibration_tokens, temperature, seed, progress, desc="profile bookkeeping"
        )
        profile["overhead"] = fit_overhead(profile, steps, temperature)
    profile["settings"]["seconds"] = round(time.perf_counter() - t0, 2)
    return profile


def _profile_head(engine: Any, models: dict[str, str], settings: dict[str, Any]) -> dict[str, Any]:
    """The profile's identification: format, date, device, dtype, models, vocabulary and settings."""
    from adaptive_spec.planner.latency import PROFILE_FORMAT, PROFILE_VERSION

    return {
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
        "settings": settings,
    }


def _weight_order_copies(target: Any) -> dict[str, Any]:
    """Copies of ``target`` with every ``Linear`` weight in the stock row-major order and in column-major."""
    import copy

    from adaptive_spec.engine.layout import column_major_linears, row_major_linears

    rows, columns = copy.deepcopy(target), copy.deepcopy(target)
    row_major_linears(rows)
    column_major_linears(columns)
    return {"target_row_major": rows, "target_column_major": columns}


def weight_order_report(target: Any) -> dict[str, Any]:
    """What the engine's weight order is on this host: the setting, how ``target``'s CPU weights are
    stored, and per weight shape this host's cached (else now measured) medians in every form (the two orders and
    oneDNN's packed copy) and what they choose (:mod:`adaptive_spec.engine.weight_order`).
    """
    from adaptive_spec.engine.layout import linear_orders
    from adaptive_spec.engine.weight_order import ORDER_ENV, shape_choices, weight_order_setting

    return {
        "setting": weight_order_setting(),
        "variable": ORDER_ENV,
        "target": linear_orders(target),
        "shapes": [choice.as_dict() for choice in shape_choices(target).values()],
    }


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
