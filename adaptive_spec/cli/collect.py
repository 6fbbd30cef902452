"""``adaptive-spec collect``: run the engine over prompts and log every step's features (options, printing).

The work is :func:`adaptive_spec.records.collect.collect`; see that module for what is logged.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from adaptive_spec.options import (
    add_draft_data_option,
    add_limit_option,
    add_model_options,
    add_progress_option,
    add_temperatures_option,
)
from adaptive_spec.planner.presets import COLLECT_PLAN
from adaptive_spec.records.collect import DEFAULT_TEMPERATURES, collect, make_planner
from adaptive_spec.temperatures import parse_temperatures


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the ``collect`` options."""
    parser.add_argument("--out", required=True, help="log directory (created; appended to if it holds a log)")
    parser.add_argument(
        "--prompts", default=None, help="JSON Lines (.gz ok) or .txt (one per line) prompts (default: built-in)"
    )
    add_limit_option(parser)
    parser.add_argument(
        "--plan", default=COLLECT_PLAN, help="static plan (exploited by --explore epsilon) (default: %(default)s)"
    )
    parser.add_argument(
        "--explore",
        default=None,
        help="explore the action space: 'uniform' (a random action every step) or 'epsilon:E' (a random action "
        "with probability E, else --plan)",
    )
    parser.add_argument("--actions", default=None, help="action space YAML for --explore (default: the built-in grid)")
    add_temperatures_option(parser, DEFAULT_TEMPERATURES)
    parser.add_argument("--top-k", type=int, default=0, help="top-k filter, 0 = off (default: %(default)s)")
    parser.add_argument("--top-p", type=float, default=1.0, help="nucleus filter, 1 = off (default: %(default)s)")
    parser.add_argument("--max-new-tokens", type=int, default=128, help="tokens per generation (default: %(default)s)")
    parser.add_argument("--repeats", type=int, default=1, help="generations per prompt and temperature (default: 1)")
    parser.add_argument("--seed", type=int, default=0, help="base seed (default: %(default)s)")
    parser.add_argument("--shard-size", type=int, default=1024, help="records per Parquet shard (default: %(default)s)")
    parser.add_argument("--hidden", action="store_true", help="also log the models' last hidden states (float16)")
    parser.add_argument("--profile", default=None, help="latency profile JSON (default: none: latency features 0)")
    parser.add_argument("--run-id", default=None, help="name of this run in the log (default: time + random digits)")
    add_model_options(parser)
    parser.add_argument(
        "--node-log",
        default=None,
        metavar="DIR",
        help="also log every drafted node's in-draft features, feed decision and soft acceptance labels as "
        "Parquet in DIR (training data of `selector acceptance --skip-collect`)",
    )
    add_draft_data_option(parser)
    add_progress_option(parser)


def _settings(args: argparse.Namespace, prompts: list, planner: Any, temperatures: list[float]) -> dict[str, Any]:
    """What this run collects with, recorded in the feature log's manifest."""
    return {
        "prompts": str(args.prompts or "built-in prompts"),
        "num_prompts": len(prompts),
        "plan": str(args.plan),
        "explore": args.explore,
        "actions": [str(p) for p in planner.space] if args.explore else None,
        "temperatures": temperatures,
        "top_k": args.top_k,
        "top_p": args.top_p,
        "max_new_tokens": args.max_new_tokens,
        "repeats": args.repeats,
        "seed": args.seed,
        "profile": args.profile,
    }


def _print_summary(summary: dict[str, Any], logger: Any, out: Any) -> None:
    print(
        f"run {logger.run_id}: {summary['generations']} generations, {summary['tokens']} tokens, "
        f"{logger.records_written} records in {len(logger.shards)} shards -> {out}"
    )
    print(f"{'family':<10} {'steps':>8} {'mean accepted':>14} {'tokens/step':>12}")
    for family, row in summary["families"].items():
        print(f"{family:<10} {row['steps']:>8} {row['mean_accepted']:>14.3f} {row['mean_emitted']:>12.3f}")
    sys.stdout.flush()


def run(args: argparse.Namespace) -> int:
    """Load the models, collect, print a summary; return the exit status."""
    import torch

    from adaptive_spec.engine import SpecEngine
    from adaptive_spec.formats.feature_log import FeatureLogger

    for name in ("max_new_tokens", "repeats", "shard_size"):
        if getattr(args, name) < 1:
            raise SystemExit(f"--{name.replace('_', '-')} must be >= 1")
    from adaptive_spec.engine.models import PAIRED_DRAFT

    lone_target = args.draft is None and args.target not in (None, *PAIRED_DRAFT)
    if (args.target is None and args.draft is not None) or lone_target:
        raise SystemExit("give both --target and --draft, a short-named --target alone (smollm2), or neither")
    try:
        temperatures = parse_temperatures(args.temperatures)
        planner = make_planner(args.plan, args.explore, args.actions, args.seed)
        if args.prompts is None:
            from adaptive_spec.files import default_prompts

            prompts = default_prompts(args.limit)
        else:
            from adaptive_spec.files import read_prompts

            prompts = read_prompts(args.prompts, args.limit)
        latency = None
        if args.profile:
            from adaptive_spec.planner import LatencyModel

            latency = LatencyModel.load(args.profile)
    except (ValueError, FileNotFoundError) as err:
        raise SystemExit(f"collect: {err}") from None

    settings = {"collect": _settings(args, prompts, planner, temperatures)}
    logger = FeatureLogger(
        args.out,
        shard_size=args.shard_size,
        hidden=args.hidden,
        run_id=args.run_id,
        manifest_extra=settings,
        flush_each_generation=False,
    )
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    try:
        engine = SpecEngine.from_pretrained(
            args.target, args.draft, device=device, dtype=args.dtype, feature_log=logger, latency_model=latency
        )
    except ValueError as err:  # e.g. the directory holds a log of other models
        raise SystemExit(f"collect: {err}") from None
    if args.draft_data:
        from adaptive_spec.engine.draft_data import log_draft_data

        try:
            log_draft_data(engine, args.draft_data, manifest_extra=settings)
        except ValueError as err:
            raise SystemExit(f"collect: {err}") from None
    if args.node_log:
        from adaptive_spec.formats.nodes import NodeLogger

        engine.node_log = NodeLogger(args.node_log)
    with engine:
        summary = collect(
            engine,
            prompts,
            planner,
            temperatures,
            max_new_tokens=args.max_new_tokens,
            repeats=args.repeats,
            seed=args.seed,
            top_k=args.top_k,
            top_p=args.top_p,
            progress=not args.no_progress,
        )
    if engine.node_log is not None:
        engine.node_log.close()
        print(f"node log: {engine.node_log.rows} drafted nodes -> {args.node_log}")
    _print_summary(summary, logger, args.out)
    return 0
