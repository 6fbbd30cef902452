"""``adaptive-spec selector gate``: train the learned per-step source choice (model draft or lookup) for a pair.

Collects steps on the tuning prompts (resumable: ``--data`` keeps every finished generation),
labels them from the committed text, fits the gate and writes its file. Play it with
``--plans "source:<model>+<lookup>?gate=FILE"`` or name it in a pair's ``adaptive.yaml``. The
stages are functions of :mod:`adaptive_spec.selector.gate`.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
from pathlib import Path

from adaptive_spec.options import (
    add_json_option,
    add_model_options,
    add_progress_option,
    add_temperatures_option,
    positive_int,
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the ``selector gate`` options."""
    parser.add_argument(
        "--prompts", required=True, action="append", help="training prompts (JSONL or .txt); repeat to mix files"
    )
    parser.add_argument("--limit", type=positive_int, default=None, help="prompts used per file (default: all)")
    add_temperatures_option(parser)
    parser.add_argument("--model-plan", default="chain:1/block", help="the model source's plan (default: %(default)s)")
    parser.add_argument("--lookup", default="lookup:3x8/nss", help="the lookup source's plan (default: %(default)s)")
    parser.add_argument("--repeats", type=int, default=1, help="generations per prompt and temperature")
    parser.add_argument("--max-new-tokens", type=int, default=128, help="(default: %(default)s)")
    parser.add_argument(
        "--explore",
        type=float,
        default=0.3,
        help="share of the steps that find a lookup played with it (default: %(default)s)",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of collection, split and training")
    parser.add_argument(
        "--data", type=Path, default=Path("data/gate/steps.jsonl"), help="the step records (default: %(default)s)"
    )
    parser.add_argument("--skip-collect", action="store_true", help="fit on the records already in --data")
    parser.add_argument(
        "--no-draft-features",
        action="store_true",
        help="a gate that chooses before any draft forward: collect without it and fit without the draft's "
        "root features (lookup and no-draft steps then run no draft at all); --data must be such a collection",
    )
    add_model_options(parser, ("target", "draft"))
    parser.add_argument(
        "--out-file",
        type=Path,
        default=Path("configs/plans/source_gate.json"),
        help="the gate file to write (default: %(default)s)",
    )
    add_json_option(parser, "the training report")
    add_progress_option(parser)


def run(args: argparse.Namespace) -> int:
    """Collect, label, fit and write the gate; print its report."""
    from adaptive_spec.files import read_prompts
    from adaptive_spec.planner.gate import GATE_FEATURES, ROOT_FEATURES
    from adaptive_spec.planner.plan import Plan
    from adaptive_spec.selector.gate import (
        collect_gate_data,
        data_root_features,
        fit_gate,
        label_steps,
        read_gate_data,
        write_gate,
    )
    from adaptive_spec.temperatures import parse_temperatures

    try:
        temps = parse_temperatures(args.temperatures)
        model, lookup = str(Plan.parse(args.model_plan)), str(Plan.parse(args.lookup))
        if args.repeats < 1 or args.max_new_tokens < 1:
            raise ValueError("--repeats and --max-new-tokens must be at least 1")
        prompts = [] if args.skip_collect else [p for f in args.prompts for p in read_prompts(f, args.limit)]
    except (FileNotFoundError, ValueError) as err:
        raise SystemExit(f"selector gate: {err}") from None
    fingerprints = None
    if not args.skip_collect:
        from adaptive_spec.engine.load import load_engine

        engine = load_engine(args.target, args.draft, None, None)
        fingerprints = engine.fingerprints()
        try:
            collect_gate_data(
                engine,
                prompts,
                temps,
                args.data,
                model=model,
                lookup=lookup,
                max_new_tokens=args.max_new_tokens,
                repeats=args.repeats,
                explore=args.explore,
                seed=args.seed,
                progress=not args.no_progress,
                root_features=not args.no_draft_features,
            )
        except ValueError as err:
            raise SystemExit(f"selector gate: {err}") from None
    try:
        records = read_gate_data(args.data)
        if args.no_draft_features and data_root_features(records):
            raise ValueError(f"{args.data} was collected with draft root features; collect into another --data")
        features = [f for f in GATE_FEATURES if not (args.no_draft_features and f in ROOT_FEATURES)]
        data = label_steps(records, lookup)
        gate, report = fit_gate(data, model, lookup, seed=args.seed, features=features)
    except (FileNotFoundError, ValueError) as err:
        raise SystemExit(f"selector gate: {err}") from None
    provenance = {
        "prompts": list(map(str, args.prompts)),
        "temperatures": temps,
        "data": str(args.data),
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "models": fingerprints,
    }
    write_gate(gate, args.out_file, report, provenance)
    if args.json is not None:
        from adaptive_spec.files import write_json_atomic

        write_json_atomic(report | {"gate": str(args.out_file)}, args.json)
    print(json.dumps(report, indent=1))
    print(f"wrote {args.out_file}; play it with --plans 'source:{model}+{lookup}?gate={args.out_file}'")
    return 0
