"""``adaptive-spec tune policies``: choose the in-draft drafting policy per temperature on measured speedup.

The search is in :mod:`adaptive_spec.tuning.policies`.
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
from adaptive_spec.planner.plan import Plan
from adaptive_spec.planner.presets import IN_DRAFT_RELPATH, in_draft_path, write_in_draft
from adaptive_spec.tuning.policies import choose, default_grid, optuna_search
from adaptive_spec.tuning.storage import DEFAULT_STORAGE


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the ``tune policies`` options."""
    parser.add_argument("--prompts", required=True, help="tuning prompts (JSONL or .txt), from training files")
    parser.add_argument("--limit", type=positive_int, default=12, help="prompts used (default: %(default)s)")
    add_temperatures_option(parser)
    parser.add_argument("--grid", default=None, help="comma-separated candidate plans (default: the built-in grid)")
    parser.add_argument(
        "--static",
        default="chain:2/block,chain:3/block,chain:4/block,chain:6/block",
        help="static plans measured alongside, for reference (default: %(default)s)",
    )
    parser.add_argument("--max-new-tokens", type=int, default=96, help="(default: %(default)s)")
    parser.add_argument("--seed", type=int, default=0, help="(default: %(default)s)")
    parser.add_argument("--config-out", default=None, help="write configs/plans/in-draft.yaml under this folder")
    add_model_options(parser, ("target", "draft", "device"))
    parser.add_argument(
        "--out-file",
        type=Path,
        default=None,
        help="write the plan file here instead (e.g. adaptive_spec/zoo/smollm2/in-draft.yaml for --target smollm2)",
    )
    add_json_option(parser, "the whole measurement")
    add_progress_option(parser)
    parser.add_argument(
        "--optuna",
        type=int,
        default=0,
        metavar="N",
        help="run N Optuna trials per temperature instead of the grid (default: the grid)",
    )
    parser.add_argument("--storage", default=DEFAULT_STORAGE, help="Optuna storage URL (default: %(default)s)")
    parser.add_argument("--study-prefix", default="policies", help="study name prefix (default: %(default)s)")


def run(args: argparse.Namespace) -> int:
    """Measure the candidate policies, choose one per temperature, write and stamp the plan file."""
    from adaptive_spec.bench.e2e import measure
    from adaptive_spec.engine.load import load_engine
    from adaptive_spec.files import read_prompts
    from adaptive_spec.temperatures import parse_temperatures

    try:
        temps = parse_temperatures(args.temperatures)
        prompts = read_prompts(args.prompts, args.limit)
        grid = [g.strip() for g in (args.grid.split(",") if args.grid else default_grid()) if g.strip()]
        parsed = [Plan.parse(p) for p in [*grid, *args.static.split(",")] if p.strip()]
        plans = {str(p): p for p in parsed}
    except (FileNotFoundError, ValueError) as err:
        raise SystemExit(f"tune policies: {err}") from None
    engine = load_engine(args.target, args.draft, args.device, None)
    if args.optuna:
        res = {"runs": optuna_search(engine, prompts, temps, args)}
    else:
        res = measure(
            engine, prompts, plans, temps, args.max_new_tokens, args.seed, hf=False, progress=not args.no_progress
        )
    choices = choose(res["runs"])
    stamp = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    for entry in choices.values():
        entry.update(
            {
                "prompts": str(args.prompts),
                "num_prompts": len(prompts),
                "search": "optuna" if args.optuna else "grid",
                "max_new_tokens": args.max_new_tokens,
                "date": stamp,
                "device": engine.device.type,
            }
        )
    path = args.out_file or (in_draft_path(args.config_out) if args.config_out else Path.cwd() / IN_DRAFT_RELPATH)
    write_in_draft(choices, path, device=engine.device.type)  # a GPU's: its own section, read first there
    from adaptive_spec.engine.fingerprint import stamp_plan_file

    stamp_plan_file(path, engine.fingerprints())  # generate() plays these plans by default for this pair only
    for k, run_ in res["runs"].items():
        print(f"\ntemperature {k}: top candidates by speedup over autoregressive decoding")
        for r in sorted(run_["results"], key=lambda r: -(r["speedup_vs_ar"] or 0))[:8]:
            print(f"  {r['plan']:<36} {r['speedup_vs_ar']:.3f}x  BE {r['block_efficiency']:.2f}")
        if k in choices:
            print(f"  -> {choices[k]['plan']}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"choices": choices, **res}, indent=2))
    print(f"wrote {path}")
    return 0
