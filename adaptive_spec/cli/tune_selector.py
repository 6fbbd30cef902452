"""``adaptive-spec tune selector``: search the selector's hyper-parameters, pruning on ``val/agg_rel_tps``.

Examples::

    adaptive-spec tune selector --labels runs/labels --n-trials 30 --max-epochs 20
    # a second worker on the same study
    adaptive-spec tune selector --labels runs/labels --n-trials 30 --worker 1

The best hyper-parameters land in ``<report>/best-selector.yaml``, a LightningCLI config for
``adaptive-spec selector train --config configs/selector/default.yaml --config <that file>``.
"""

from __future__ import annotations

import argparse

from adaptive_spec.options import add_progress_option


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the ``tune selector`` options."""
    from adaptive_spec.tuning.storage import DEFAULT_STORAGE, add_heartbeat_arguments

    parser.add_argument("--labels", required=True, help="label table directory or file (adaptive-spec label)")
    parser.add_argument(
        "--storage",
        default=DEFAULT_STORAGE,
        help="SQLAlchemy URL of the study storage (default: %(default)s, relative to the working directory)",
    )
    parser.add_argument("--study", default="selector", help="study name (default: %(default)s)")
    parser.add_argument("--n-trials", type=int, default=20, help="trials for this worker (default: %(default)s)")
    parser.add_argument("--timeout", type=float, default=None, help="seconds for this worker at most")
    parser.add_argument("--max-epochs", type=int, default=20, help="epochs per trial (default: %(default)s)")
    parser.add_argument(
        "--val-fraction",
        type=float,
        default=0.2,
        help="share of prompts held out for validation (default: %(default)s)",
    )
    parser.add_argument("--split-seed", type=int, default=0, help="seed of the prompt split (default: %(default)s)")
    parser.add_argument("--batch-size", type=int, default=256, help="rows per batch (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=0, help="weight-init and sampler seed (default: %(default)s)")
    parser.add_argument(
        "--worker",
        type=int,
        default=0,
        help="index of this worker; give parallel workers distinct indices (default: %(default)s)",
    )
    parser.add_argument("--accelerator", default="auto", help="Lightning accelerator (default: %(default)s)")
    parser.add_argument(
        "--pruner-startup-trials",
        type=int,
        default=3,
        help="complete trials before pruning starts (default: %(default)s)",
    )
    parser.add_argument(
        "--pruner-warmup-epochs", type=int, default=2, help="epochs never pruned in any trial (default: %(default)s)"
    )
    add_heartbeat_arguments(parser)
    parser.add_argument("--no-enqueue", action="store_true", help="do not enqueue the default hyper-parameters")
    parser.add_argument("--report", default=None, help="report folder (default: <storage folder>/reports/<study>)")
    parser.add_argument("--no-report", action="store_true", help="write neither the report nor best-selector.yaml")
    add_progress_option(parser)


def run(args: argparse.Namespace) -> int:
    """Run the study; return the exit status."""
    from adaptive_spec.tuning.selector import SelectorTuningConfig, tune_selector

    try:
        cfg = SelectorTuningConfig(
            labels=args.labels,
            storage=args.storage,
            study=args.study,
            n_trials=args.n_trials,
            timeout=args.timeout,
            max_epochs=args.max_epochs,
            val_fraction=args.val_fraction,
            split_seed=args.split_seed,
            batch_size=args.batch_size,
            seed=args.seed,
            worker=args.worker,
            accelerator=args.accelerator,
            pruner_startup_trials=args.pruner_startup_trials,
            pruner_warmup_epochs=args.pruner_warmup_epochs,
            heartbeat_interval=args.heartbeat_interval,
            grace_period=args.grace_period,
            enqueue=not args.no_enqueue,
            report=args.report,
            write_report=not args.no_report,
            progress=not args.no_progress,
        )
        tune_selector(cfg)
    except (ValueError, FileNotFoundError) as err:
        raise SystemExit(f"tune selector: {err}") from None
    return 0
