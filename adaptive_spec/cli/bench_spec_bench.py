"""``adaptive-spec bench spec-bench``: Spec-Bench per category, every method in one interleaved run (options, output).

The benchmark is :mod:`adaptive_spec.bench.spec_bench`.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from adaptive_spec.options import add_model_options, add_profile_option, add_progress_option, add_temperatures_option

DEFAULT_PLANS = "adaptive,best-static,chain:2/block,lookup:8/block,lookup:3x8/nss"
DEFAULT_OUT = Path("data/bench/spec_bench")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the ``bench spec-bench`` options."""
    add_model_options(parser, ("target", "draft"))
    parser.add_argument(
        "--plans",
        default=DEFAULT_PLANS,
        help="comma-separated plans, 'in-draft' (the tuned in-draft planner), 'adaptive' (the per-step planner "
        "shipped for the pair: a fetched model's tuned source rule, else the selector) or 'best-static' "
        "(default: %(default)s)",
    )
    add_temperatures_option(parser, "0,1", "all measured in one interleaved run")
    parser.add_argument(
        "--per-category", type=int, default=10, help="questions per category, evenly spaced (default: %(default)s)"
    )
    parser.add_argument("--max-new-tokens", type=int, default=128, help="new tokens per turn (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=0, help="base seed; prompt i uses seed + i (default: %(default)s)")
    parser.add_argument("--selector", default=None, help="the 'adaptive' plan's ONNX selector")
    parser.add_argument("--best-static-file", default=None, help="'best-static' plans (a tuned plan file)")
    add_profile_option(parser)
    add_model_options(parser, ("device", "dtype"))
    parser.add_argument("--no-hf", action="store_true", help="skip transformers' assisted generation")
    parser.add_argument(
        "--hf-draft", default=None, help="the draft of transformers' assisted generation (as in bench e2e)"
    )
    parser.add_argument("--no-lookup", action="store_true", help="skip transformers' prompt lookup decoding")
    parser.add_argument(
        "--out",
        type=Path,
        default=DEFAULT_OUT,
        metavar="DIR",
        help="folder for spec_bench.json and spec_bench.png (default: %(default)s)",
    )
    add_progress_option(parser)


def run(args: argparse.Namespace) -> int:
    """Run Spec-Bench, print a table per temperature, write the JSON report and the plot."""
    import torch

    from adaptive_spec.bench import spec_bench
    from adaptive_spec.cli.bench_e2e import bench_plans
    from adaptive_spec.engine.load import load_engine, load_hf_draft
    from adaptive_spec.files import write_json_atomic
    from adaptive_spec.temperatures import parse_temperatures

    try:
        temps = parse_temperatures(args.temperatures)
        questions = spec_bench.load_questions(args.per_category)
    except ValueError as err:
        raise SystemExit(f"bench spec-bench: {err}") from None
    plans, info, latency = bench_plans(args, temps, "bench spec-bench")
    engine = load_engine(args.target, args.draft, args.device, args.dtype, latency_model=latency.model)
    latency.complete(engine, progress=not args.no_progress)
    hf_draft = None if args.no_hf else load_hf_draft(engine, args.hf_draft, args.target)
    progress = not args.no_progress
    prompts = spec_bench.turn_prompts(engine, questions, args.max_new_tokens, progress=progress)
    report = spec_bench.run(
        engine,
        prompts,
        plans,
        temps,
        args.max_new_tokens,
        args.seed,
        progress=progress,
        hf=not args.no_hf,
        hf_draft=hf_draft,
        lookup=not args.no_lookup,
    )
    report = {
        "config": {
            "target": args.target or "default pair",
            "draft": args.draft or ("default pair" if args.target is None else "paired draft"),
            "hf_draft": getattr(hf_draft, "name_or_path", None),
            "questions": f"Spec-Bench ({spec_bench.QUESTIONS.name}), {args.per_category} per category",
            "num_turns": len(prompts),
            "temperatures": temps,
            "plans": list(plans),
            "best_static": info["best_static"],
            "adaptive": info.get("adaptive"),
            "max_new_tokens": args.max_new_tokens,
            "seed": args.seed,
            "device": str(engine.device),
            "dtype": str(engine.target.dtype),
            "threads": torch.get_num_threads(),
        },
        **report,
    }
    spec_bench.print_summary(report["summary"])
    json_path = write_json_atomic(report, args.out / "spec_bench.json")
    plot = spec_bench.plot_summary(report["summary"], args.out / "spec_bench.png")
    print(f"wrote {json_path} and {plot}")
    return 0
