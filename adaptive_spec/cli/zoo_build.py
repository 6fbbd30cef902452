"""``adaptive-spec zoo build``: train the built-in draft/target pair from a seed.

The build is :func:`adaptive_spec.zoo.build.build_pair`; ``--config`` is read by
:func:`adaptive_spec.zoo.config.load_config`.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from adaptive_spec.options import add_progress_option
from adaptive_spec.zoo.config import DEFAULT_MINUTES, load_config


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the ``zoo build`` options."""
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="output directory (default: pairs/seedN in the user data folder, $ADAPTIVE_SPEC_HOME or "
        "~/.local/share/adaptive-spec; never the package's built-in pair)",
    )
    parser.add_argument(
        "--corpus", type=Path, default=None, help="directory of .py files (default: this Python's standard library)"
    )
    parser.add_argument(
        "--minutes",
        type=float,
        default=DEFAULT_MINUTES,
        help="training budget, split target / draft by ZooConfig.target_share, 85%%/15%% (default: %(default)s)",
    )
    parser.add_argument(
        "--seed", type=int, default=0, help="fixes split, init, data order, prompts (default: %(default)s)"
    )
    parser.add_argument(
        "--config",
        type=Path,
        default=None,
        help="JSON or YAML file of ZooConfig overrides, e.g. configs/zoo/tiny.yaml (default: the built-in recipe)",
    )
    add_progress_option(parser)


def run(args: argparse.Namespace) -> int:
    """Build the pair, print its figures as JSON; return the exit status."""
    from adaptive_spec.files import built_pairs_dir
    from adaptive_spec.zoo.build import build_pair

    out = args.out or built_pairs_dir() / f"seed{args.seed}"
    info = build_pair(
        out,
        corpus=args.corpus,
        minutes=args.minutes,
        seed=args.seed,
        config=load_config(args.config),
        progress=not args.no_progress,
    )
    keys = ("params", "target_val_loss", "draft_val_loss", "acceptance", "greedy_agreement", "latency_ms")
    print(json.dumps({k: info[k] for k in keys}, indent=2))
    print(f"wrote {out}; use it with --target {out / 'target'} --draft {out / 'draft'}")
    return 0
