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
import gzip
import json
import time
from pathlib import Path

DEFAULT_PLANS = "chain:4/block,delayed:2x3x3/traversal,wor:3x2x1/traversal"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the ``bench e2e`` options."""
    parser.add_argument("--target", required=True, help="target model directory or hub id")
    parser.add_argument("--draft", required=True, help="draft model directory or hub id")
    parser.add_argument("--prompts", required=True, help="JSON Lines file (.gz ok) with 'prompt' or 'turns'")
    parser.add_argument("--plans", default=DEFAULT_PLANS, help="comma-separated plans (default: %(default)s)")
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default: %(default)s)")
    parser.add_argument("--max-new-tokens", type=int, default=128, help="new tokens per prompt (default: %(default)s)")
    parser.add_argument("--limit", type=int, default=None, help="use only the first N prompts")
    parser.add_argument("--seed", type=int, default=0, help="base seed; prompt i uses seed + i (default: %(default)s)")
    parser.add_argument("--device", default=None, help="cpu, cuda, ... (default: cuda if available)")
    parser.add_argument("--dtype", default=None, help="float32, bfloat16 or float16 (default: the checkpoint's)")
    parser.add_argument("--no-hf", action="store_true", help="skip transformers' assisted generation")
    parser.add_argument("--json", default=None, help="write the results to this JSON file")


def read_prompts(path: str | Path, limit: int | None = None) -> list[str]:
    """Prompts from a JSON Lines file (``.gz`` accepted): ``prompt`` or the first of ``turns``."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    prompts: list[str] = []
    with opener(path, "rt", encoding="utf-8") as f:
        for line_no, line in enumerate(f, 1):
            if not line.strip():
                continue
            record = json.loads(line)
            if isinstance(record.get("prompt"), str):
                prompts.append(record["prompt"])
            elif isinstance(record.get("turns"), list) and record["turns"]:
                prompts.append(str(record["turns"][0]))
            else:
                raise ValueError(f"{path}:{line_no}: a record needs a 'prompt' string or a non-empty 'turns' list")
            if limit is not None and len(prompts) >= limit:
                break
    if not prompts:
        raise ValueError(f"{path}: no prompts")
    return prompts


class _Tally:
    def __init__(self) -> None:
        self.tokens = 0
        self.seconds = 0.0
        self.steps = 0

    def summary(self, ar_tps: float | None, hf_tps: float | None) -> dict:
        tps = self.tokens / self.seconds if self.seconds > 0 else 0.0
        return {
            "tokens_per_s": tps,
            "speedup_vs_ar": tps / ar_tps if ar_tps else None,
            "ratio_to_hf_assisted": tps / hf_tps if hf_tps else None,
            "block_efficiency": self.tokens / self.steps if self.steps else None,
            "new_tokens": self.tokens,
            "seconds": self.seconds,
        }


def _hf_assisted(engine, prompt: str, args: argparse.Namespace, seed: int) -> tuple[int, float]:
    import torch

    ids = engine.tokenizer(prompt, return_tensors="pt").input_ids.to(engine.device)
    sampling = {"do_sample": False}
    if args.temperature > 0:
        sampling = {"do_sample": True, "temperature": args.temperature, "top_k": None, "top_p": None}
    torch.manual_seed(seed)
    t0 = time.perf_counter()
    with torch.inference_mode():
        out = engine.target.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            assistant_model=engine.draft,
            max_new_tokens=args.max_new_tokens,
            pad_token_id=engine.tokenizer.pad_token_id or engine.tokenizer.eos_token_id,
            **sampling,
        )
    if engine.device.type == "cuda":
        torch.cuda.synchronize(engine.device)
    return out.shape[1] - ids.shape[1], time.perf_counter() - t0


def run(args: argparse.Namespace) -> int:
    """Run the benchmark, print a table, optionally write JSON; return the exit status."""
    import torch

    from adaptive_spec.engine import Plan, SpecEngine

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    engine = SpecEngine.from_pretrained(args.target, args.draft, device=device, dtype=args.dtype)
    plans = [Plan.parse(p.strip()) for p in args.plans.split(",") if p.strip()]
    prompts = read_prompts(args.prompts, args.limit)
    ar, hf = _Tally(), _Tally()
    tallies = {str(p): _Tally() for p in plans}
    hf_error = None

    engine.generate(prompts[0], max_new_tokens=4, temperature=args.temperature, plan=plans[0] if plans else None)
    for i, prompt in enumerate(prompts):
        seed = args.seed + i
        for plan in [None, *plans]:
            r = engine.generate(
                prompt, max_new_tokens=args.max_new_tokens, temperature=args.temperature, plan=plan, seed=seed
            )
            tally = ar if plan is None else tallies[str(plan)]
            tally.tokens += r.stats.new_tokens
            tally.seconds += r.stats.wall_time_s
            tally.steps += r.stats.steps
        if not args.no_hf and hf_error is None:
            try:
                n, dt = _hf_assisted(engine, prompt, args, seed)
            except (RuntimeError, ValueError, TypeError) as err:  # report, keep benchmarking the rest
                hf_error = f"{type(err).__name__}: {err}"
            else:
                hf.tokens += n
                hf.seconds += dt

    ar_tps = ar.tokens / ar.seconds if ar.seconds else None
    hf_tps = hf.tokens / hf.seconds if hf.seconds and hf_error is None else None
    results = [{"plan": name, **t.summary(ar_tps, hf_tps)} for name, t in tallies.items()]
    baselines = {"autoregressive": {"plan": "autoregressive", **ar.summary(ar_tps, hf_tps)}}
    if not args.no_hf:
        hf_row = {"plan": "hf_assisted", **hf.summary(ar_tps, hf_tps), "block_efficiency": None}
        if hf_error:
            hf_row["error"] = hf_error
        baselines["hf_assisted"] = hf_row
    report = {
        "results": results,
        "baselines": baselines,
        "config": {
            "target": args.target,
            "draft": args.draft,
            "prompts": str(args.prompts),
            "num_prompts": len(prompts),
            "temperature": args.temperature,
            "max_new_tokens": args.max_new_tokens,
            "seed": args.seed,
            "device": str(engine.device),
            "dtype": str(engine.target.dtype),
        },
    }
    _print_table([*baselines.values(), *results])
    if hf_error:
        print(f"HF assisted generation failed: {hf_error}")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(report, indent=2))
    return 0


def _print_table(rows: list[dict]) -> None:
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
