"""``adaptive-spec zoo drafts NAME``: train a real target's EAGLE-style head and standalone draft.

One command reproduces the committed drafts of ``smollm2`` (:func:`adaptive_spec.zoo.drafts.build_drafts`):
self-generated conversations, a teacher-forced feature pass, the draft vocabulary, the head, the
standalone draft, and held-out agreement figures, recorded with the data, tokens, time and machine
load in ``build_info.json``. Every stage resumes where a stopped run left it.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from adaptive_spec.options import add_progress_option


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the ``zoo drafts`` options."""
    parser.add_argument("name", nargs="?", default="smollm2", help="the target's short name (default: smollm2)")
    parser.add_argument(
        "--shards",
        type=int,
        default=40,
        help="conversation shards to generate (96 requests each; every 10th is held out) (default: %(default)s)",
    )
    parser.add_argument("--head-minutes", type=float, default=20.0, help="head training budget (default: %(default)s)")
    parser.add_argument(
        "--draft-minutes", type=float, default=12.0, help="standalone draft training budget (default: %(default)s)"
    )
    parser.add_argument("--vocab", type=int, default=8192, help="draft vocabulary size (default: %(default)s)")
    parser.add_argument(
        "--work", type=Path, default=None, help="data and checkpoints (default: distill/NAME in the user data folder)"
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="folder for eagle/, draft/ and build_info.json (default: the package's zoo/NAME, the committed copy)",
    )
    parser.add_argument("--seed", type=int, default=0, help="(default: %(default)s)")
    add_progress_option(parser)


def run(args: argparse.Namespace) -> int:
    """Build the drafts; print the held-out figures; return the exit status."""
    from adaptive_spec.zoo.drafts import build_drafts

    info = build_drafts(
        args.name,
        work=args.work,
        out=args.out,
        shards=args.shards,
        head_minutes=args.head_minutes,
        draft_minutes=args.draft_minutes,
        vocab_size=args.vocab,
        seed=args.seed,
        progress=not args.no_progress,
    )
    print(json.dumps(info["held_out"], indent=2))
    return 0
