"""``adaptive-spec label LOGDIR``: label a feature log for every action (E[τ+1] and predicted step time).

Writes ``OUT/labels.parquet`` and the report folder ``OUT/label_report/`` (``--out`` default: the
log directory itself). The labelling is :func:`adaptive_spec.records.label.label_directory`; the
labeller is :mod:`adaptive_spec.records.labeller`.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from adaptive_spec.options import add_model_options, add_out_dir_option, add_progress_option, out_file
from adaptive_spec.planner.latency import default_profile_path

LABELS_NAME = "labels.parquet"  # the label file in --out


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the ``label`` options."""
    parser.add_argument("log_dir", type=Path, help="feature log directory (written by `adaptive-spec collect`)")
    parser.add_argument("--every", type=int, default=4, help="label roots whose step is a multiple of k (default: 4)")
    parser.add_argument("--samples", type=int, default=4, help="draft trees per root and family (default: 4)")
    parser.add_argument("--max-contexts", type=int, default=None, help="label at most this many roots")
    parser.add_argument("--actions", type=Path, default=None, help="action-space YAML (default: the built-in grid)")
    parser.add_argument(
        "--profile",
        type=Path,
        default=None,
        help=f"latency profile JSON (default: {default_profile_path()}; see `adaptive-spec profile`)",
    )
    add_model_options(parser, pair_default="the log's, else the built-in pair", dtype_default="float32 on CPU")
    parser.add_argument("--seed", type=int, default=0, help="seed of the tree draws (default: 0)")
    add_out_dir_option(parser, f"{LABELS_NAME} and the report folder label_report/", default_text="the log directory")
    parser.add_argument("--report", type=Path, default=None, help="report folder (default: OUT/label_report)")
    parser.add_argument(
        "--strict", action="store_true", help="refuse a log with a torn shard (default: skip it with a warning)"
    )
    add_progress_option(parser)


def run(args: argparse.Namespace) -> int:
    """Label the log into ``OUT/labels.parquet``, write the report, print the oracle gain."""
    from adaptive_spec.records.label import LabelConfig, label_log, write_report

    out = Path(args.log_dir if args.out is None else args.out)
    label_path = out_file(out, LABELS_NAME)
    config = LabelConfig(every=args.every, samples=args.samples, seed=args.seed, max_contexts=args.max_contexts)
    table, path = label_log(
        args.log_dir,
        config,
        target=args.target,
        draft=args.draft,
        device=args.device,
        dtype=args.dtype,
        actions=args.actions,
        profile=args.profile,
        out=label_path,
        progress=not args.no_progress,
        strict=args.strict,
    )
    report_dir = args.report or out / "label_report"
    rep = write_report(table, report_dir)
    print(f"labelled {len(table)} roots x {len(table.actions)} actions -> {path}")
    for t, d in rep["per_temperature"].items():
        print(
            f"T={t}: best static {d['best_static']} ({d['best_static_tokens_per_s']:.1f} tok/s predicted), "
            f"oracle {d['oracle_tokens_per_s']:.1f} tok/s, oracle gain {d['oracle_gain']:.3f}, "
            f"{d['distinct_best_actions']} distinct best actions over {d['roots']} roots"
        )
    print(f"report: {report_dir / 'report.md'}")
    return 0
