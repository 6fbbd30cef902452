"""Selector training data: the prompt-level split, the best static action and the scores.

Everything here is numpy over a :class:`~adaptive_spec.formats.label_table.LabelTable`; the Lightning
data module (:mod:`adaptive_spec.selector.lit`), the scikit-learn baselines and the report all use
the same split and the same scoring, so their numbers are comparable.

Vocabulary:
    tps: tokens/s of an action at a context, ``block_efficiency / step_time_s``.
    sampling group: the rows sharing ``(temperature, top_p)``; the benchmark picks its best static
        plan per temperature, so the baseline here is per group too.
    best static: per sampling group, the action with the largest *aggregate* tokens/s on the train
        split, ``Σ BE / Σ T`` over the group's rows (what a benchmark of that one plan measures);
        groups absent from train fall back to the best action over all train rows.
    base rate λ: that aggregate tokens/s of the best static action, per group.
    net value: ``(BE_a - λ T_a) / (λ T_static)``, the tokens an action gains over what the best
        static rate earns in the same time, in units of one static step. Choosing
        ``argmax_a BE_a - λ T_a`` at every context maximises the *aggregate* tokens/s (Dinkelbach:
        ``Σ BE / Σ T >= λ`` iff ``Σ (BE - λ T) >= 0``), which a per-context ``argmax BE/T`` does not.
    rel_tps: mean over contexts of ``tps[chosen] / tps[best static]``; agg_rel_tps the ratio of
        sums; the oracle picks the best net value at every context.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from adaptive_spec.formats.features import SCHEMA
from adaptive_spec.formats.label_table import LabelTable

_T = SCHEMA.names.index("temperature")
_TOP_P = SCHEMA.names.index("top_p")


def split_by_prompt(prompt_keys: Sequence[str], val_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Row indices (train, val) with every prompt's rows on one side.

    Prompts are ranked by a seeded SHA-256 of their key and the first ``round(val_fraction * P)``
    (at least one, at most ``P - 1``) go to validation: deterministic, independent of row order.

    Raises:
        ValueError: fewer than two distinct prompts, or ``val_fraction`` outside (0, 1).
    """
    if not 0 < val_fraction < 1:
        raise ValueError(f"val_fraction must be in (0, 1), got {val_fraction}")
    keys = sorted(set(prompt_keys))
    if len(keys) < 2:
        raise ValueError(f"a split by prompt needs >= 2 distinct prompts, the labels have {len(keys)}")
    ranked = sorted(keys, key=lambda k: hashlib.sha256(f"{seed}\0{k}".encode()).hexdigest())
    n_val = min(max(round(val_fraction * len(keys)), 1), len(keys) - 1)
    val_keys = set(ranked[:n_val])
    is_val = np.fromiter((k in val_keys for k in prompt_keys), dtype=bool, count=len(prompt_keys))
    return np.flatnonzero(~is_val), np.flatnonzero(is_val)


def sampling_group(features: np.ndarray) -> list[str]:
    """One ``"T=...,top_p=..."`` key per row of a raw feature matrix [n, F]."""
    return [f"T={float(t):g},top_p={float(p):g}" for t, p in np.round(features[:, [_T, _TOP_P]].astype(np.float64), 4)]


@dataclass
class SelectorSplit:
    """One side of the split, as arrays (n rows, A actions)."""

    features: np.ndarray  # float32 [n, F] raw
    block_efficiency: np.ndarray  # float32 [n, A]
    step_time_s: np.ndarray  # float32 [n, A]
    base_action: np.ndarray  # int64 [n]: the best static action of the row's sampling group
    base_rate: np.ndarray | None = None  # float64 [n]: λ, the group's aggregate train tokens/s of that action
    groups: np.ndarray | None = None  # str [n]: the sampling group of each row
    prompts: np.ndarray | None = None  # str [n]: the prompt key of each row (for grouped cross-validation)
    draft_hidden: np.ndarray | None = None  # float16 [n, Hd]
    target_hidden: np.ndarray | None = None  # float16 [n, Ht]

    def __len__(self) -> int:
        return len(self.features)

    @property
    def tps(self) -> np.ndarray:  # [n, A]
        return self.block_efficiency / self.step_time_s

    @property
    def base_tps(self) -> np.ndarray:  # [n]
        return self.tps[np.arange(len(self)), self.base_action]

    @property
    def rate(self) -> np.ndarray:  # [n] λ per row (the row's own static tokens/s when no group rate is set)
        return self.base_tps.astype(np.float64) if self.base_rate is None else self.base_rate

    @property
    def net_value(self) -> np.ndarray:  # [n, A] (BE - λ T) / (λ T_static), see the module docstring
        rate = self.rate[:, None]
        base_t = self.step_time_s[np.arange(len(self)), self.base_action].astype(np.float64)[:, None]
        return (self.block_efficiency - rate * self.step_time_s) / (rate * base_t)

    @property
    def best_action(self) -> np.ndarray:  # [n] the per-context oracle action (largest net value)
        return self.net_value.argmax(axis=1)

    def group_rows(self) -> list[tuple[str, np.ndarray]]:
        """``(sampling group, its row indices)`` for each group, sorted by group (needs ``groups``)."""
        if self.groups is None:
            raise ValueError("this split has no sampling groups; build it with prepare()")
        return [(g, np.flatnonzero(self.groups == g)) for g in sorted(set(self.groups.tolist()))]

    def subset(self, rows: np.ndarray) -> SelectorSplit:
        """The rows ``rows`` of this split (same base actions and rates)."""
        pick = lambda x: None if x is None else x[rows]  # noqa: E731
        return SelectorSplit(
            self.features[rows],
            self.block_efficiency[rows],
            self.step_time_s[rows],
            self.base_action[rows],
            pick(self.base_rate),
            pick(self.groups),
            pick(self.prompts),
            pick(self.draft_hidden),
            pick(self.target_hidden),
        )

    @property
    def rel_tps(self) -> np.ndarray:  # [n, A] tps relative to the best static action
        return self.tps / self.base_tps[:, None]


def prepare(
    table: LabelTable,
    *,
    val_fraction: float = 0.2,
    seed: int = 0,
    labels: str | Path | Sequence[str | Path] | None = None,
    max_actions: int | None = None,
) -> tuple[SelectorSplit, SelectorSplit, dict[str, Any]]:
    """Split ``table`` by prompt and derive everything training needs from the train side.

    Args:
        max_actions: keep only the actions with the best net value on most train contexts (at most
            this many, plus the best static ones) as candidates, ``spec["candidates"]``; None: all.
            With a few hundred labelled contexts, hundreds of actions mostly fit noise.

    Returns:
        ``(train, val, spec)``; ``spec`` is JSON-serialisable: actions, candidate action indices,
        schema, feature count, hidden widths (0 = absent), train-split feature mean/std, the best
        static action and its aggregate tokens/s per sampling group, the label manifest and the
        split's summary. The model is built from it.

    Raises:
        ValueError: empty table, non-finite or non-positive labels, fewer than two prompts.
    """
    _check_labels(table)
    train_rows, val_rows = split_by_prompt(table.prompt_key, val_fraction, seed)
    groups = np.asarray(sampling_group(table.features))
    overall, best_static, rates = _best_static(table, train_rows, groups)
    base_action = np.array([best_static.get(g, overall) for g in groups], dtype=np.int64)
    base_rate = np.array([rates.get(g, rates[_OVERALL]) for g in groups], dtype=np.float64)
    prompts = np.asarray(table.prompt_key, dtype=object)

    full = SelectorSplit(
        table.features,
        table.block_efficiency,
        table.step_time_s,
        base_action,
        base_rate,
        groups,
        prompts,
        table.draft_hidden,
        table.target_hidden,
    )
    train, val = full.subset(train_rows), full.subset(val_rows)
    candidates = candidate_actions(train, max_actions)
    x = train.features.astype(np.float64)
    spec = {
        "actions": list(table.actions),
        "schema": SCHEMA.to_dict(),
        "num_features": SCHEMA.num_scalar,
        "draft_hidden_dim": 0 if table.draft_hidden is None else int(table.draft_hidden.shape[1]),
        "target_hidden_dim": 0 if table.target_hidden is None else int(table.target_hidden.shape[1]),
        "feature_mean": x.mean(axis=0).tolist(),
        "feature_std": x.std(axis=0).tolist(),
        "candidates": candidates.tolist(),
        "best_static": {g: table.actions[a] for g, a in best_static.items()},
        "best_static_rate": {g: r for g, r in rates.items() if g != _OVERALL},
        "best_static_overall": table.actions[overall],
        "manifest": dict(table.manifest),
        "split": {
            "seed": seed,
            "val_fraction": val_fraction,
            "train_prompts": len({table.prompt_key[i] for i in train_rows}),
            "val_prompts": len({table.prompt_key[i] for i in val_rows}),
            "train_rows": len(train_rows),
            "val_rows": len(val_rows),
        },
        "labels": None
        if labels is None
        else (str(labels) if isinstance(labels, (str, Path)) else [str(p) for p in labels]),
    }
    return train, val, spec


_OVERALL = "__overall__"  # the rate of the best action over every train row, in _best_static's rates


def _check_labels(table: LabelTable) -> None:
    """Refuse an empty table, non-finite or non-positive labels, non-finite features."""
    if len(table) == 0:
        raise ValueError("the label table is empty; label some runs first (adaptive-spec label)")
    be, st = table.block_efficiency, table.step_time_s
    bad = ~(np.isfinite(be) & np.isfinite(st) & (be > 0) & (st > 0))
    if bad.any():
        row = int(np.argwhere(bad)[0, 0])
        raise ValueError(
            f"{int(bad.any(axis=1).sum())} label rows have non-finite or non-positive block_efficiency/step_time_s "
            f"(first: row {row}, prompt {table.prompt_key[row]!r}); fix or drop them before training"
        )
    if not np.isfinite(table.features).all():
        raise ValueError("the label table has non-finite feature values; the selector cannot train on them")


def _best_static(
    table: LabelTable, train_rows: np.ndarray, groups: np.ndarray
) -> tuple[int, dict[str, int], dict[str, float]]:
    """``(overall action, best static action per sampling group, their aggregate tokens/s)`` on the train rows.

    Aggregate tokens/s is a ratio of sums (tokens over time, as measured tokens/s is); the overall
    rate is under the key :data:`_OVERALL`.
    """
    be64, st64 = table.block_efficiency.astype(np.float64), table.step_time_s.astype(np.float64)

    def aggregate_best(rows: np.ndarray) -> tuple[int, float]:
        rates = be64[rows].sum(axis=0) / st64[rows].sum(axis=0)
        a = int(rates.argmax())
        return a, float(rates[a])

    overall, overall_rate = aggregate_best(train_rows)
    best_static: dict[str, int] = {}
    rates: dict[str, float] = {_OVERALL: overall_rate}
    for g in sorted({str(g) for g in groups[train_rows]}):
        best_static[g], rates[g] = aggregate_best(train_rows[groups[train_rows] == g])
    return overall, best_static, rates


def candidate_actions(train: SelectorSplit, max_actions: int | None) -> np.ndarray:
    """Sorted indices of the actions with the best net value on most ``train`` contexts, plus the static ones.

    ``max_actions=None`` keeps every action.
    """
    num_actions = train.block_efficiency.shape[1]
    if max_actions is None or max_actions >= num_actions:
        return np.arange(num_actions, dtype=np.int64)
    if max_actions < 1:
        raise ValueError(f"max_actions must be >= 1 or None, got {max_actions}")
    counts = np.bincount(train.best_action, minlength=num_actions)
    ranked = [int(a) for a in np.argsort(-counts, kind="stable") if counts[a] > 0][:max_actions]
    return np.array(sorted(set(ranked) | {int(a) for a in np.unique(train.base_action)}), dtype=np.int64)


def oracle_choices(data: SelectorSplit, iterations: int = 50) -> np.ndarray:
    """The choices that maximise each sampling group's aggregate tokens/s on ``data`` itself, int64 [n].

    Dinkelbach's iteration per group: pick ``argmax_a BE_a - λ T_a`` per row, set ``λ`` to the
    picks' ``Σ BE / Σ T``, repeat until the picks stop changing (``λ`` rises monotonically).
    The upper bound of any selector's ``agg_rel_tps`` on ``data``.
    """
    be, st = data.block_efficiency.astype(np.float64), data.step_time_s.astype(np.float64)
    groups = data.group_rows() if data.groups is not None else [("all", np.arange(len(data)))]
    out = np.zeros(len(data), dtype=np.int64)
    for _, rows in groups:
        pick = data.base_action[rows]
        for _ in range(iterations):
            rate = be[rows, pick].sum() / st[rows, pick].sum()
            new = (be[rows] - rate * st[rows]).argmax(axis=1)
            if np.array_equal(new, pick):
                break
            pick = new
        out[rows] = pick
    return out


def score_by_group(choices: np.ndarray, data: SelectorSplit) -> dict[str, dict[str, float]]:
    """:func:`score_choices` per sampling group (needs ``data.groups``), plus the rows per group."""
    choices = np.asarray(choices, dtype=np.int64).reshape(-1)
    return {g: {**score_choices(choices[rows], data.subset(rows)), "rows": len(rows)} for g, rows in data.group_rows()}


def score_choices(choices: np.ndarray, data: SelectorSplit) -> dict[str, float]:
    """How good the chosen action per row is.

    Returns:
        ``rel_tps``: mean over rows of ``tps[choice] / tps[best static]``;
        ``agg_rel_tps``: ``(Σ BE[choice] / Σ T[choice]) / (Σ BE[static] / Σ T[static])``, the
        ratio of the whole split's tokens/s (slow steps weigh more);
        ``accuracy``: share of rows where the choice is the per-context best action.
    """
    choices = np.asarray(choices, dtype=np.int64).reshape(-1)
    if choices.shape != (len(data),):
        raise ValueError(f"need one choice per row ({len(data)}), got {choices.shape[0]}")
    rows = np.arange(len(data))
    be, st = data.block_efficiency.astype(np.float64), data.step_time_s.astype(np.float64)
    base = data.base_action
    agg = (be[rows, choices].sum() / st[rows, choices].sum()) / (be[rows, base].sum() / st[rows, base].sum())
    return {
        "rel_tps": float(data.rel_tps[rows, choices].mean()),
        "agg_rel_tps": float(agg),
        "accuracy": float((choices == data.best_action).mean()),
    }
