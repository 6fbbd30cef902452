"""``adaptive-spec bench verifiers``: block efficiency vs the LP limit per verifier, or verification speed.

The rows are :func:`adaptive_spec.bench.verifiers.quality_rows` and :func:`~adaptive_spec.bench.verifiers.speed_rows`.
"""

from __future__ import annotations

import argparse
import json

import torch

from adaptive_spec.bench.verifiers import SPEED_SHAPES, quality_rows, speed_rows
from adaptive_spec.options import add_json_option, add_model_options, add_progress_option
from adaptive_spec.trees import TreeShape


def _print_table(rows: list[dict], columns: list[str]) -> None:
    def fmt(v: object) -> str:
        return f"{v:.4f}" if isinstance(v, float) else str(v)

    widths = [max(len(c), *(len(fmt(r[c])) for r in rows)) for c in columns]
    print("  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)))
    for r in rows:
        print("  ".join(fmt(r[c]).ljust(w) for c, w in zip(columns, widths, strict=True)))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the ``bench verifiers`` options."""
    add_json_option(parser, "the rows")
    parser.add_argument("--speed", action="store_true", help="time verifications at V = 32k and 128k instead")
    add_model_options(parser, ("device",))
    parser.add_argument("--repeats", type=int, default=30, help="timed verifications per cell (--speed)")
    parser.add_argument("--quick", action="store_true", help="--speed at V = 32k only, 10 repeats")
    parser.add_argument("--families", default=None, help="comma-separated instance families (default: all)")
    parser.add_argument("--shapes", default=None, help="comma-separated tree shapes, e.g. chain:2,iid:2x2")
    parser.add_argument("--vocabs", default=None, help="comma-separated vocabulary sizes for --speed")
    parser.add_argument("--nodes", default=None, help="comma-separated tree sizes for --speed, from 8,32,64")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    add_progress_option(parser)


def run(args: argparse.Namespace) -> int:
    """Print (with --json, write) block efficiency vs the LP limit, or microseconds per verification."""
    progress = not args.no_progress
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.speed:
        device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
        vocabs = (32_000,) if args.quick else (32_000, 128_000)
        if args.vocabs:
            vocabs = tuple(int(v) for v in args.vocabs.split(","))
        nodes = tuple(int(n) for n in args.nodes.split(",")) if args.nodes else (8, 32, 64)
        bad = set(nodes) - set(SPEED_SHAPES["chain"])
        if bad:
            raise SystemExit(f"--nodes must be among 8, 32, 64 (got {sorted(bad)})")
        repeats = 10 if args.quick else args.repeats
        rows = speed_rows(device, vocabs=vocabs, nodes=nodes, repeats=repeats, progress=progress)
        _print_table(rows, ["verifier", "vocab", "nodes", "shape", "us_per_verify", "mean_accepted"])
        if device.type == "cpu":
            print(f"(CPU, {torch.get_num_threads()} threads)")
    else:
        shapes = [TreeShape.parse(t) for t in args.shapes.split(",")] if args.shapes else None
        fams = args.families.split(",") if args.families else None
        rows = quality_rows(progress=progress, family_names=fams, shapes=shapes)
        _print_table(rows, ["family", "shape", "verifier", "block_efficiency", "lp_limit", "ratio"])
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"rows": rows}, indent=2))
        print(f"wrote {args.json}")
    return 0
