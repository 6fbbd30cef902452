"""``adaptive-spec selector train``: train the plan selector with LightningCLI, print the validation scores.

The training is :func:`adaptive_spec.selector.train.main`.
"""

from __future__ import annotations

import argparse

from adaptive_spec.selector.train import main, shipped_configs


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Forward everything after ``selector train`` to LightningCLI (``--help`` shows its options)."""
    # No option of this parser starts with '\0', so every argument, '--config' and '--help' included,
    # is a positional string collected by the REMAINDER below and handed to LightningCLI untouched.
    parser.prefix_chars = "\0"
    parser.add_argument("cli_args", nargs=argparse.REMAINDER, help="LightningCLI arguments, e.g. --config FILE")


def run(args: argparse.Namespace) -> int:
    """Train and report; return the exit status."""
    report = main(shipped_configs(list(args.cli_args)))
    if report is not None:
        shown = ", ".join(f"{k} {v['agg_rel_tps']:.4f}" for k, v in report["scores"].items())
        print(f"val tokens/s relative to the best static action (ratio of sums): {shown}")
        for g, sc in report["groups"].items():
            play = "static" if g in report["static_groups"] else "network"
            r2 = f", R² {sc['static_be_r2']:.2f}" if "static_be_r2" in sc else ""
            q = sc["agg_rel_tps_quantile"]
            print(
                f"  {g}: network {sc['agg_rel_tps']:.4f} (bootstrap q {q:.4f}), oracle {sc['oracle_agg_rel_tps']:.4f}"
                f"{r2} -> plays {play}"
            )
        print(f"report: {report['files']['markdown']}")
    return 0
