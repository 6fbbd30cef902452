"""Selector training data: the prompt-level split, the best static action and the scores.

Everything here is numpy over a :class:`~adaptive_spec.data.label_table.LabelTable`; the Lightning
data module (:mod:`adaptive_spec.selector.lit`), the scikit-learn baselines and the report all use
the same split and the same scoring, so their numbers are comparable.

Vocabulary:
    tps: tokens/s of an action at a context, ``block_efficiency / step_time_s``.
    sampling group: the rows sharing ``(temperature, top_p)``; the benchmark picks its best static
        plan per temperature, so the baseline here is per group too.
    best static: per sampling group, the action with the largest mean tps on the *train* split
        (groups absent from train fall back to the best action over all train rows).
    rel_tps: mean over contexts of ``tps[chosen] / tps[best static]``; the oracle picks
        ``argmax_a tps`` at every context.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from adaptive_spec.data.label_table import LabelTable
from adaptive_spec.selector.features import SCHEMA

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
    def best_action(self) -> np.ndarray:  # [n] the per-context oracle action
        return self.tps.argmax(axis=1)

    @property
    def rel_tps(self) -> np.ndarray:  # [n, A] tps relative to the best static action
        return self.tps / self.base_tps[:, None]


def prepare(
    table: LabelTable, *, val_fraction: float = 0.2, seed: int = 0, labels: str | Path | None = None
) -> tuple[SelectorSplit, SelectorSplit, dict[str, Any]]:
    """Split ``table`` by prompt and derive everything training needs from the train side.

    Returns:
        ``(train, val, spec)``; ``spec`` is JSON-serialisable: actions, schema, feature count,
        hidden widths (0 = absent), train-split feature mean/std, the best static action per sampling
        group, the label manifest and the split's summary. The model is built from it.

    Raises:
        ValueError: empty table, non-finite or non-positive labels, fewer than two prompts.
    """
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
    train_rows, val_rows = split_by_prompt(table.prompt_key, val_fraction, seed)
    groups = np.asarray(sampling_group(table.features))
    tps = be / st
    overall = int(tps[train_rows].mean(axis=0).argmax())
    best_static: dict[str, int] = {}
    for g in sorted({str(g) for g in groups[train_rows]}):
        rows = train_rows[groups[train_rows] == g]
        best_static[g] = int(tps[rows].mean(axis=0).argmax())
    base_action = np.array([best_static.get(g, overall) for g in groups], dtype=np.int64)

    def side(rows: np.ndarray) -> SelectorSplit:
        pick = lambda x: None if x is None else x[rows]  # noqa: E731
        return SelectorSplit(
            table.features[rows], be[rows], st[rows], base_action[rows], pick(table.draft_hidden),
            pick(table.target_hidden),
        )  # fmt: skip

    train, val = side(train_rows), side(val_rows)
    x = train.features.astype(np.float64)
    spec = {
        "actions": list(table.actions),
        "schema": SCHEMA.to_dict(),
        "num_features": SCHEMA.num_scalar,
        "draft_hidden_dim": 0 if table.draft_hidden is None else int(table.draft_hidden.shape[1]),
        "target_hidden_dim": 0 if table.target_hidden is None else int(table.target_hidden.shape[1]),
        "feature_mean": x.mean(axis=0).tolist(),
        "feature_std": x.std(axis=0).tolist(),
        "best_static": {g: table.actions[a] for g, a in best_static.items()},
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
        "labels": None if labels is None else str(labels),
    }
    return train, val, spec


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
