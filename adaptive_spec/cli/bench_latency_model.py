"""``adaptive-spec bench latency-model``: the latency model's predicted step times vs measured steps.

The comparison is :func:`adaptive_spec.bench.latency_check.compare`.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from adaptive_spec.bench.latency_check import CHECK_PLANS, compare, plot_comparison
from adaptive_spec.options import add_json_option, add_limit_option, add_model_options, add_progress_option
from adaptive_spec.planner.latency import default_profile_path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the ``bench latency-model`` options."""
    add_model_options(parser, dtype_default="the engine's")
    parser.add_argument(
        "--profile", type=Path, default=None, help=f"latency profile (default: {default_profile_path()})"
    )
    parser.add_argument("--plans", default=CHECK_PLANS, help="comma-separated static plans (default: %(default)s)")
    add_limit_option(parser, 4, "built-in prompts")
    parser.add_argument("--max-new-tokens", type=int, default=64, help="new tokens per prompt (default: %(default)s)")
    parser.add_argument("--temperature", type=float, default=1.0, help="(default: %(default)s)")
    parser.add_argument("--seed", type=int, default=0, help="base seed; prompt i uses seed + i (default: %(default)s)")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    add_json_option(parser, "the report (and a PNG beside it)")
    add_progress_option(parser)


def run(args: argparse.Namespace) -> int:
    """Measure each plan's engine steps against the latency model's predictions, print the MAPE per plan."""
    import torch

    from adaptive_spec.bench.profile import device_info, measure_steps
    from adaptive_spec.engine.load import load_engine
    from adaptive_spec.files import default_prompts, write_json_atomic
    from adaptive_spec.planner.actions import parse_plans
    from adaptive_spec.planner.latency import LatencyModel

    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        model = LatencyModel.load(args.profile)
        plans = parse_plans(args.plans)
    except (FileNotFoundError, ValueError) as err:
        raise SystemExit(str(err)) from None
    if not plans:
        raise SystemExit("--plans: give at least one plan")
    engine = load_engine(args.target, args.draft, args.device, args.dtype)
    here = device_info(engine.device)
    there = model.profile.get("device", {})
    if (here["type"], here["name"]) != (there.get("type"), there.get("name")):
        print(f"warning: the profile was measured on {there.get('name')} ({there.get('type')}), this is {here['name']}")
    prompts = default_prompts(args.limit)
    steps = measure_steps(
        engine,
        prompts,
        plans,
        args.max_new_tokens,
        args.temperature,
        args.seed,
        not args.no_progress,
        desc="bench latency-model",
    )
    report = compare(model, steps, args.temperature)
    report["config"] = {
        "profile": str(args.profile or default_profile_path()),
        "profile_created": model.profile.get("created"),
        "num_prompts": len(prompts),
        "max_new_tokens": args.max_new_tokens,
        "temperature": args.temperature,
        "seed": args.seed,
        "device": here,
    }
    head = ("plan", "steps", "measured", "predicted", "MAPE", "bias", "mean err", "nodes")
    print("{:<26} {:>5} {:>9} {:>9} {:>6} {:>6} {:>8} {:>9}".format(*head))
    for plan, s in report["per_plan"].items():
        print(
            f"{plan:<26} {s['steps']:>5} {s['measured_ms']:7.2f}ms {s['predicted_ms']:7.2f}ms {100 * s['mape']:5.1f}% "
            f"{100 * s['bias']:+5.1f}% {100 * s['mean_step_ape']:7.1f}% {s['mean_nodes']:4.1f}/{s['max_nodes']:<4}"
        )
    o = report["overall"]
    print(
        f"{'overall':<26} {o['steps']:>5} {o['measured_ms']:7.2f}ms {o['predicted_ms']:7.2f}ms {100 * o['mape']:5.1f}% "
        f"{100 * o['bias']:+5.1f}% {100 * o['plan_mean_step_mape']:7.1f}%"
    )
    rho = o["plan_rank_spearman"]
    print(
        "(MAPE: per step; mean err: error of each plan's mean step time; nodes: real/largest tree)\n"
        "rank correlation of the plans' mean step times, predicted vs measured: "
        + (f"{rho:.2f}" if rho is not None else "n/a")
    )
    if args.json:
        write_json_atomic(report, args.json)
        print(f"wrote {args.json} and {plot_comparison(report, args.json.with_suffix('.png'))}")
    return 0
