"""``adaptive-spec tune plans``: search the static plan (shape, sizes, verifier) per temperature with Optuna.

Examples::

    # 12 trials per temperature on the built-in pair, sqlite storage under data/tuning/
    adaptive-spec tune plans --n-trials 12 --temperatures 0,1 --num-prompts 4 --max-new-tokens 64

    # two workers on one study (a second shell, or a second machine sharing a PostgreSQL server)
    adaptive-spec tune plans --storage postgresql+psycopg2://me@db/optuna --study plans --worker 0 &
    adaptive-spec tune plans --storage postgresql+psycopg2://me@db/optuna --study plans --worker 1

    # predicted tokens/s from a label table instead of measuring
    adaptive-spec tune plans --objective predicted --labels data/labels --n-trials 200

Paths are relative to the working directory: run from the repository root, or pass
``--config-out`` (folder holding ``plans/best-static.yaml``), ``--storage`` and ``--report``.
"""

from __future__ import annotations

import argparse

from adaptive_spec.options import add_model_options, add_progress_option
from adaptive_spec.temperatures import parse_temperatures


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the ``tune plans`` options."""
    from adaptive_spec.tuning.storage import DEFAULT_STORAGE, add_heartbeat_arguments

    parser.add_argument(
        "--storage",
        default=DEFAULT_STORAGE,
        help="SQLAlchemy URL of the study storage (default: %(default)s, relative to the working directory)",
    )
    parser.add_argument(
        "--study", default="plans", help="study name; temperature T uses '<study>-T<T>' (default: %(default)s)"
    )
    parser.add_argument(
        "--n-trials",
        type=int,
        default=20,
        help="trials per temperature for this worker, enqueued known-good plans included (default: %(default)s)",
    )
    parser.add_argument("--timeout", type=float, default=None, help="seconds per temperature at most")
    parser.add_argument(
        "--temperatures",
        dest="temperature",
        type=parse_temperatures,
        default=[0.0, 1.0],
        help="comma-separated sampling temperatures to tune, one study each (default: 0,1)",
    )
    # the older spelling, `--temperature 0 1`, still accepted
    parser.add_argument("--temperature", type=float, nargs="+", help=argparse.SUPPRESS)
    parser.add_argument(
        "--objective",
        choices=("measured", "predicted"),
        default="measured",
        help="measured engine tokens/s, or predicted from --labels (default: %(default)s)",
    )
    parser.add_argument("--labels", default=None, help="label table directory or file (--objective predicted)")
    add_model_options(parser)
    parser.add_argument("--prompts", default=None, help="JSON Lines prompt file (default: built-in prompts)")
    parser.add_argument("--num-prompts", type=int, default=4, help="prompts per trial (default: %(default)s)")
    parser.add_argument("--max-new-tokens", type=int, default=64, help="tokens per prompt (default: %(default)s)")
    parser.add_argument(
        "--repeats",
        type=int,
        default=3,
        help="passes over the prompts; the objective is their median (default: %(default)s)",
    )
    parser.add_argument("--seed", type=int, default=0, help="generation and sampler seed (default: %(default)s)")
    parser.add_argument(
        "--worker",
        type=int,
        default=0,
        help="index of this worker; give parallel workers "
        "distinct indices, which seed their samplers differently (default: %(default)s)",
    )
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    add_heartbeat_arguments(parser)
    parser.add_argument(
        "--no-enqueue", action="store_true", help="do not enqueue the known-good plans (worker 0 enqueues them)"
    )
    parser.add_argument(
        "--finalists",
        type=int,
        default=3,
        help="the study's best plans re-measured against the "
        "defaults at the end, by the last worker of the study to finish; the fastest is written "
        "(default: %(default)s)",
    )
    parser.add_argument(
        "--no-compare",
        action="store_true",
        help="skip that final measurement: write the plan with the best median over the study's trials",
    )
    parser.add_argument(
        "--config-out", default=None, help="configs folder receiving plans/best-static.yaml (default: ./configs)"
    )
    parser.add_argument("--no-write-config", action="store_true", help="do not write best-static.yaml")
    parser.add_argument("--report", default=None, help="report folder (default: <storage folder>/reports/<study>)")
    parser.add_argument("--no-report", action="store_true", help="do not write the report")
    add_progress_option(parser)


def run(args: argparse.Namespace) -> int:
    """Run the studies; return the exit status."""
    from adaptive_spec.tuning.plans import PlanTuningConfig, tune_plans

    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    try:
        cfg = PlanTuningConfig(
            storage=args.storage,
            study=args.study,
            n_trials=args.n_trials,
            timeout=args.timeout,
            temperatures=tuple(args.temperature),
            objective=args.objective,
            labels=args.labels,
            target=args.target,
            draft=args.draft,
            device=args.device,
            dtype=args.dtype,
            prompts=args.prompts,
            num_prompts=args.num_prompts,
            max_new_tokens=args.max_new_tokens,
            repeats=args.repeats,
            seed=args.seed,
            worker=args.worker,
            heartbeat_interval=args.heartbeat_interval,
            grace_period=args.grace_period,
            enqueue=not args.no_enqueue,
            compare=not args.no_compare,
            finalists=args.finalists,
            config_out=args.config_out,
            write_config=not args.no_write_config,
            report=args.report,
            write_report=not args.no_report,
            progress=not args.no_progress,
        )
        tune_plans(cfg)
    except (ValueError, FileNotFoundError) as err:
        raise SystemExit(f"tune plans: {err}") from None
    return 0
