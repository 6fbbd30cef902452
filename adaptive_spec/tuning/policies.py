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

from typing import Any

from adaptive_spec.planner.plan import Plan

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
    from adaptive_spec.temperatures import temperature_key
    from adaptive_spec.tuning.objectives import speedup_trial
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

        def objective(trial, t=t, rows=rows):
            plan = suggest_policy(trial, t == 0, learned)
            return speedup_trial(trial, engine, prompts, plan, Plan.parse(plan), t, args, rows)

        study.optimize(objective, n_trials=args.optuna, show_progress_bar=not args.no_progress)
        runs[key] = {"results": rows, "study": study.study_name}
    return runs
