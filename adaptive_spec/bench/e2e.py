"""``adaptive-spec bench e2e``: end-to-end speed of plans against autoregressive and HF assisted decoding.

On the same prompts, interleaved per prompt (so that drift in machine speed hits every
method alike): the autoregressive target baseline, each plan, and transformers' own assisted
generation (``target.generate(assistant_model=draft)``). Reports tokens/s, speedup over the
autoregressive baseline, block efficiency (tokens per target decoding pass) and the ratio
to HF assisted generation.

Prompts: JSON Lines (``.gz`` accepted); each record has a ``prompt`` string or a ``turns``
list (the first turn is used).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

DEFAULT_PLANS = "chain:4/block,delayed:2x3x3/traversal,wor:3x2x1/traversal"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the ``bench e2e`` options."""
    parser.add_argument("--target", default=None, help="target model directory or hub id (default: built-in pair)")
    parser.add_argument("--draft", default=None, help="draft model directory or hub id (default: built-in pair)")
    parser.add_argument(
        "--prompts", default=None, help="JSON Lines file (.gz ok) with 'prompt' or 'turns' (default: built-in prompts)"
    )
    parser.add_argument("--plans", default=DEFAULT_PLANS, help="comma-separated plans (default: %(default)s)")
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default: %(default)s)")
    parser.add_argument("--max-new-tokens", type=int, default=128, help="new tokens per prompt (default: %(default)s)")
    parser.add_argument("--limit", type=int, default=None, help="use only the first N prompts")
    parser.add_argument("--seed", type=int, default=0, help="base seed; prompt i uses seed + i (default: %(default)s)")
    parser.add_argument("--device", default=None, help="cpu, cuda, ... (default: cuda if available)")
    parser.add_argument("--dtype", default=None, help="float32, bfloat16 or float16 (default: the checkpoint's)")
    parser.add_argument("--no-hf", action="store_true", help="skip transformers' assisted generation")
    parser.add_argument("--json", default=None, help="write the results to this JSON file")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")


class _Tally:
    def __init__(self) -> None:
        self.tokens = 0
        self.seconds = 0.0
        self.steps = 0
        self.accept_lengths: list[int] = []
        self.tree_sizes: list[int] = []
        self.phase_times_s: dict[str, float] = {}

    def add(self, stats) -> None:
        self.tokens += stats.new_tokens
        self.seconds += stats.wall_time_s
        self.steps += stats.steps
        self.accept_lengths += list(stats.accept_lengths)
        self.tree_sizes += list(stats.tree_sizes)
        for k, v in stats.phase_times_s.items():
            self.phase_times_s[k] = self.phase_times_s.get(k, 0.0) + v

    def summary(self, ar_tps: float | None, hf_tps: float | None) -> dict:
        tps = self.tokens / self.seconds if self.seconds > 0 else 0.0
        return {
            "tokens_per_s": tps,
            "speedup_vs_ar": tps / ar_tps if ar_tps else None,
            "ratio_to_hf_assisted": tps / hf_tps if hf_tps else None,
            "block_efficiency": self.tokens / self.steps if self.steps else None,
            "new_tokens": self.tokens,
            "seconds": self.seconds,
            "mean_tree_size": sum(self.tree_sizes) / len(self.tree_sizes) if self.tree_sizes else None,
            "accept_histogram": {str(k): self.accept_lengths.count(k) for k in sorted(set(self.accept_lengths))},
            "phase_times_s": self.phase_times_s,
        }


def _hf_assisted(engine, prompt: str, temperature: float, max_new_tokens: int, seed: int) -> tuple[int, float]:
    import torch

    ids = engine.tokenizer(prompt, return_tensors="pt").input_ids.to(engine.device)
    sampling = {"do_sample": False}
    if temperature > 0:
        sampling = {"do_sample": True, "temperature": temperature, "top_k": None, "top_p": None}
    torch.manual_seed(seed)
    t0 = time.perf_counter()
    with torch.inference_mode():
        out = engine.target.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            assistant_model=engine.draft,
            max_new_tokens=max_new_tokens,
            pad_token_id=engine.tokenizer.pad_token_id or engine.tokenizer.eos_token_id,
            **sampling,
        )
    if engine.device.type == "cuda":
        torch.cuda.synchronize(engine.device)
    return out.shape[1] - ids.shape[1], time.perf_counter() - t0


def measure(
    engine,
    prompts: list[str],
    plans: list,
    temperature: float,
    max_new_tokens: int,
    seed: int = 0,
    hf: bool = True,
    progress: bool = True,
) -> dict:
    """Run the baseline, every plan and (optionally) HF assisted generation, interleaved per prompt.

    Returns:
        ``{"results": [...], "baselines": {"autoregressive": ..., "hf_assisted": ...}}``; each
        row has tokens/s, speedup over autoregressive, ratio to HF assisted, block
        efficiency, new tokens, the accepted-length histogram and the phase times.
    """
    from tqdm.auto import tqdm

    ar, hf_tally = _Tally(), _Tally()
    tallies = {str(p): _Tally() for p in plans}
    hf_error = None
    # Warm-up: first calls pay for lazy initialisation.
    engine.generate(prompts[0], max_new_tokens=4, temperature=temperature, plan=plans[0] if plans else None)
    engine.generate(prompts[0], max_new_tokens=4, temperature=temperature)
    for i, prompt in enumerate(tqdm(prompts, desc=f"bench e2e T={temperature:g}", disable=not progress)):
        for plan in [None, *plans]:
            r = engine.generate(
                prompt, max_new_tokens=max_new_tokens, temperature=temperature, plan=plan, seed=seed + i
            )
            (ar if plan is None else tallies[str(plan)]).add(r.stats)
        if hf and hf_error is None:
            try:
                n, dt = _hf_assisted(engine, prompt, temperature, max_new_tokens, seed + i)
            except (RuntimeError, ValueError, TypeError) as err:  # report, keep benchmarking the rest
                hf_error = f"{type(err).__name__}: {err}"
            else:
                hf_tally.tokens += n
                hf_tally.seconds += dt
    ar_tps = ar.tokens / ar.seconds if ar.seconds else None
    hf_tps = hf_tally.tokens / hf_tally.seconds if hf_tally.seconds and hf_error is None else None
    results = [{"plan": name, **t.summary(ar_tps, hf_tps)} for name, t in tallies.items()]
    baselines = {"autoregressive": {"plan": "autoregressive", **ar.summary(ar_tps, hf_tps)}}
    if hf:
        hf_row = {"plan": "hf_assisted", **hf_tally.summary(ar_tps, hf_tps), "block_efficiency": None}
        if hf_error:
            hf_row["error"] = hf_error
        baselines["hf_assisted"] = hf_row
    return {"results": results, "baselines": baselines}


def load_engine(target: str | None, draft: str | None, device: str | None, dtype: str | None):
    """The engine over ``target``/``draft``, or over the built-in default pair when both are None."""
    import torch

    from adaptive_spec.engine import SpecEngine

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    if (target is None) != (draft is None):
        raise SystemExit("give both --target and --draft, or neither (the built-in default pair)")
    return SpecEngine.from_pretrained(target, draft, device=device, dtype=dtype)


def run(args: argparse.Namespace) -> int:
    """Run the benchmark, print a table, optionally write JSON; return the exit status."""
    from adaptive_spec.engine import Plan

    engine = load_engine(args.target, args.draft, args.device, args.dtype)
    plans = [Plan.parse(p.strip()) for p in args.plans.split(",") if p.strip()]
    if args.prompts is None:
        from adaptive_spec.zoo import default_prompts

        prompts = default_prompts()[: args.limit] if args.limit else default_prompts()
    else:
        from adaptive_spec.zoo import read_prompts

        prompts = read_prompts(args.prompts, args.limit)
    report = measure(
        engine, prompts, plans, args.temperature, args.max_new_tokens, args.seed, hf=not args.no_hf,
        progress=not args.no_progress,
    )  # fmt: skip
    report["config"] = {
        "target": args.target or "default pair",
        "draft": args.draft or "default pair",
        "prompts": str(args.prompts or "built-in prompts"),
        "num_prompts": len(prompts),
        "temperature": args.temperature,
        "max_new_tokens": args.max_new_tokens,
        "seed": args.seed,
        "device": str(engine.device),
        "dtype": str(engine.target.dtype),
        "threads": __import__("torch").get_num_threads(),
    }
    print_table([*report["baselines"].values(), *report["results"]])
    hf_row = report["baselines"].get("hf_assisted", {})
    if hf_row.get("error"):
        print(f"HF assisted generation failed: {hf_row['error']}")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(report, indent=2))
        print(f"wrote {args.json}")
    return 0


def print_table(rows: list[dict]) -> None:
    """Print one line per method: tokens/s, speedup vs AR and vs HF assisted, block efficiency."""

    def fmt(x: float | None, spec: str) -> str:
        return "-" if x is None else format(x, spec)

    head = f"{'plan':<32} {'tok/s':>9} {'vs AR':>7} {'vs HF':>7} {'BE':>6} {'tokens':>8}"
    print(head)
    print("-" * len(head))
    for r in rows:
        print(
            f"{r['plan']:<32} {fmt(r['tokens_per_s'], '9.1f')} {fmt(r['speedup_vs_ar'], '7.2f')} "
            f"{fmt(r['ratio_to_hf_assisted'], '7.2f')} {fmt(r['block_efficiency'], '6.2f')} {r['new_tokens']:>8}"
        )
