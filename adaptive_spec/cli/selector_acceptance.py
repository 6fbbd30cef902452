"""``adaptive-spec selector acceptance``: collect node logs, train, export and calibrate the acceptance model.

The stages are functions of :mod:`adaptive_spec.selector.acceptance`.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path
from typing import Any

from adaptive_spec.options import add_model_options, add_progress_option, add_temperatures_option
from adaptive_spec.planner.acceptance import ACCEPTANCE_FILE, default_acceptance_paths
from adaptive_spec.selector.acceptance import DEFAULT_OUT, collect_nodes, fit_acceptance


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the ``selector acceptance`` options."""
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="working folder (default: %(default)s)")
    add_model_options(parser, ("target", "draft"))
    parser.add_argument(
        "--prompts",
        type=Path,
        default=None,
        help="training prompts (JSONL or .txt; default: `zoo prompts train`, stdlib files outside "
        "the pair's training and held-out sets)",
    )
    parser.add_argument("--num-prompts", type=int, default=48, help="training prompts used (default: %(default)s)")
    add_temperatures_option(parser)
    parser.add_argument("--plan", default="chain:8/block", help="the collecting plan (default: %(default)s)")
    parser.add_argument("--max-new-tokens", type=int, default=128, help="per generation (default: %(default)s)")
    parser.add_argument("--epochs", type=int, default=30, help="training epochs (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=0, help="seed of collection, split and training")
    parser.add_argument("--skip-collect", action="store_true", help="train on the node log already in OUT/nodes")
    parser.add_argument(
        "--install",
        action="store_true",
        help="copy the model into the user data folder, where learned-chain plans find it first "
        "($ADAPTIVE_SPEC_HOME/default, default ~/.local/share/adaptive-spec/default)",
    )
    add_progress_option(parser)


def run(args: argparse.Namespace) -> int:
    """Collect, train, export and calibrate; print a one-screen summary."""
    from adaptive_spec.engine.load import load_engine
    from adaptive_spec.temperatures import parse_temperatures

    out: Path = args.out
    nodes = out / "nodes"
    temps = parse_temperatures(args.temperatures)
    summary: dict[str, Any] = {"temperatures": temps}
    if not args.skip_collect:
        from adaptive_spec.files import read_prompts
        from adaptive_spec.zoo.prompt_sets import prompt_set

        if args.prompts is not None:
            prompts = read_prompts(args.prompts, args.num_prompts)
        else:
            prompts = prompt_set("train", args.num_prompts, seed=args.seed + 1)
        engine = load_engine(args.target, args.draft, None, None)
        if nodes.exists():
            shutil.rmtree(nodes)
        summary["collect"] = collect_nodes(
            engine,
            prompts,
            temps,
            nodes,
            plan=args.plan,
            max_new_tokens=args.max_new_tokens,
            seed=args.seed,
            progress=not args.no_progress,
        )
        print(f"collected {summary['collect']['rows']} nodes in {summary['collect']['seconds']:.0f} s -> {nodes}")
    summary.update(
        fit_acceptance(nodes, out, epochs=args.epochs, seed=args.seed, plan=args.plan, progress=not args.no_progress)
    )
    training = summary["training"]
    if args.install:
        dest = default_acceptance_paths()[0]  # the user data folder, never the installed package
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(out / ACCEPTANCE_FILE, dest)
        summary["installed"] = str(dest)
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    print(
        f"acceptance model: {summary['export']['path']} (val loss {training['best_val_loss']:.4f}, "
        f"ONNX parity {summary['export']['max_abs_diff']:.1e})"
    )
    for group, eces in summary["calibration"].items():
        print(f"  {group}: ECE accept {eces['accept']:.3f}, next {eces['next']:.3f}")
    print(f"  reliability diagram: {out / 'report' / 'calibration.png'}")
    return 0
