"""``adaptive-spec tune stamp FILE``: record a model pair's fingerprints in a tuned plan file.

The stamp is :func:`adaptive_spec.engine.fingerprint.stamp_plan_file`.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from adaptive_spec.engine.fingerprint import stamp_plan_file
from adaptive_spec.options import add_model_options


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the ``tune stamp`` options."""
    parser.add_argument("file", type=Path, help="the plan file to stamp, e.g. configs/plans/in-draft.yaml")
    add_model_options(parser, ("target", "draft"))


def run(args: argparse.Namespace) -> int:
    """``adaptive-spec tune stamp FILE``: write the pair's fingerprints into a tuned plan file."""
    from adaptive_spec.engine.engine import SpecEngine

    if not args.file.is_file():
        raise SystemExit(f"tune stamp: no such file {args.file}")
    engine = SpecEngine.from_pretrained(args.target, args.draft)
    fps = engine.fingerprints()
    try:
        stamp_plan_file(args.file, fps)
    except ValueError as err:
        raise SystemExit(f"tune stamp: {err}") from None
    print(f"{args.file}: models target={fps['target']} draft={fps['draft']}")
    return 0
