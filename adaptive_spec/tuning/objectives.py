"""Objectives of ``tune plans``: the tokens/s of a static plan, measured or predicted.

:class:`MeasuredTokensPerSecond` runs the engine on a prompt set: every repeat generates
``max_new_tokens`` after each prompt (prompt ``i`` with seed ``seed + i``, the same seeds for
every plan and repeat, so plans are compared on the same random draws), and the repeat's figure
is its total new tokens over its total wall time; the objective is the median over repeats.
Each evaluation starts with one short warm-up generation with the plan.

:class:`PredictedTokensPerSecond` reads the answer off a label table
(:mod:`adaptive_spec.formats.label_table`): the mean, over the table's contexts at the temperature
(its ``temperature`` feature column), of ``tokens_per_s`` for the plan's action. A plan that is not
among the table's actions cannot be predicted: the evaluator returns None and the objective
*prunes* the trial (``optuna.TrialPruned``) with the reason in the ``fail_reason`` user attribute.
Pruning, rather than failing, lets the TPE sampler count the point as poor and move away from it
(failed trials are ignored by the sampler, which would propose them again).

:class:`PlanObjective` is ``objective(trial) -> float``: it samples the plan from
:mod:`adaptive_spec.tuning.space` and stores the plan string, the worker and the evaluator's
figures (block efficiency, per-repeat tokens/s) as the trial's user attributes. A sampled plan over
the node budget (:data:`~adaptive_spec.tuning.space.MAX_NODES`) is pruned before anything runs.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from adaptive_spec.planner.plan import Plan
from adaptive_spec.tuning.space import GREEDY, OverBudgetError, suggest_plan

if TYPE_CHECKING:
    import optuna

    from adaptive_spec.formats.label_table import LabelTable

__all__ = ["MeasuredTokensPerSecond", "PlanObjective", "PredictedTokensPerSecond"]

Evaluator = Callable[[Plan | None], dict[str, Any] | None]


@dataclass
class MeasuredTokensPerSecond:
    """Measured tokens/s of a plan (None: autoregressive decoding with the target).

    Args:
        engine: a :class:`~adaptive_spec.engine.SpecEngine`.
        prompts: the prompt set (text).
        temperature: sampling temperature (0 = greedy).
        max_new_tokens: new tokens per prompt.
        repeats: passes over the prompt set; the objective is their median.
        seed: prompt ``i`` is generated with seed ``seed + i``.
        progress: show a progress bar over repeats x prompts.
    """

    engine: Any
    prompts: Sequence[str]
    temperature: float
    max_new_tokens: int = 64
    repeats: int = 3
    seed: int = 0
    progress: bool = False

    def __post_init__(self) -> None:
        if not self.prompts:
            raise ValueError("the prompt set is empty")
        if self.repeats < 1:
            raise ValueError(f"repeats must be >= 1, got {self.repeats}")

    def __call__(self, plan: Plan | None) -> dict[str, Any]:
        """``{"tokens_per_s": median, "tokens_per_s_repeats": [...], "block_efficiency", "new_tokens"}``."""
        from tqdm.auto import tqdm

        gen = self.engine.generate
        gen(self.prompts[0], max_new_tokens=4, temperature=self.temperature, plan=plan, seed=self.seed)  # warm-up
        per_repeat, tokens, steps = [], 0, 0
        bar = tqdm(
            total=self.repeats * len(self.prompts),
            desc=str(plan or "autoregressive"),
            leave=False,
            disable=not self.progress,
        )
        for _ in range(self.repeats):
            rep_tokens, rep_seconds = 0, 0.0
            for i, prompt in enumerate(self.prompts):
                stats = gen(
                    prompt,
                    max_new_tokens=self.max_new_tokens,
                    temperature=self.temperature,
                    plan=plan,
                    seed=self.seed + i,
                ).stats
                rep_tokens += stats.new_tokens
                rep_seconds += stats.wall_time_s
                steps += stats.steps
                bar.update()
            tokens += rep_tokens
            per_repeat.append(rep_tokens / rep_seconds)
        bar.close()
        return {
            "tokens_per_s": statistics.median(per_repeat),
            "tokens_per_s_repeats": per_repeat,
            "block_efficiency": tokens / steps if steps else 0.0,
            "new_tokens": tokens // self.repeats,
        }


@dataclass
class PredictedTokensPerSecond:
    """Predicted tokens/s of a plan: the label table's mean ``tokens_per_s`` at the temperature.

    At temperature 0 the engine verifies greedily whatever the plan says, so a greedy plan
    (``chain:4/greedy``) reads the table's column of that name or, when the table has none, the
    mean of the columns with the same tree shape under any verifier.

    Args:
        table: the label table.
        temperature: select the contexts whose ``temperature`` feature equals this.

    Raises:
        ValueError: the table has no contexts at this temperature (the message lists those it has).
    """

    table: LabelTable
    temperature: float
    _columns: dict[str, list[int]] = field(init=False, repr=False)
    _tps: np.ndarray = field(init=False, repr=False)
    _be: np.ndarray = field(init=False, repr=False)

    def __post_init__(self) -> None:
        from adaptive_spec.formats.features import SCHEMA

        temps = self.table.features[:, SCHEMA.names.index("temperature")]
        rows = np.isclose(temps, self.temperature, rtol=0.0, atol=1e-6)
        if not rows.any():
            have = ", ".join(f"{t:g}" for t in np.unique(np.round(temps, 6))) or "none (empty table)"
            raise ValueError(
                f"the label table has no contexts at temperature {self.temperature:g} (temperatures in it: {have})"
            )
        self._tps = self.table.tokens_per_s[rows].astype(np.float64)  # [n, A]
        self._be = self.table.block_efficiency[rows].astype(np.float64)  # [n, A]
        self._columns = {}  # plan string -> table columns
        same_shape: dict[str, list[int]] = {}
        for j, action in enumerate(self.table.actions):
            plan = Plan.parse(action)
            self._columns.setdefault(str(plan), []).append(j)
            same_shape.setdefault(f"{plan.shape}/{GREEDY}", []).append(j)
        if self.temperature == 0:  # no greedy column for a shape: its columns under any verifier
            for key, cols in same_shape.items():
                self._columns.setdefault(key, cols)

    @property
    def num_contexts(self) -> int:
        return len(self._tps)

    def __call__(self, plan: Plan | None) -> dict[str, Any] | None:
        """``{"tokens_per_s", "block_efficiency", "contexts"}``, or None for a plan the table lacks."""
        if plan is None:
            raise ValueError("the predicted objective has no autoregressive baseline; give a plan")
        cols = self._columns.get(str(plan), [])
        if not cols:
            return None
        tps = self._tps[:, cols]
        if not np.isfinite(tps).any():
            return None
        return {
            "tokens_per_s": float(np.nanmean(tps)),
            "block_efficiency": float(np.nanmean(self._be[:, cols])),
            "contexts": self.num_contexts,
        }


class PlanObjective:
    """``objective(trial) -> float``: sample a static plan and return its tokens/s.

    Args:
        evaluator: :class:`MeasuredTokensPerSecond` or :class:`PredictedTokensPerSecond` (any
            callable ``plan -> dict | None`` with a ``tokens_per_s`` entry).
        temperature: the temperature the plan is tuned for (the search space depends on it).
        worker: index of this worker process, stored with each trial.
    """

    def __init__(self, evaluator: Evaluator, temperature: float, worker: int = 0) -> None:
        self.evaluator = evaluator
        self.temperature = temperature
        self.worker = worker

    def __call__(self, trial: optuna.Trial) -> float:
        import optuna

        trial.set_user_attr("worker", self.worker)
        try:
            plan = suggest_plan(trial, self.temperature)
        except OverBudgetError as err:
            trial.set_user_attr("fail_reason", str(err))
            raise optuna.TrialPruned(str(err)) from None
        trial.set_user_attr("plan", str(plan))
        result = self.evaluator(plan)
        if result is None:
            reason = f"plan {plan} is not among the label table's actions"
            trial.set_user_attr("fail_reason", reason)
            raise optuna.TrialPruned(reason)
        for key, value in result.items():
            if key != "tokens_per_s":
                trial.set_user_attr(key, value)
        return float(result["tokens_per_s"])


def speedup_trial(
    trial: Any, engine: Any, prompts: list, name: str, plan: Any, t: float, args: Any, rows: list
) -> float:
    """Measure ``plan`` and autoregressive decoding interleaved at ``t``; record the row; the speedup.

    The Optuna objective of ``tune policies --optuna`` and ``tune sources``: the trial keeps the
    plan's name and block efficiency as user attributes, and ``rows`` collects the measured row.
    """
    from adaptive_spec.bench.e2e import measure
    from adaptive_spec.temperatures import temperature_key

    res = measure(engine, prompts, {name: plan}, [t], args.max_new_tokens, args.seed, hf=False, progress=False)
    row = res["runs"][temperature_key(t)]["results"][0]
    trial.set_user_attr("plan", name)
    trial.set_user_attr("block_efficiency", row["block_efficiency"])
    rows.append(row)
    return row["speedup_vs_ar"]
