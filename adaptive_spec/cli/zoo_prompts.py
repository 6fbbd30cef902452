"""``adaptive-spec zoo prompts SPLIT --out DIR``: a prompt set of the pair's corpus split, as ``DIR/SPLIT.jsonl``.

The file is named after the split (``train.jsonl`` or ``heldout2.jsonl``).

The prompts are :func:`adaptive_spec.zoo.prompt_sets.prompt_set`.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from adaptive_spec.files import atomic_write
from adaptive_spec.options import out_file
from adaptive_spec.zoo.prompt_sets import SPLITS, prompt_set


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the ``zoo prompts`` options."""
    parser.add_argument("split", choices=SPLITS, help="train: for tuning; heldout2: a second held-out set")
    parser.add_argument("--count", type=int, default=40, help="number of prompts (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=1, help="which prompts (default: %(default)s)")
    parser.add_argument(
        "--out",
        type=Path,
        required=True,
        metavar="DIR",
        help="folder to write SPLIT.jsonl into (train.jsonl or heldout2.jsonl), created if missing",
    )


def run(args: argparse.Namespace) -> int:
    """Write the prompt set to ``OUT/SPLIT.jsonl``; return the exit status."""
    try:
        prompts = prompt_set(args.split, args.count, args.seed)
    except (ValueError, FileNotFoundError) as err:
        raise SystemExit(f"zoo prompts: {err}") from None
    path = out_file(args.out, f"{args.split}.jsonl")
    atomic_write(path, "".join(json.dumps({"prompt": p}) + "\n" for p in prompts))
    print(f"wrote {len(prompts)} {args.split} prompts to {path}")
    return 0
