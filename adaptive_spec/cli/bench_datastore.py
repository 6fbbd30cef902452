"""``adaptive-spec bench datastore``: lookup plans' block efficiency at T = 0 by datastore size (options, printing).

The measurement is :func:`adaptive_spec.bench.datastore.datastore_curve`.
"""

from __future__ import annotations

import argparse

from adaptive_spec.options import (
    add_datastore_option,
    add_json_option,
    add_limit_option,
    add_model_options,
    add_progress_option,
    datastore_kwargs,
)

DEFAULT_PLANS = "lookup:3x8/nss,lookup:3x8+2/nss,lookup:3x8+4/nss,lookup:0x8+2/nss"


def _fractions(text: str) -> list[float]:
    try:
        out = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated fractions, got {text!r}") from None
    if not out or any(not 0 < f <= 1 for f in out):
        raise argparse.ArgumentTypeError(f"fractions of the datastore are in (0, 1], got {text!r}")
    return out


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the ``bench datastore`` options."""
    add_model_options(parser, ("target", "draft"), pair_default="smollm2 and its head")
    parser.add_argument(
        "--prompts",
        default=None,
        help="JSON Lines or .txt prompts (default: the target's demo prompts, zoo/NAME/prompts.jsonl, for a fetched "
        "--target; else the built-in prompts)",
    )
    parser.add_argument("--plans", default=DEFAULT_PLANS, help="comma-separated lookup plans (default: %(default)s)")
    parser.add_argument(
        "--fractions",
        type=_fractions,
        default="0.125,0.25,0.5,1",
        help="shares of the datastore's texts, each a random sample (default: %(default)s)",
    )
    parser.add_argument(
        "--max-new-tokens", type=int, default=128, help="greedy tokens per prompt (default: %(default)s)"
    )
    add_limit_option(parser)
    parser.add_argument(
        "--samples", type=int, default=3, help="random samples of each share below 1 (default: %(default)s)"
    )
    parser.add_argument("--seed", type=int, default=0, help="the first sample's seed (default: %(default)s)")
    add_model_options(parser, ("device", "dtype"))
    add_datastore_option(parser)
    add_json_option(parser, "the curve")
    parser.add_argument("--plot", default=None, metavar="PATH", help="also draw the curve to a PNG (needs matplotlib)")
    add_progress_option(parser)


def _prompts(args: argparse.Namespace, target: str) -> list:
    from adaptive_spec.engine.models import MODELS, shipped_drafts_dir
    from adaptive_spec.files import default_prompts, read_prompts

    try:
        if args.prompts is not None:
            return read_prompts(args.prompts, args.limit)
        if target in MODELS and (shipped_drafts_dir(target) / "prompts.jsonl").is_file():
            return read_prompts(shipped_drafts_dir(target) / "prompts.jsonl", args.limit)
        return default_prompts(args.limit)
    except (FileNotFoundError, ValueError) as err:
        raise SystemExit(f"bench datastore: {err}") from None


def run(args: argparse.Namespace) -> int:
    """Decode the greedy answers, replay the plans on each share of the datastore, print a table, write JSON."""
    from adaptive_spec.bench.datastore import datastore_curve, plot_curve
    from adaptive_spec.engine.load import load_engine
    from adaptive_spec.files import write_json_atomic
    from adaptive_spec.planner.plan import as_plan

    if args.max_new_tokens < 1 or args.samples < 1:
        raise SystemExit("bench datastore: --max-new-tokens and --samples must be at least 1")
    try:
        plans = [as_plan(p.strip()) for p in args.plans.split(",") if p.strip()]
    except ValueError as err:
        raise SystemExit(f"bench datastore: {err}") from None
    if not plans or any(p.runs_draft for p in plans):
        raise SystemExit(
            "bench datastore: --plans takes lookup plans without a draft model's path (lookup:L, lookup:WxL, "
            "lookup:WxL+K): it replays them without running a model"
        )
    target = args.target or "smollm2"
    prompts = _prompts(args, target)  # before the models load: a bad file is reported at once
    engine = load_engine(target, args.draft, args.device, args.dtype, **datastore_kwargs(args.datastore))
    try:
        res = datastore_curve(
            engine,
            prompts,
            plans,
            args.fractions,
            max_new_tokens=args.max_new_tokens,
            seed=args.seed,
            samples=args.samples,
            progress=not args.no_progress,
        )
    except ValueError as err:
        raise SystemExit(f"bench datastore: {err}") from None
    res = {"config": {"target": target, "prompts": str(args.prompts or "demo prompts"), "plans": args.plans}, **res}
    print(
        f"\ntemperature 0, {res['prompts']} prompts, {res['answer_tokens']} greedy tokens; "
        f"datastore {res['datastore']['tokens']} tokens in {res['datastore']['texts']} texts"
    )
    print(f"{'plan':<24} {'share':>6} {'tokens':>9} {'BE':>6} {'range':>13} {'nodes':>6}")
    for r in res["rows"]:
        share = "-" if r["fraction"] is None else f"{r['fraction']:g}"
        be = r.get("block_efficiency_samples") or [r["block_efficiency"]]
        spread = f"{min(be):.3f}-{max(be):.3f}" if len(be) > 1 else ""
        print(
            f"{r['plan']:<24} {share:>6} {r['datastore_tokens']:>9.0f} {r['block_efficiency']:>6.3f} {spread:>13} "
            f"{r['nodes_per_step']:>6.1f}"
        )
    if args.json:
        write_json_atomic(res, args.json)
        print(f"wrote {args.json}")
    if args.plot:
        plot_curve(res, args.plot)
        print(f"wrote {args.plot}")
    return 0
