"""``adaptive-spec tune sources``: the per-step source rule shipped for a pair, chosen on measured speed.

The per-step planner of a pair chooses, before each step, between the model's draft and a draft
looked up in the context (:class:`~adaptive_spec.planner.sources.SourceRule`). Its parameters (the
model plan, the lookup plan: a chain, a trie or a hybrid, and the rule's thresholds) are searched
per temperature with Optuna (seeded TPE, storage as for ``tune plans``); each trial measures its
rule and autoregressive decoding interleaved on the tuning prompts, and its value is that speedup.
Static plans (model chains and lookup plans) are measured once, in one interleaved run, for the
best static plan of the pair. With ``--gate FILE`` (a learned source choice from ``adaptive-spec
selector gate``), every study also tries the gate, its margin searched beside the rules'
parameters (``--gate`` repeated: each gate, e.g. one that reads the draft's root features and one
that does not): the pair's per-step planner is whichever measures fastest. An existing plan file's
plans (:func:`incumbents`) are tried first: a rule or a gate's margin as its study's first trial, a static
plan among the static ones.

Tune on prompt sets of your own that mix open chat with tasks that copy their context
(summaries, answers from a passage, code edits): ``adaptive_spec/zoo/smollm2/tune_prompts.jsonl``
and ``tune_lookup_prompts.jsonl`` for the shipped pair. Never on Spec-Bench, which reports.

File layout (``adaptive_spec/zoo/<model>/adaptive.yaml`` for a shipped pair)::

    version: 1
    models: {target: ..., draft: ...}      # the pair's fingerprints (generate() checks them)
    plans:
      "0": {plan: "source:chain:2/block+lookup:3x8/nss?min_rate=0.2", speedup_vs_ar: 1.2,
            best_static: {plan: "chain:2/block", speedup_vs_ar: 1.1}, ...}
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from adaptive_spec.planner.gate import GatedSource
from adaptive_spec.planner.plan import Plan
from adaptive_spec.planner.sources import parse_source_rule

# Static plans measured for the pair's best static plan: model chains and lookup plans (the corpus lookup where the
# engine has a datastore), lookup tries with the draft's greedy path and its top 3 tokens at the root (+m3x3: at T = 0
# on a CPU 2.52 against +m3's 2.36 on the demo prompts), and a 31-node EAGLE-style tree (32 rows with the pending
# token, where the 48-node tree needs the 64-row graph; at T = 1 on a CPU 1.95 over three seed sets, where the 16-node
# tree gets 1.81).
DEFAULT_STATIC = (
    "chain:1/block",
    "chain:2/block",
    "chain:3/block",
    "eagle:5:31:4:4:wor/traversal",
    "lookup:8/block",
    "lookup:3x8/nss",
    "lookup:3x8+2/nss",
    "lookup:8+m3x3/nss",
    "lookup:3x8+2+m3x3/nss",
)
# Known-good starting points of every study: the rule's defaults over a chain lookup and a trie.
KNOWN_RULES = ("source:chain:2/block", "source:chain:2/block+lookup:3x8/nss")
GATE_MARGINS = (1.0, 0.8, 1.25)  # a learned gate's margins tried first (tokens per second, lookup over model)


def _gate_names(i: int) -> tuple[str, str]:
    """The trial's ``kind`` value and margin parameter of the ``i``-th gate (``gate``/``margin``, then ``gate2``...)."""
    return ("gate", "margin") if i == 0 else (f"gate{i + 1}", f"margin{i + 1}")


def suggest_rule(
    trial: Any, greedy: bool, gate: GatedSource | Sequence[GatedSource] | None = None, rules: bool = True
) -> str:
    """One source rule from an Optuna trial (every ``suggest_*`` of this search is here).

    With trained gates (``--gate``, repeatable), a trial is either a rule or one gate with a margin
    (``rules=False``: always a gate).
    """
    gates = [gate] if isinstance(gate, GatedSource) else list(gate or ())
    names = [_gate_names(i)[0] for i in range(len(gates))]
    kind = trial.suggest_categorical("kind", ["rule", *names] if rules else names) if gates else "rule"
    if kind != "rule":
        i = names.index(kind)
        margin = trial.suggest_float(_gate_names(i)[1], 0.5, 2.0, log=True)
        g = gates[i]
        return f"source:{g.model}+{g.lookup}?gate={g.gate.path}&margin={margin:.3f}"
    # depth 0: plain decoding where the lookup finds nothing (where a draft level costs a sizeable share of a pass,
    # as a captured head level does on a GPU, a chain of 1 may not pay)
    model = f"chain:{trial.suggest_int('model_depth', 0, 4)}/block"
    kind = trial.suggest_categorical("lookup", ["chain", "trie", "hybrid"])
    depth = trial.suggest_int("lookup_depth", 3, 12)
    if kind == "chain":
        lookup = f"lookup:{depth}/block"
    elif kind == "trie":
        lookup = f"lookup:{trial.suggest_int('trie_paths', 2, 4)}x{depth}/{'greedy' if greedy else 'nss'}"
    else:
        lookup = f"hybrid:{depth}:{trial.suggest_int('hybrid_model_tokens', 1, 3)}/block"
    n = trial.suggest_int("min_ngram", 1, 3)
    rate = trial.suggest_float("min_rate", 0.0, 0.8)
    decay = trial.suggest_float("decay", 0.0, 0.9)
    return str(parse_source_rule(f"source:{model}+{lookup}?min_ngram={n}&min_rate={rate:.3f}&decay={decay:.3f}"))


def _known_params(rule: str) -> dict[str, Any]:
    """The trial parameters of one of :data:`KNOWN_RULES` (to enqueue it)."""
    r = parse_source_rule(rule)
    lk = r.lookup
    params: dict[str, Any] = {"model_depth": r.model.shape.depth, "min_ngram": r.min_ngram}
    params.update({"min_rate": r.min_rate, "decay": r.decay, "lookup_depth": lk.shape.depth})
    if lk.shape.paths > 1:
        params.update({"lookup": "trie", "trie_paths": lk.shape.paths})
    else:
        params["lookup"] = "hybrid" if lk.source == "hybrid" else "chain"
    return params


def incumbents(path: str | Path, device: str | None = None) -> dict[str, str]:
    """The plans of an existing plan file per temperature key (none when there is no file): what a new tuning
    tries first, so that it never ships a plan slower than the one it replaces without having measured that one.

    ``device``: the kind of device tuned on; its own plans where the file has them, else the file's ``plans``
    (:func:`~adaptive_spec.planner.presets.plan_sections`).
    """
    from adaptive_spec.planner.presets import plan_sections, read_plan_file

    out: dict[str, str] = {}
    for section in reversed(plan_sections(read_plan_file(path), device)):  # a file that is not one: a clear error
        out.update(
            {
                str(k): str(v["plan"])
                for k, v in section.items()
                if isinstance(v, dict) and isinstance(v.get("plan"), str)
            }
        )
    return out


def incumbent_trial(plan: str, gates: Sequence[GatedSource] = (), rules: bool = True) -> dict[str, Any] | None:
    """The trial parameters that replay ``plan`` in a study (to enqueue it), or None where no trial can: a static
    plan (measured with the static plans instead), a gate not among ``gates`` (matched by file name), a rule when
    only gates are searched, or a plan this search cannot express.
    """
    if not plan.startswith("source:"):
        return None
    if "gate=" in plan:
        query = dict(part.split("=", 1) for part in plan.split("?", 1)[1].split("&") if "=" in part)
        for i, g in enumerate(gates):
            if Path(query.get("gate", "")).name == Path(str(g.gate.path)).name and "margin" in query:
                name, margin_name = _gate_names(i)
                return {"kind": name, margin_name: float(query["margin"])}
        return None
    if not rules:
        return None
    try:
        params = _known_params(plan)
    except (ValueError, AttributeError):
        return None
    return params | {"kind": "rule"} if gates else params


def search(
    engine: Any, prompts: list, temps: list[float], args: Any, incumbent: dict[str, str] | None = None
) -> dict[str, Any]:
    """Per temperature: ``args.trials`` Optuna trials of rules (and of ``args.gate``); returns ``run``-like rows.

    ``incumbent``: a plan per temperature key (:func:`incumbents`) enqueued first where a trial can replay it.
    """
    from adaptive_spec.temperatures import temperature_key
    from adaptive_spec.tuning.objectives import speedup_trial
    from adaptive_spec.tuning.storage import open_study

    gate = getattr(args, "gate", None)
    gates = [GatedSource(g) for g in ([gate] if isinstance(gate, (str, Path)) else gate or ())]
    rules = not (gates and getattr(args, "no_rules", False))
    runs: dict[str, Any] = {}
    for t in temps:
        key = temperature_key(t)
        study = open_study(f"{args.study_prefix}-T{key}", args.storage, seed=args.seed)
        first = incumbent_trial((incumbent or {}).get(key, ""), gates, rules)
        if first is not None:
            study.enqueue_trial(first, skip_if_exists=True)
        for rule in KNOWN_RULES if rules else ():
            params = _known_params(rule)
            study.enqueue_trial(params | {"kind": "rule"} if gates else params, skip_if_exists=True)
        for i in range(len(gates)):
            name, margin_name = _gate_names(i)
            for margin in GATE_MARGINS:
                study.enqueue_trial({"kind": name, margin_name: margin}, skip_if_exists=True)
        rows: list[dict] = []

        def objective(trial, t=t, rows=rows):
            rule = suggest_rule(trial, t == 0, gates, rules)
            return speedup_trial(trial, engine, prompts, rule, parse_source_rule(rule), t, args, rows)

        study.optimize(objective, n_trials=args.trials, show_progress_bar=not args.no_progress)
        runs[key] = {"results": rows, "study": study.study_name}
    return runs


def choose(rules: dict[str, Any], statics: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per temperature key: the fastest rule and the fastest static plan (speedups over autoregressive).

    The entry's ``plan`` is the rule, or the best static plan where that measured faster than every
    rule (the rule is kept under ``best_rule``): the pair's per-step planner is whatever measured best.
    """
    out: dict[str, dict[str, Any]] = {}
    for key, run in rules.items():
        ok = [r for r in run["results"] if r["speedup_vs_ar"]]
        static = [r for r in statics.get(key, {}).get("results", []) if r["speedup_vs_ar"]]
        if not ok:
            continue
        best = max(ok, key=lambda r: r["speedup_vs_ar"])
        entry: dict[str, Any] = {
            "plan": best["plan"],
            "speedup_vs_ar": round(best["speedup_vs_ar"], 4),
            "block_efficiency": round(best["block_efficiency"], 3),
            "study": run.get("study"),
            "trials": len(ok),
        }
        if static:
            top = max(static, key=lambda r: r["speedup_vs_ar"])
            entry["best_static"] = {
                "plan": str(Plan.parse(top["plan"])),
                "speedup_vs_ar": round(top["speedup_vs_ar"], 4),
            }
            if top["speedup_vs_ar"] > best["speedup_vs_ar"]:  # no rule beat the best static plan: play that
                entry["best_rule"] = {"plan": entry["plan"], "speedup_vs_ar": entry["speedup_vs_ar"]}
                entry.update(plan=entry["best_static"]["plan"], speedup_vs_ar=entry["best_static"]["speedup_vs_ar"])
                entry["block_efficiency"] = round(top["block_efficiency"], 3)
        out[key] = entry
    return out
