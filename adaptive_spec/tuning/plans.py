"""Tune the static plan per temperature: one Optuna study per temperature, best plan to ``configs/``.

For each temperature ``T`` the study ``<study>-T<T>`` (e.g. ``plans-T0``, ``plans-T1``) is created
or resumed in the storage; the known-good plans (:data:`~adaptive_spec.tuning.space.KNOWN_GOOD_PLANS`)
are enqueued first (by worker 0, once per study), then the seeded TPE sampler proposes plans. Afterwards the
best plan is compared with the autoregressive baseline and ``bench e2e``'s default plans on the
same prompts (measured objective: interleaved, median over repeats; predicted objective: the
table's predictions), written to ``configs/plans/best-static.yaml`` and summarised in a report.
With several workers on one study the measured comparison runs once, by the last worker to
finish its trials (:func:`claim_final_comparison`); the others write the study's best median.

A study remembers what it measures (objective, pair, prompts, tokens, labels) in its user
attributes; resuming it with other settings is refused, since their figures would not compare.
"""

from __future__ import annotations

import logging
import statistics
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from adaptive_spec.planner.plan import Plan
from adaptive_spec.planner.presets import DEFAULT_PLANS
from adaptive_spec.tuning.space import PLAN_PARAM_GROUPS, known_good_params
from adaptive_spec.tuning.storage import DEFAULT_GRACE_S, DEFAULT_HEARTBEAT_S, DEFAULT_STORAGE

__all__ = ["PlanTuningConfig", "claim_final_comparison", "compare_plans", "rank_plans", "study_name", "tune_plans"]

log = logging.getLogger(__name__)


@dataclass
class PlanTuningConfig:
    """Settings of ``tune plans`` (the CLI's options; defaults are the CLI's defaults).

    Attributes:
        storage: SQLAlchemy URL of the study storage.
        study: study name prefix; temperature ``T`` uses the study ``<study>-T<T>``.
        n_trials: trials this worker runs per temperature (enqueued trials included).
        timeout: seconds this worker spends per temperature at most (None: no limit).
        temperatures: the temperatures to tune, one study each.
        objective: ``"measured"`` (engine tokens/s) or ``"predicted"`` (label table).
        labels: label table directory or file (predicted objective).
        target, draft: model directories or hub ids (None, None: the built-in pair).
        device, dtype: where and in which precision to run the models (None: defaults).
        prompts: JSON Lines prompt file (None: the built-in prompts).
        num_prompts: prompts used from the set.
        max_new_tokens: new tokens per prompt.
        repeats: passes over the prompts per trial (the objective is the median).
        seed: base seed of generation (prompt ``i`` uses ``seed + i``) and of the sampler.
        worker: index of this worker process; parallel workers need distinct indices.
        heartbeat_interval, grace_period: seconds (see :mod:`adaptive_spec.tuning.storage`).
        enqueue: enqueue the known-good plans first (worker 0 only, skipping those already in the study).
        compare: at the end, re-measure the ``finalists`` best plans of the study (by median over
            their trials) with the default plans and autoregressive decoding, interleaved; the
            fastest there is written to best-static (measured objective only).
        finalists: how many of the study's best plans are re-measured.
        config_out: configs folder receiving ``plans/best-static.yaml`` (None: ``./configs``);
            ``write_config=False`` skips it.
        report: report folder (None: next to the study: ``<sqlite folder>/reports/<study>``).
        write_report: write the report.
        progress: show progress bars.
    """

    storage: str = DEFAULT_STORAGE
    study: str = "plans"
    n_trials: int = 20
    timeout: float | None = None
    temperatures: tuple[float, ...] = (0.0, 1.0)
    objective: str = "measured"
    labels: str | None = None
    target: str | None = None
    draft: str | None = None
    device: str | None = None
    dtype: str | None = None
    prompts: str | None = None
    num_prompts: int = 4
    max_new_tokens: int = 64
    repeats: int = 3
    seed: int = 0
    worker: int = 0
    heartbeat_interval: int = DEFAULT_HEARTBEAT_S
    grace_period: int = DEFAULT_GRACE_S
    enqueue: bool = True
    compare: bool = True
    finalists: int = 3
    config_out: str | None = None
    write_config: bool = True
    report: str | None = None
    write_report: bool = True
    progress: bool = True
    default_plans: tuple[str, ...] = field(default=DEFAULT_PLANS)

    def __post_init__(self) -> None:
        if self.objective not in ("measured", "predicted"):
            raise ValueError(f"objective must be 'measured' or 'predicted', got {self.objective!r}")
        if self.objective == "predicted" and not self.labels:
            raise ValueError("the predicted objective needs a label table: give --labels DIR")
        if self.n_trials < 0 or min(self.num_prompts, self.max_new_tokens, self.repeats, self.finalists) < 1:
            raise ValueError("n_trials must be >= 0 and num_prompts, max_new_tokens, repeats, finalists >= 1")
        if not self.temperatures:
            raise ValueError("give at least one temperature")
        for t in self.temperatures:
            if not t >= 0:
                raise ValueError(f"temperatures must be >= 0, got {t}")
        for p in self.default_plans:
            Plan.parse(p)


def study_name(prefix: str, temperature: float) -> str:
    """``<prefix>-T<temperature>``, e.g. ``plans-T0``, ``plans-T0.7``."""
    from adaptive_spec.temperatures import temperature_key

    return f"{prefix}-T{temperature_key(temperature)}"


def _report_dir(cfg: PlanTuningConfig) -> Path:
    from adaptive_spec.tuning.storage import report_dir

    return report_dir(cfg.report, cfg.storage, cfg.study)


def _fingerprint(cfg: PlanTuningConfig, temperature: float, prompts: list[str] | None) -> dict[str, Any]:
    """What a study's values depend on; a resumed study must match it."""
    if cfg.objective == "predicted":
        return {"objective": "predicted", "temperature": temperature, "labels": str(Path(cfg.labels).resolve())}
    return {
        "objective": "measured",
        "temperature": temperature,
        "target": cfg.target or "built-in pair",
        "draft": cfg.draft or "built-in pair",
        "prompts": cfg.prompts or "built-in prompts",
        "num_prompts": len(prompts or []),
        "max_new_tokens": cfg.max_new_tokens,
        "repeats": cfg.repeats,
        "seed": cfg.seed,
    }


def compare_plans(
    engine: Any,
    prompts: list[str],
    plans: list[str],
    temperature: float,
    max_new_tokens: int,
    repeats: int,
    seed: int = 0,
    progress: bool = True,
) -> list[dict[str, Any]]:
    """Tokens/s of autoregressive decoding and each plan, interleaved repeat by repeat.

    Returns:
        One row per method (``"autoregressive"`` first): median tokens/s over ``repeats``, the
        per-repeat figures, block efficiency and the speedup over autoregressive decoding.
    """
    from tqdm.auto import tqdm

    from adaptive_spec.tuning.objectives import MeasuredTokensPerSecond

    methods: list[str | None] = [None, *dict.fromkeys(plans)]
    runs: dict[str | None, list[dict[str, Any]]] = {m: [] for m in methods}
    one = MeasuredTokensPerSecond(engine, prompts, temperature, max_new_tokens, repeats=1, seed=seed)
    with tqdm(total=repeats * len(methods), desc=f"compare T={temperature:g}", disable=not progress) as bar:
        for _ in range(repeats):
            for m in methods:
                runs[m].append(one(Plan.parse(m) if m else None))
                bar.update()
    rows = [
        {
            "plan": m or "autoregressive",
            "tokens_per_s": statistics.median(r["tokens_per_s"] for r in runs[m]),
            "tokens_per_s_repeats": [r["tokens_per_s"] for r in runs[m]],
            "block_efficiency": runs[m][0]["block_efficiency"],
        }
        for m in methods
    ]
    ar = rows[0]["tokens_per_s"]
    for r in rows:
        r["speedup_vs_ar"] = r["tokens_per_s"] / ar if ar else None
    return rows


def rank_plans(study: Any) -> list[dict[str, Any]]:
    """The study's plans ranked by the median of their complete trials (a plan sampled twice is one entry).

    Returns:
        ``[{"plan", "median", "trials": [numbers], "values": [...], "block_efficiency"}, ...]``, best
        first (ties: fewer trials last, then the earlier first trial).
    """
    import optuna

    groups: dict[str, list[Any]] = {}
    for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)):
        groups.setdefault(t.user_attrs.get("plan", "?"), []).append(t)
    ranked = [
        {
            "plan": plan,
            "median": statistics.median(t.value for t in trials),
            "trials": [t.number for t in trials],
            "values": [t.value for t in trials],
            "block_efficiency": statistics.median(t.user_attrs.get("block_efficiency", 0.0) for t in trials),
        }
        for plan, trials in groups.items()
        if plan != "?"
    ]
    return sorted(ranked, key=lambda r: (-r["median"], -len(r["trials"]), r["trials"][0]))


def _distinct_for(temperature: float, plans: list[str]) -> list[str]:
    """``plans`` without repeats.

    At temperature 0 (greedy verification whatever the plan says) a plan is its tree shape, so
    ``chain:4/block`` becomes ``chain:4/greedy`` and equal shapes are measured once.
    """
    from adaptive_spec.tuning.space import GREEDY

    if temperature == 0:
        plans = [f"{Plan.parse(p).shape}/{GREEDY}" for p in plans]
    return list(dict.fromkeys(plans))


def tune_plans(cfg: PlanTuningConfig, engine: Any = None) -> dict[str, Any]:
    """Run (or resume) the studies of ``cfg``; write best-static and the report.

    With several workers on one study, the final comparison runs once: the last worker to finish
    its trials claims it (:func:`claim_final_comparison`); the others report the study's ranking.

    Args:
        cfg: the settings.
        engine: a ready :class:`~adaptive_spec.engine.SpecEngine` for the measured objective
            (None: load ``cfg.target``/``cfg.draft``, or the built-in pair).

    Returns:
        The report summary: per temperature the study summary, the best plan, and the comparison.
    """
    import optuna

    from adaptive_spec.planner.presets import best_static_path
    from adaptive_spec.tuning.report import write_summary
    from adaptive_spec.tuning.storage import make_storage

    optuna.logging.set_verbosity(optuna.logging.WARNING if cfg.progress else optuna.logging.INFO)
    storage = make_storage(cfg.storage, cfg.heartbeat_interval, cfg.grace_period)
    engine, prompts, table = _inputs(cfg, engine)
    summary: dict[str, Any] = {"config": asdict(cfg), "temperatures": {}}
    for temperature in cfg.temperatures:
        key, section = _tune_one(cfg, storage, temperature, engine, prompts, table)
        summary["temperatures"][key] = section
    if cfg.write_report:
        path = write_summary(summary, _report_dir(cfg))
        print(f"report: {path.parent}")
    if cfg.write_config and any("best_static" in s for s in summary["temperatures"].values()):
        print(f"best plans: {best_static_path(cfg.config_out)}")
    return summary


def _inputs(cfg: PlanTuningConfig, engine: Any) -> tuple[Any, list[str] | None, Any]:
    """``(engine, prompts, label table)``: the measured objective's engine and prompts, or the predicted one's table."""
    if cfg.objective == "predicted":
        from adaptive_spec.formats.label_table import read_labels

        return engine, None, read_labels(cfg.labels)
    if engine is None:
        from adaptive_spec.engine.load import load_engine

        engine = load_engine(cfg.target, cfg.draft, cfg.device, cfg.dtype)
    if cfg.prompts is None:
        from adaptive_spec.files import default_prompts

        return engine, default_prompts(cfg.num_prompts), None
    from adaptive_spec.files import read_prompts

    return engine, read_prompts(cfg.prompts, cfg.num_prompts), None


def _tune_one(
    cfg: PlanTuningConfig, storage: Any, temperature: float, engine: Any, prompts: list[str] | None, table: Any
) -> tuple[str, dict[str, Any]]:
    """Run this worker's trials of one temperature's study, then choose (and write) its plan."""
    import optuna

    from adaptive_spec.temperatures import temperature_key
    from adaptive_spec.tuning.objectives import MeasuredTokensPerSecond, PlanObjective, PredictedTokensPerSecond
    from adaptive_spec.tuning.report import study_summary
    from adaptive_spec.tuning.storage import check_settings, open_study

    key, name = temperature_key(temperature), study_name(cfg.study, temperature)
    study = open_study(name, storage, seed=cfg.seed, worker=cfg.worker)
    check_settings(study, _fingerprint(cfg, temperature, prompts))
    if cfg.objective == "measured":
        evaluator = MeasuredTokensPerSecond(engine, prompts, temperature, cfg.max_new_tokens, cfg.repeats, cfg.seed)
    else:
        evaluator = PredictedTokensPerSecond(table, temperature)
    if cfg.enqueue and cfg.worker == 0:  # one worker enqueues, so parallel workers cannot race to duplicate
        for params in known_good_params(temperature):
            study.enqueue_trial(params, user_attrs={"enqueued": True}, skip_if_exists=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        study.optimize(
            PlanObjective(evaluator, temperature, cfg.worker),
            n_trials=cfg.n_trials,
            timeout=cfg.timeout,
            catch=(ValueError, RuntimeError),
            show_progress_bar=cfg.progress and cfg.n_trials > 0,
        )
    ranking = rank_plans(study)
    section: dict[str, Any] = {"study": study_summary(study), "ranking": ranking[:10]}
    if not ranking:
        log.warning("study %s has no complete trial yet; nothing to write", name)
        return key, section
    rows, chosen = _choose(cfg, study, ranking, temperature, evaluator, engine, prompts)
    section.update(comparison=rows, chosen=chosen)
    _write_outputs(cfg, study, section, ranking, temperature, prompts)
    _print_section(key, name, ranking, chosen, rows, cfg.objective)
    return key, section


def claim_final_comparison(study: Any) -> bool:
    """Whether this worker runs the study's final comparison: True for exactly one worker per round of trials.

    A worker claims it when no trial of the study is still running (it is the last to finish) by
    creating the marker study ``<study>/final-comparison/<complete trials>`` in the same storage: the
    storage's unique study names make the claim atomic across processes and machines, and a resumed
    study with more trials is compared again.
    """
    import optuna
    from optuna.trial import TrialState

    optuna.storages.fail_stale_trials(study)  # a dead worker's trial is not "still running" (with heartbeats)
    if study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        return False  # another worker is still at it; the last one to finish compares
    done = len(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)))
    try:
        study._storage.create_new_study(
            directions=[optuna.study.StudyDirection.MAXIMIZE], study_name=f"{study.study_name}/final-comparison/{done}"
        )
    except optuna.exceptions.DuplicatedStudyError:
        return False
    return True


def _choose(
    cfg: PlanTuningConfig,
    study: Any,
    ranking: list[dict[str, Any]],
    temperature: float,
    evaluator: Any,
    engine: Any,
    prompts: list[str] | None,
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """``(comparison rows, chosen plan)``: the interleaved re-measurement of the finalists when this worker
    runs it, else the study's median ranking (with the predicted objective's figures for the finalists).
    """
    finalists = [r["plan"] for r in ranking[: cfg.finalists]]
    if cfg.objective == "measured" and cfg.compare and claim_final_comparison(study):
        # Re-measure the finalists with the defaults, interleaved: the study's values were taken at
        # different times, and on a busy machine the best of them is often the luckiest.
        plans = _distinct_for(temperature, [*finalists, *cfg.default_plans])
        rows = compare_plans(
            engine, prompts, plans, temperature, cfg.max_new_tokens, cfg.repeats, cfg.seed, cfg.progress
        )
        pick = max((r for r in rows if r["plan"] != "autoregressive"), key=lambda r: r["tokens_per_s"])
        chosen = {k: pick[k] for k in ("plan", "tokens_per_s", "speedup_vs_ar", "block_efficiency")}
        chosen["selected_by"] = f"interleaved re-measurement of the top {len(finalists)} plans and the defaults"
        return rows, chosen
    rows = []
    if cfg.objective == "predicted":  # the table's predictions for the finalists and the defaults
        for plan in dict.fromkeys([*finalists, *cfg.default_plans]):
            predicted = evaluator(Plan.parse(plan))
            if predicted is not None:
                rows.append({"plan": plan, **predicted})
    top = ranking[0]
    chosen = {"plan": top["plan"], "tokens_per_s": top["median"], "speedup_vs_ar": None}
    how = "median over the study's trials"
    if cfg.objective == "measured" and cfg.compare:
        how += " (the final comparison is another worker's)"
    chosen.update(block_efficiency=top["block_efficiency"], selected_by=how)
    return rows, chosen


def _write_outputs(
    cfg: PlanTuningConfig,
    study: Any,
    section: dict[str, Any],
    ranking: list[dict[str, Any]],
    temperature: float,
    prompts: list[str] | None,
) -> None:
    """Write the chosen plan to best-static and the study's plots, as ``cfg`` asks; note the paths in ``section``."""
    from adaptive_spec.planner.presets import best_static_path, write_best_static
    from adaptive_spec.temperatures import temperature_key
    from adaptive_spec.tuning.report import plot_comparison, plot_study

    key, name, chosen, rows = temperature_key(temperature), study.study_name, section["chosen"], section["comparison"]
    info = section["study"]
    entry = {
        "plan": chosen["plan"],
        "tokens_per_s": round(float(chosen["tokens_per_s"]), 3),
        "speedup_vs_ar": None if chosen["speedup_vs_ar"] is None else round(chosen["speedup_vs_ar"], 3),
        "block_efficiency": round(float(chosen["block_efficiency"]), 3),
        "selected_by": chosen["selected_by"],
        "objective": cfg.objective,
        "study": name,
        "storage": cfg.storage,
        "study_best": {
            "plan": ranking[0]["plan"],
            "median": round(ranking[0]["median"], 3),
            "trials": ranking[0]["trials"],
        },
        "n_complete": info["states"].get("COMPLETE", 0),
        "settings": _fingerprint(cfg, temperature, prompts),
        "comparison": {r["plan"]: round(float(r["tokens_per_s"]), 3) for r in rows},
    }
    if cfg.write_config:  # tuned on a GPU: that device's own section of the file (read first there)
        from adaptive_spec.options import device_type

        device = device_type(cfg.device)
        entry["device"] = device
        path = best_static_path(cfg.config_out)
        section["best_static"] = str(write_best_static(temperature, entry, path, device=device))
    if cfg.write_report:
        report_dir = _report_dir(cfg)
        section["plots"] = plot_study(study, report_dir, prefix=f"T{key}_", groups=PLAN_PARAM_GROUPS)
        if rows:
            file = f"T{key}_comparison.png"
            title = f"{name}: chosen plan (orange), finalists and defaults, {cfg.objective} tokens/s"
            plot_comparison(rows, title, report_dir / file, highlight=chosen["plan"])
            section["plots"]["comparison"] = file


def _print_section(
    key: str,
    name: str,
    ranking: list[dict[str, Any]],
    chosen: dict[str, Any],
    rows: list[dict[str, Any]],
    objective: str,
) -> None:
    top = ranking[0]
    print(
        f"\ntemperature {key} (study {name}): study's best {top['plan']} at {top['median']:.1f} tokens/s "
        f"({objective}, median of {len(top['trials'])} trial(s)); chosen: {chosen['plan']} "
        f"at {chosen['tokens_per_s']:.1f} tokens/s ({chosen['selected_by']})"
    )
    if rows:
        print(f"  {'method':<30} {'tok/s':>8} {'vs AR':>6}")
        for r in rows:
            vs = r.get("speedup_vs_ar")
            print(f"  {r['plan']:<30} {r['tokens_per_s']:8.1f} {'-' if vs is None else format(vs, '6.2f'):>6}")
