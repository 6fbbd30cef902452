"""``adaptive-spec bench overhead``: the share of each step spent outside the two models' forwards.

The measurement is :func:`adaptive_spec.bench.overhead.measure_overhead`.
"""

from __future__ import annotations

import argparse
import json

from adaptive_spec.bench.overhead import SIXTEEN_NODE_PLANS, count_host_syncs, measure_overhead
from adaptive_spec.options import add_json_option, add_limit_option, add_model_options


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the ``bench overhead`` options."""
    add_model_options(parser, ("target", "draft"))
    parser.add_argument("--plans", default=SIXTEEN_NODE_PLANS, help="comma-separated plans (default: %(default)s)")
    parser.add_argument("--temperature", type=float, default=1.0, help="(default: %(default)s)")
    parser.add_argument("--max-new-tokens", type=int, default=128, help="(default: %(default)s)")
    add_limit_option(parser, 8, "built-in prompts")
    add_model_options(parser, ("device",))
    add_json_option(parser, "the rows")
    parser.add_argument(
        "--syncs", action="store_true", help="count host synchronisations per step instead of timing the overhead"
    )


def run(args: argparse.Namespace) -> int:
    """Measure each plan's share of step time outside the forwards (and host syncs), print a table."""
    from adaptive_spec.engine import Plan
    from adaptive_spec.engine.load import load_engine
    from adaptive_spec.files import default_prompts

    engine = load_engine(args.target, args.draft, args.device, None)
    prompts = default_prompts()[: args.limit]
    plans = [Plan.parse(p.strip()) for p in args.plans.split(",") if p.strip()]
    if args.syncs:
        rows = count_host_syncs(engine, prompts, plans, args.temperature, args.max_new_tokens)
        print(f"{'plan':<28} {'engine syncs/step':>18} {'model syncs/step':>17}  engine syncs by method")
        for r in rows:
            print(
                f"{r['plan']:<28} {r['engine_syncs_per_step']:18.1f} {r['model_syncs_per_step']:17.1f}  "
                f"{r['engine_syncs_by_method']}"
            )
    else:
        rows = measure_overhead(engine, prompts, plans, args.temperature, args.max_new_tokens)
        print(f"{'plan':<28} {'overhead':>9} {'ms/step':>8} {'target fwd':>11} {'draft fwd':>10} {'steps':>6}")
        for r in rows:
            print(
                f"{r['plan']:<28} {100 * r['overhead_fraction']:8.1f}% {r['overhead_ms_per_step']:8.2f} "
                f"{r['target_forward_s']:10.2f}s {r['draft_forward_s']:9.2f}s {r['steps']:>6}"
            )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"rows": rows}, indent=2))
        print(f"wrote {args.json}")
    return 0
