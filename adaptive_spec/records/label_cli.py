"""``adaptive-spec label DIR``: label a feature log for every action (E[τ+1] and predicted step time)."""

from __future__ import annotations

import argparse
from pathlib import Path

from adaptive_spec.options import add_model_options, add_progress_option
from adaptive_spec.planner.latency import default_profile_path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the ``label`` options."""
    parser.add_argument("log_dir", type=Path, help="feature log directory (written by `adaptive-spec collect`)")
    parser.add_argument("--every", type=int, default=4, help="label roots whose step is a multiple of k (default: 4)")
    parser.add_argument("--samples", type=int, default=4, help="draft trees per root and family (default: 4)")
    parser.add_argument("--max-contexts", type=int, default=None, help="label at most this many roots")
    parser.add_argument("--actions", type=Path, default=None, help="action-space YAML (default: the built-in grid)")
    parser.add_argument(
        "--profile", type=Path, default=None,
        help=f"latency profile JSON (default: {default_profile_path()}; see `adaptive-spec profile`)",
    )  # fmt: skip
    add_model_options(parser, pair_default="the log's, else the built-in pair", dtype_default="float32 on CPU")
    parser.add_argument("--seed", type=int, default=0, help="seed of the tree draws (default: 0)")
    parser.add_argument("--out", type=Path, default=None, help="label file (default: DIR/labels.parquet)")
    parser.add_argument("--report", type=Path, default=None, help="report folder (default: DIR/label_report)")
    add_progress_option(parser)


def _models(args: argparse.Namespace, manifest: dict) -> tuple[str | None, str | None]:
    """The models to label with: explicit, else the log's last run's (if they are local folders), else built-in."""
    if args.target or args.draft:
        if not (args.target and args.draft):
            raise ValueError("give both --target and --draft, or neither")
        return args.target, args.draft
    runs = manifest.get("runs") or []
    if runs:
        target, draft = runs[-1].get("target"), runs[-1].get("draft")
        if target and draft and Path(target).is_dir() and Path(draft).is_dir():
            return target, draft
    return None, None


def run(args: argparse.Namespace) -> int:
    """Label the log, write the label file and the report, print the oracle gain."""
    from adaptive_spec.engine import SpecEngine
    from adaptive_spec.formats.feature_log import _differences, _json_normal, read_manifest
    from adaptive_spec.planner.actions import ActionSpace
    from adaptive_spec.planner.latency import LatencyModel
    from adaptive_spec.records.label import LabelConfig, Labeller, label_directory, write_report

    manifest = read_manifest(args.log_dir)
    target, draft = _models(args, manifest)
    logged = manifest.get("models")
    dtype = args.dtype or (logged or {}).get("target", {}).get("dtype")  # label in the dtype that was logged
    engine = SpecEngine.from_pretrained(target, draft, device=args.device, dtype=dtype)
    if logged is not None and _json_normal(engine.describe()["models"]) != logged:
        diff = "; ".join(_differences(logged, _json_normal(engine.describe()["models"]))[:5])
        raise ValueError(
            f"{args.log_dir} was logged with other models than the ones loaded for labelling ({diff}); pass the "
            "log's models with --target/--draft (labels must use the models that produced the features)"
        )
    space = ActionSpace.from_yaml(args.actions) if args.actions else ActionSpace.default()
    latency = LatencyModel.load(args.profile)
    config = LabelConfig(every=args.every, samples=args.samples, seed=args.seed, max_contexts=args.max_contexts)
    labeller = Labeller(engine.target, engine.draft, list(space), latency, engine.vocab_size, config)
    table, path = label_directory(args.log_dir, labeller, out=args.out, progress=not args.no_progress)
    report_dir = args.report or args.log_dir / "label_report"
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
