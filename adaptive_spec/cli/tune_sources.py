"""``adaptive-spec tune sources``: the per-step source rule (model draft or lookup) per temperature, on measured speed.

The search is in :mod:`adaptive_spec.tuning.sources`; ``bench e2e --plans adaptive`` and
``generate(plan="auto")`` play the result for the pair it was tuned for.
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
    device_type,
    positive_int,
)
from adaptive_spec.planner.plan import Plan
from adaptive_spec.tuning.sources import DEFAULT_STATIC, choose, incumbents, search
from adaptive_spec.tuning.storage import DEFAULT_STORAGE


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the ``tune sources`` options."""
    parser.add_argument(
        "--prompts", required=True, action="append", help="tuning prompts (JSONL or .txt); repeat to mix files"
    )
    parser.add_argument("--limit", type=positive_int, default=None, help="prompts used per file (default: all)")
    add_temperatures_option(parser)
    parser.add_argument("--trials", type=int, default=10, help="Optuna trials per temperature (default: %(default)s)")
    parser.add_argument(
        "--static",
        default=",".join(DEFAULT_STATIC),
        help="static plans measured for the pair's best static plan; by default the corpus lookup (+K) only "
        "where the pair has a datastore (default: %(default)s)",
    )
    parser.add_argument(
        "--gate",
        type=Path,
        action="append",
        default=None,
        help="a learned source choice (`adaptive-spec selector gate`) to try beside the rules, its margin searched; "
        "repeat to try several",
    )
    parser.add_argument(
        "--no-rules",
        action="store_true",
        help="with --gate: try only the gates (their margins), not the hand-written rules",
    )
    parser.add_argument("--max-new-tokens", type=int, default=96, help="(default: %(default)s)")
    parser.add_argument("--seed", type=int, default=0, help="(default: %(default)s)")
    add_model_options(parser, ("target", "draft", "device"))
    parser.add_argument(
        "--out-file",
        type=Path,
        default=Path("configs/plans/adaptive.yaml"),
        help="the plan file to write (default: %(default)s; adaptive_spec/zoo/smollm2/adaptive.yaml ships the pair's); "
        "tuned on a GPU, the plans go to its section for that kind of device, which generate() reads there first",
    )
    add_json_option(parser, "the whole measurement")
    add_progress_option(parser)
    parser.add_argument("--storage", default=DEFAULT_STORAGE, help="Optuna storage URL (default: %(default)s)")
    parser.add_argument("--study-prefix", default="sources", help="study name prefix (default: %(default)s)")


def run(args: argparse.Namespace) -> int:
    """Measure the static plans, search the rules, write and stamp the plan file."""
    from adaptive_spec.bench.e2e import measure
    from adaptive_spec.engine.fingerprint import stamp_plan_file
    from adaptive_spec.engine.load import load_engine
    from adaptive_spec.files import read_prompts
    from adaptive_spec.planner.presets import write_plan_file
    from adaptive_spec.temperatures import parse_temperatures

    try:
        temps = parse_temperatures(args.temperatures)
        prompts = [p for f in args.prompts for p in read_prompts(f, args.limit)]
        statics = {str(p): p for p in (Plan.parse(s) for s in args.static.split(",") if s.strip())}
        if args.trials < 1:
            raise ValueError("--trials must be at least 1")
        if args.no_rules and not args.gate:
            raise ValueError("--no-rules leaves nothing to try without --gate")
        if args.gate:
            from adaptive_spec.planner.gate import SourceGate

            for gate in args.gate:
                SourceGate.load(gate)  # a clear error before any model loads
        current = incumbents(args.out_file, device_type(args.device))
        for plan in current.values():  # the plans being replaced are measured too, static ones with the statics
            if not plan.startswith("source:"):
                parsed = Plan.parse(plan)
                statics.setdefault(str(parsed), parsed)
    except (FileNotFoundError, ValueError) as err:
        raise SystemExit(f"tune sources: {err}") from None
    if current:
        tried = ", ".join(f"T={k} {p}" for k, p in current.items())
        print(f"tune sources: the plans of {args.out_file} are tried too: {tried}")
    engine = load_engine(args.target, args.draft, args.device, None)
    if engine.datastore is None:  # lookup:WxL+K drafts from a datastore: not for a pair without one
        corpus = [name for name, plan in statics.items() if plan.corpus_paths]
        if corpus and args.static == ",".join(DEFAULT_STATIC):
            statics = {name: plan for name, plan in statics.items() if not plan.corpus_paths}
        elif corpus:
            raise SystemExit(f"tune sources: {', '.join(corpus)} drafts from a datastore, and this pair has none")
    static_res = measure(
        engine, prompts, statics, temps, args.max_new_tokens, args.seed, hf=False, progress=not args.no_progress
    )
    rules = search(engine, prompts, temps, args, incumbent=current)
    choices = choose(rules, static_res["runs"])
    stamp = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    for entry in choices.values():
        entry.update(
            {"prompts": list(map(str, args.prompts)), "num_prompts": len(prompts), "search": "optuna"}
            | {"max_new_tokens": args.max_new_tokens, "date": stamp, "device": engine.device.type}
        )
    header = "# The per-step source rule per temperature, from `adaptive-spec tune sources` (its measured speedups).\n"
    for gate in args.gate or ():
        if gate.resolve().parent == args.out_file.resolve().parent:
            for entry in choices.values():  # a gate beside the plan file is named relative to it
                entry["plan"] = entry["plan"].replace(f"gate={gate}&", f"gate={gate.name}&")
    write_plan_file(choices, args.out_file, header, device=engine.device.type)
    stamp_plan_file(args.out_file, engine.fingerprints())  # generate() plays it by default for this pair only
    for k, entry in choices.items():
        print(f"\ntemperature {k}: {entry['plan']}  {entry['speedup_vs_ar']:.3f}x over autoregressive")
        if "best_static" in entry:
            print(f"  best static plan: {entry['best_static']['plan']}  {entry['best_static']['speedup_vs_ar']:.3f}x")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"choices": choices, "static": static_res, "rules": rules}, indent=2))
    where = "" if engine.device.type == "cpu" else f" (its plans for {engine.device.type})"
    print(f"wrote {args.out_file}{where}")
    return 0
