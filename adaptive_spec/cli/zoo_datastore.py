"""``adaptive-spec zoo datastore NAME``: the corpus a real target's ``lookup:WxL+K/nss`` plans draft from.

The target answers requests greedily (self-written ones and, every other shard, public prompts; never a
benchmark's or the demo's), and the answers become a datastore (:func:`adaptive_spec.zoo.datastore.build_datastore`)
written where ``SpecEngine.from_pretrained(NAME)`` loads it. Generation resumes where a stopped run left it.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from adaptive_spec.options import add_progress_option


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the ``zoo datastore`` options."""
    parser.add_argument("name", nargs="?", default="smollm2", help="the target's short name (default: smollm2)")
    parser.add_argument(
        "--shards", type=int, default=24, help="conversation shards of --batch requests each (default: %(default)s)"
    )
    parser.add_argument("--batch", type=int, default=48, help="conversations per shard (default: %(default)s)")
    parser.add_argument(
        "--answer-tokens", type=int, default=256, help="most tokens of each answer (default: %(default)s)"
    )
    parser.add_argument(
        "--prompts",
        action="append",
        default=None,
        metavar="FILE",
        help="JSONL prompts whose requests make every other shard (Spec-Bench and demo prompts dropped); "
        "repeatable; 'self-instruct' (the shipped set) by default; 'none' for self-written requests only",
    )
    parser.add_argument(
        "--repeat-prompts",
        action="store_true",
        help="once the prompt sets are used up, start them again (their greedy answers repeat and are dropped; "
        "the committed file was built so); by default the later prompt shards are self-written",
    )
    parser.add_argument(
        "--extend",
        action="store_true",
        help="grow the datastore at --out: keep its texts and add the shards after those it holds, up to --shards",
    )
    parser.add_argument(
        "--work", type=Path, default=None, help="the conversations (default: datastore/NAME in the user data folder)"
    )
    parser.add_argument(
        "--out", type=Path, default=None, help="the datastore file (default: the package's zoo/NAME/datastore.npz)"
    )
    parser.add_argument("--minutes", type=float, default=None, help="no new shard after this long (default: none)")
    parser.add_argument("--device", default="cpu", help="where the target generates (default: %(default)s)")
    add_progress_option(parser)


def run(args: argparse.Namespace) -> int:
    """Generate the conversations (resuming), write the datastore, print its record."""
    from adaptive_spec.cli.zoo_drafts import prompt_files
    from adaptive_spec.zoo.datastore import build_datastore

    for flag, value in (("--shards", args.shards), ("--batch", args.batch), ("--answer-tokens", args.answer_tokens)):
        if value < 1:
            raise SystemExit(f"zoo datastore: {flag} must be at least 1, got {value}")
    try:
        info = build_datastore(
            args.name,
            work=args.work,
            out=args.out,
            shards=args.shards,
            batch=args.batch,
            answer_tokens=args.answer_tokens,
            prompt_files=prompt_files(args.prompts),
            minutes=args.minutes,
            device=args.device,
            progress=not args.no_progress,
            repeat_prompts=args.repeat_prompts,
            extend=args.extend,
        )
    except (ValueError, FileNotFoundError) as err:
        raise SystemExit(f"zoo datastore: {err}") from None
    print(json.dumps(info, indent=2))
    return 0
