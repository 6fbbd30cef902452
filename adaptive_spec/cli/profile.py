"""``adaptive-spec profile``: measure a pair's latency profile into a folder (``profile.json`` and its plot).

The measurements are :func:`adaptive_spec.bench.profile.measure_profile`.
"""

from __future__ import annotations

import argparse

from adaptive_spec.bench.profile import (
    CALIBRATION_PLANS,
    DEFAULT_CONTEXTS,
    DEFAULT_TOKENS,
    measure_profile,
    plot_profile,
    print_summary,
)
from adaptive_spec.files import write_json_atomic
from adaptive_spec.options import add_model_options, add_out_dir_option, add_progress_option, out_file
from adaptive_spec.planner.latency import default_profile_path

PROFILE_NAME = default_profile_path().name  # the file in --out: profile.json


def _int_list(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values:
        raise argparse.ArgumentTypeError("expected at least one integer")
    return values


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the ``profile`` options."""
    add_model_options(parser, dtype_default="the engine's")
    add_out_dir_option(parser, f"{PROFILE_NAME} and its plot profile.png", default_profile_path().parent)
    parser.add_argument(
        "--contexts", type=_int_list, default=list(DEFAULT_CONTEXTS), help="KV-cache lengths (default: 32,128,256,512)"
    )
    parser.add_argument(
        "--tokens", type=_int_list, default=list(DEFAULT_TOKENS), help="tokens per forward (default: 1,2,4,...,64)"
    )
    parser.add_argument("--warmup", type=int, default=3, help="untimed calls per grid point (default: %(default)s)")
    parser.add_argument("--repeats", type=int, default=10, help="timed calls per grid point (default: %(default)s)")
    parser.add_argument(
        "--calibration-plans", default=CALIBRATION_PLANS, help="plans for the bookkeeping fit; '' skips it"
    )
    parser.add_argument(
        "--calibration-tokens", type=int, default=48, help="new tokens per calibration run (default: %(default)s)"
    )
    parser.add_argument(
        "--verify-trees", type=int, default=3, help="sampled trees per shape for the verifiers (default: %(default)s)"
    )
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    parser.add_argument("--seed", type=int, default=0, help="(default: %(default)s)")
    parser.add_argument(
        "--row-major-too",
        action="store_true",
        help="also time copies of the target with all its Linear weights in the stock row-major order and all "
        "column-major, interleaved (target_row_major_ms, target_column_major_ms), and show the order this host's "
        "calibration chose for the engine (ADAPTIVE_SPEC_WEIGHT_ORDER)",
    )
    parser.add_argument("--no-plot", action="store_true", help="skip the PNG next to the JSON")
    add_progress_option(parser)


def run(args: argparse.Namespace) -> int:
    """Measure the profile, write ``OUT/profile.json`` and its plot, print a summary; return the exit status."""
    import torch

    from adaptive_spec.engine.load import load_engine
    from adaptive_spec.planner.actions import parse_plans

    if args.threads:
        torch.set_num_threads(args.threads)
    if args.repeats < 1 or args.warmup < 0 or args.verify_trees < 1:
        raise SystemExit("--repeats and --verify-trees must be >= 1, --warmup >= 0")
    try:
        plans = parse_plans(args.calibration_plans)
    except ValueError as err:
        raise SystemExit(f"--calibration-plans: {err}") from None
    path = out_file(args.out, PROFILE_NAME)  # a wrong --out fails before the measurement, not after
    engine = load_engine(args.target, args.draft, args.device, args.dtype)
    labels = {"target": args.target or "built-in pair (target)", "draft": args.draft or "built-in pair (draft)"}
    try:
        profile = measure_profile(
            engine,
            args.contexts,
            args.tokens,
            args.warmup,
            args.repeats,
            plans,
            calibration_tokens=args.calibration_tokens,
            seed=args.seed,
            progress=not args.no_progress,
            models=labels,
            verify_trees=args.verify_trees,
            row_major_too=args.row_major_too,
        )
    except ValueError as err:
        raise SystemExit(f"profile: {err}") from None
    write_json_atomic(profile, path)
    print(f"wrote {path}")
    if not args.no_plot:
        from adaptive_spec.extras import have, skipped

        if have("matplotlib"):
            print(f"wrote {plot_profile(profile, path.with_suffix('.png'))}")
        else:
            skipped("matplotlib", "the profile's plot")
    print_summary(profile)
    return 0
