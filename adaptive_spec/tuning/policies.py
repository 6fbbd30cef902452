"""``adaptive-spec tune policies``: the in-draft planner's policy per temperature, chosen on measured speed.

Every candidate (drafting policies and, for reference, static plans) runs in *one* interleaved
``bench e2e`` measurement over tuning prompts, together with autoregressive decoding; the
score of a candidate at a temperature is its speedup over autoregressive decoding in that same
run (never absolute tokens/s, which other processes on the machine distort). The best policy
per temperature goes to ``configs/plans/in-draft.yaml``; ``bench e2e --plans in-draft`` and
``make demo`` play it.

Use tuning prompts from *training* files (``adaptive-spec zoo prompts train``), never the
prompt sets that report speed. Two searches:

* the default grid over each policy's parameters (thresholds, depths, widths): a few dozen
  candidates measured side by side in one run;
* ``--optuna N``: per temperature, an Optuna study (seeded TPE, storage as for ``tune plans``)
  over the policy family and its parameters; each trial measures its policy and
  autoregressive decoding interleaved on the tuning prompts, and its value is that speedup.

File layout::

    version: 1
    plans:
      "0": {plan: "conf-chain:12:0.3/block", speedup_vs_ar: 2.1, ...}
      "1": {...}
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
from pathlib import Path
from typing import Any

from adaptive_spec.options import add_json_option, add_progress_option, add_temperatures_option
from adaptive_spec.planner.plan import Plan
from adaptive_spec.planner.presets import IN_DRAFT_RELPATH, in_draft_path, write_in_draft
from adaptive_spec.tuning.storage import DEFAULT_STORAGE

# The default grid: the transformers rule, SpecDec++'s rule, dynamic delayed expansion and
# EAGLE-2-style growth (and the learned chains, below), each at a few settings; verifiers that
# are lossless for each law.
DEFAULT_GRID = [
    *(f"conf-chain:{d}:{t}/block" for d in (3, 4, 6, 10) for t in (0.3, 0.5, 0.7)),
    *(f"cum-chain:{d}:{m}/block" for d in (4, 6, 10) for m in (0.1, 0.2, 0.35)),
    "conf-delayed:8:0.5:2/traversal",
    "eagle:6:12:2:2/traversal",
]
# The learned acceptance model's chains (``selector acceptance``), added when a model is installed.
LEARNED_GRID = [f"learned-chain:{d}:{r}/block" for d in (4, 8) for r in (0.06, 0.1, 0.15, 0.25)]


def default_grid() -> list[str]:
    """:data:`DEFAULT_GRID`, plus :data:`LEARNED_GRID` when an acceptance model is found."""
    return [*DEFAULT_GRID, *LEARNED_GRID] if acceptance_model_installed() else list(DEFAULT_GRID)


def choose(runs: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per temperature: the policy with the highest speedup over autoregressive decoding, and the runner-up table."""
    out = {}
    for k, run in runs.items():
        rows = [r for r in run["results"] if Plan.parse(r["plan"]).dynamic and r["speedup_vs_ar"]]
        statics = [r for r in run["results"] if not Plan.parse(r["plan"]).dynamic and r["speedup_vs_ar"]]
        if not rows:
            continue
        best = max(rows, key=lambda r: r["speedup_vs_ar"])
        entry = {
            "plan": best["plan"],
            "speedup_vs_ar": round(best["speedup_vs_ar"], 4),
            "block_efficiency": round(best["block_efficiency"], 3),
        }
        if statics:
            top = max(statics, key=lambda r: r["speedup_vs_ar"])
            entry["best_static_in_run"] = {"plan": top["plan"], "speedup_vs_ar": round(top["speedup_vs_ar"], 4)}
        out[k] = entry
    return out


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--prompts", required=True, help="tuning prompts (JSONL or .txt), from training files")
    parser.add_argument("--limit", type=int, default=12, help="prompts used (default: %(default)s)")
    add_temperatures_option(parser)
    parser.add_argument("--grid", default=None, help="comma-separated candidate plans (default: the built-in grid)")
    parser.add_argument("--static", default="chain:2/block,chain:3/block,chain:4/block,chain:6/block",
                        help="static plans measured alongside, for reference (default: %(default)s)")  # fmt: skip
    parser.add_argument("--max-new-tokens", type=int, default=96, help="(default: %(default)s)")
    parser.add_argument("--seed", type=int, default=0, help="(default: %(default)s)")
    parser.add_argument("--config-out", default=None, help="write configs/plans/in-draft.yaml under this folder")
    add_json_option(parser, "the whole measurement")
    add_progress_option(parser)
    parser.add_argument("--optuna", type=int, default=0, metavar="N",
                        help="run N Optuna trials per temperature instead of the grid (default: the grid)")  # fmt: skip
    parser.add_argument("--storage", default=DEFAULT_STORAGE, help="Optuna storage URL (default: %(default)s)")
    parser.add_argument("--study-prefix", default="policies", help="study name prefix (default: %(default)s)")


def acceptance_model_installed() -> bool:
    """Whether ``learned-chain`` plans find an acceptance model."""
    from adaptive_spec.planner.acceptance import find_acceptance_model

    try:
        find_acceptance_model()
    except FileNotFoundError:
        return False
    return True


def suggest_policy(trial, greedy: bool, learned: bool = False) -> str:
    """One drafting-policy plan from an Optuna trial (every ``suggest_*`` of this search is here)."""
    families = ["conf-chain", "cum-chain", "conf-delayed", *(["learned-chain"] if learned else [])]
    family = trial.suggest_categorical("family", families)
    depth = trial.suggest_int(f"{family}_depth", 4, 16)
    if family == "learned-chain":
        rho = trial.suggest_float("learned_cost_ratio", 0.03, 0.4, log=True)
        return f"learned-chain:{depth}:{rho:.4f}/block"
    if family == "conf-chain":
        theta = trial.suggest_float("conf_threshold", 0.05, 0.9)
        return f"conf-chain:{depth}:{theta:.3f}/block"
    if family == "cum-chain":
        m = trial.suggest_float("cum_min_path_prob", 0.01, 0.6, log=True)
        return f"cum-chain:{depth}:{m:.4f}/block"
    theta = trial.suggest_float("delayed_threshold", 0.1, 0.9)
    k = trial.suggest_int("delayed_paths", 2, 4)
    verifier = "traversal" if greedy else trial.suggest_categorical("delayed_verifier", ["traversal", "specinfer"])
    return f"conf-delayed:{depth}:{theta:.3f}:{k}/{verifier}"


def optuna_search(engine, prompts, temps, args) -> dict[str, Any]:
    """Per temperature: ``args.optuna`` trials; returns ``run``-like rows for :func:`choose`."""
    from adaptive_spec.bench.e2e import measure
    from adaptive_spec.temperatures import temperature_key
    from adaptive_spec.tuning.storage import open_study

    runs: dict[str, Any] = {}
    learned = acceptance_model_installed()  # learned-chain is a family only when a model is there
    for t in temps:
        key = temperature_key(t)
        study = open_study(f"{args.study_prefix}-T{key}", args.storage, seed=args.seed)
        known = ["conf-chain:12:0.300/block", "cum-chain:12:0.1000/block"]
        for plan in known:  # known-good starting points
            fam, depth, value = plan.split("/")[0].split(":")
            params = {"family": fam, f"{fam}_depth": int(depth)}
            params["conf_threshold" if fam == "conf-chain" else "cum_min_path_prob"] = float(value)
            study.enqueue_trial(params, skip_if_exists=True)
        rows: list[dict] = []

        def objective(trial, t=t, key=key, rows=rows):
            plan = suggest_policy(trial, t == 0, learned)
            res = measure(engine, prompts, {plan: Plan.parse(plan)}, [t], args.max_new_tokens, args.seed,
                          hf=False, progress=False)  # fmt: skip
            row = res["runs"][key]["results"][0]
            trial.set_user_attr("plan", plan)
            trial.set_user_attr("block_efficiency", row["block_efficiency"])
            rows.append(row)
            return row["speedup_vs_ar"]

        study.optimize(objective, n_trials=args.optuna, show_progress_bar=not args.no_progress)
        runs[key] = {"results": rows, "study": study.study_name}
    return runs


def run(args: argparse.Namespace) -> int:
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
    engine = load_engine(None, None, None, None)
    if args.optuna:
        res = {"runs": optuna_search(engine, prompts, temps, args)}
    else:
        res = measure(engine, prompts, plans, temps, args.max_new_tokens, args.seed, hf=False,
                      progress=not args.no_progress)  # fmt: skip
    choices = choose(res["runs"])
    stamp = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    for entry in choices.values():
        entry.update({"prompts": str(args.prompts), "num_prompts": len(prompts), "search": "optuna" if args.optuna
                      else "grid", "max_new_tokens": args.max_new_tokens, "date": stamp})  # fmt: skip
    path = in_draft_path(args.config_out) if args.config_out else Path.cwd() / IN_DRAFT_RELPATH
    write_in_draft(choices, path)
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
