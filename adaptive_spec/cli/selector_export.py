"""``adaptive-spec selector export CKPT --out DIR``: a selector checkpoint to ``DIR/selector.onnx``.

The export is :func:`adaptive_spec.selector.export.export_checkpoint`.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from adaptive_spec.options import add_out_dir_option, out_file
from adaptive_spec.selector.export import export_checkpoint

ONNX_NAME = "selector.onnx"  # the file in --out
DEFAULT_OUT = Path("data/selector")  # the selector pipeline's folder, where the demo and generate look


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the ``selector export`` options."""
    parser.add_argument("checkpoint", type=Path, help="a SelectorModule checkpoint (.ckpt) from selector train")
    add_out_dir_option(parser, "selector.onnx", DEFAULT_OUT, default_text=f"{DEFAULT_OUT}, where the demo looks")
    parser.add_argument("--check-batch", type=int, default=64, help="rows of the parity check (default: %(default)s)")
    parser.add_argument(
        "--report",
        type=Path,
        default=None,
        help="training report giving the sampling settings played statically (default: the run's report/report.json)",
    )
    parser.add_argument(
        "--no-static-groups",
        action="store_true",
        help="record no static fallback: the network decides at every sampling setting",
    )
    parser.add_argument(
        "--latency-decisions",
        type=int,
        default=2000,
        help="time this many AdaptivePlanner decisions on the written file (0: skip; default: %(default)s)",
    )


def run(args: argparse.Namespace) -> int:
    """Export, print the parity and decision-latency figures; return the exit status."""
    from adaptive_spec.selector.runtime import decision_latency_us

    report = False if args.no_static_groups else args.report
    path = out_file(args.out, ONNX_NAME)
    info = export_checkpoint(args.checkpoint, path, check_batch=args.check_batch, report=report)
    if args.latency_decisions > 0:
        info["decision_latency_us"] = decision_latency_us(path, decisions=args.latency_decisions)
    print(json.dumps(info, indent=2))
    return 0
