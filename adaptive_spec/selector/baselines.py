"""scikit-learn baselines for the selector, on the same scalar features and the same split.

- ``hgb``: one ``HistGradientBoostingRegressor`` per candidate action on its net value
  (:attr:`~adaptive_spec.selector.datamodule.SelectorSplit.net_value`: the tokens gained over the best
  static rate, in static steps, so that sampling groups share a scale); the choice is the argmax
  prediction. Candidates: the ``max_actions`` actions most often best per context on the train
  split, plus the best static ones (an action space of hundreds would otherwise mean hundreds of fits).
- ``logistic``: a standardised multinomial ``LogisticRegression`` on the per-context best action.

Hidden states are not used (hundreds of float16 columns per block would dominate the fit time);
the neural selector's report says whether it used them.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from tqdm.auto import tqdm

from adaptive_spec.selector.datamodule import SelectorSplit, candidate_actions, score_choices

BASELINES = ("hgb", "logistic")


def fit_predict(
    name: str,
    train: SelectorSplit,
    val: SelectorSplit,
    *,
    seed: int = 0,
    max_iter: int = 100,
    max_actions: int = 32,
    progress: bool = True,
) -> np.ndarray:
    """Fit baseline ``name`` on ``train``; return its chosen action per ``val`` row, int64 [n_val]."""
    if name == "hgb":
        from sklearn.ensemble import HistGradientBoostingRegressor

        target = train.net_value  # [n, A]
        actions = candidate_actions(train, max_actions)
        preds = np.empty((len(val), len(actions)), np.float64)
        for j, a in enumerate(tqdm(actions, desc="hgb per action", disable=not progress, leave=False)):
            reg = HistGradientBoostingRegressor(max_iter=max_iter, random_state=seed, early_stopping=False)
            preds[:, j] = reg.fit(train.features, target[:, a]).predict(val.features)
        return actions[preds.argmax(axis=1)]
    if name == "logistic":
        from sklearn.linear_model import LogisticRegression
        from sklearn.pipeline import make_pipeline
        from sklearn.preprocessing import StandardScaler

        labels = train.best_action
        if len(np.unique(labels)) < 2:  # one class only: that class is the prediction
            return np.full(len(val), labels[0], dtype=np.int64)
        clf = make_pipeline(StandardScaler(), LogisticRegression(max_iter=max(max_iter, 200), random_state=seed))
        clf.fit(train.features, labels)
        return np.asarray(clf.predict(val.features), dtype=np.int64)
    raise ValueError(f"unknown baseline {name!r}; use one of {', '.join(BASELINES)}")


def run_baselines(
    train: SelectorSplit,
    val: SelectorSplit,
    names: Sequence[str] = BASELINES,
    *,
    seed: int = 0,
    max_iter: int = 100,
    max_actions: int = 32,
    progress: bool = True,
) -> dict[str, dict[str, float]]:
    """Scores (:func:`~adaptive_spec.selector.datamodule.score_choices`) of each baseline on ``val``."""
    return {
        name: score_choices(
            fit_predict(name, train, val, seed=seed, max_iter=max_iter, max_actions=max_actions, progress=progress),
            val,
        )
        for name in names
    }


def predictability(data: SelectorSplit, *, folds: int = 5, seed: int = 0, max_iter: int = 100) -> dict[str, float]:
    """Cross-validated R² of the best static action's E[τ+1] from the scalar features, per sampling group.

    Gradient-boosted trees, folds grouped by prompt (needs ``data.prompts``). Near 0 means the
    features do not predict how many tokens a step will accept, so no selector on them can beat
    the static plan in that group by much; groups with fewer than ``2 * folds`` prompts are skipped.
    """
    from sklearn.ensemble import HistGradientBoostingRegressor
    from sklearn.model_selection import GroupKFold, cross_val_predict

    if data.groups is None or data.prompts is None:
        raise ValueError("predictability needs a split from prepare() (sampling groups and prompt keys)")
    out: dict[str, float] = {}
    for g, rows in data.group_rows():
        if len(set(data.prompts[rows].tolist())) < 2 * folds:
            continue
        y = data.block_efficiency[rows, data.base_action[rows]].astype(np.float64)
        if y.std() == 0:
            out[g] = 1.0  # a constant is predicted exactly
            continue
        reg = HistGradientBoostingRegressor(
            max_iter=max_iter, learning_rate=0.05, max_depth=3, min_samples_leaf=20, random_state=seed
        )
        pred = cross_val_predict(reg, data.features[rows], y, groups=data.prompts[rows], cv=GroupKFold(folds))
        out[g] = float(1 - ((y - pred) ** 2).mean() / y.var())
    return out
