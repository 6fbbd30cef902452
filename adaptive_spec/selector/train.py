r"""``adaptive-spec selector train``: train the selector with LightningCLI, then write the report.

Every argument after ``selector train`` goes to LightningCLI unchanged (its ``--help`` included)::

    adaptive-spec selector train --config configs/selector/default.yaml --data.labels runs/labels
    adaptive-spec selector train --config configs/selector/default.yaml --config configs/selector/ddp.yaml \
        --data.labels runs/labels --trainer.max_epochs 5

The run directory is the logger's (CSV logs under ``trainer.default_root_dir``, ``version_N``):
checkpoints, ``config.yaml``, ``metrics.csv`` and ``report/`` (JSON, Markdown, PNG) comparing the
neural selector with the scikit-learn baselines, the best static action and the oracle on the
validation prompts. Under DDP only rank 0 writes the report.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import lightning as L  # noqa: N812 (Lightning's own convention)
import numpy as np
import torch
from lightning.pytorch.cli import LightningCLI
from lightning.pytorch.loggers import CSVLogger

from adaptive_spec.selector.baselines import BASELINES, predictability, run_baselines
from adaptive_spec.selector.datamodule import SelectorSplit, oracle_choices, score_by_group, score_choices
from adaptive_spec.selector.lit import HistoryCallback, SelectorDataModule, SelectorModule

DEFAULT_ROOT = "runs/selector"


class SelectorCLI(LightningCLI):
    """LightningCLI over :class:`SelectorModule` / :class:`SelectorDataModule`, plus report options."""

    def add_arguments_to_parser(self, parser) -> None:
        parser.link_arguments("data.spec", "model.data_spec", apply_on="instantiate")
        parser.add_argument("--report", type=bool, default=True, help="write the training report after fitting")
        parser.add_argument(
            "--baselines",
            type=list[str],
            default=list(BASELINES),
            help=f"scikit-learn baselines in the report, from {list(BASELINES)} (empty: none)",
        )
        parser.add_argument("--baseline_max_iter", type=int, default=100, help="boosting rounds / solver iterations")
        parser.add_argument(
            "--min_gain",
            type=float,
            default=0.0,
            help="the exported selector plays the best static action in a sampling group unless the network's "
            "validation tokens/s, at the --gain_quantile of a bootstrap over validation prompts, is at least "
            "(1 + min_gain) x the static action's (report: static_groups); -1 disables the fallback",
        )
        parser.add_argument(
            "--gain_quantile",
            type=float,
            default=0.1,
            help="quantile of the bootstrap that must clear 1 + min_gain (0.5: the median; default 0.1)",
        )

    def instantiate_trainer(self, **kwargs: Any) -> L.Trainer:
        trainer = self.config.trainer
        if trainer.logger is None or trainer.logger is True:  # default: CSV logs in the run directory
            kwargs.setdefault("logger", CSVLogger(save_dir=trainer.default_root_dir or DEFAULT_ROOT, name=""))
        return super().instantiate_trainer(**kwargs)


def main(args: list[str] | None = None) -> dict[str, Any] | None:
    """Train from LightningCLI arguments (``None``: ``sys.argv``); return the report on rank 0."""
    # `adaptive-spec selector train ARGS` passes ARGS while sys.argv still holds them: not a mistake here.
    # (sys.argv must stay as it is: DDP's launcher starts the other ranks with it.)
    warnings.filterwarnings("ignore", message="LightningCLI's args parameter is intended")
    cli = SelectorCLI(
        SelectorModule,
        SelectorDataModule,
        run=False,
        args=args,
        save_config_kwargs={"overwrite": True},
        trainer_defaults={"callbacks": [HistoryCallback()]},
        parser_kwargs={"prog": "adaptive-spec selector train"},
    )
    trainer, model, dm = cli.trainer, cli.model, cli.datamodule
    trainer.fit(model, datamodule=dm)
    run_dir = Path(trainer.log_dir or trainer.default_root_dir)  # a collective under DDP: every rank calls it
    if not trainer.is_global_zero or not cli.config.report:
        return None
    trainer_info = {
        "world_size": trainer.world_size,
        "strategy": type(trainer.strategy).__name__,
        "epochs": trainer.current_epoch,
        "global_step": trainer.global_step,
        "run_dir": str(run_dir),
    }
    history = next((c.history for c in trainer.callbacks if isinstance(c, HistoryCallback)), [])
    ckpt = trainer.checkpoint_callback
    best = ckpt.best_model_path if ckpt is not None and ckpt.best_model_path else None
    if best:  # score the checkpoint the export will use
        model = SelectorModule.load_from_checkpoint(best, map_location="cpu")
    return build_report(
        model,
        dm,
        run_dir / "report",
        history=history,
        checkpoint=best,
        trainer_info=trainer_info,
        baselines=cli.config.baselines,
        baseline_max_iter=cli.config.baseline_max_iter,
        seed=int(cli.config.seed_everything or 0),
        min_gain=cli.config.min_gain,
        gain_quantile=cli.config.gain_quantile,
    )


@torch.no_grad()
def predict(model: SelectorModule, data: SelectorSplit, batch_size: int = 4096) -> np.ndarray:
    """The network's argmax action per row of ``data``, int64 [n] (CPU, eval mode)."""
    net = model.net.to("cpu").eval()
    out = []
    for i in range(0, len(data), batch_size):
        inputs = {"features": torch.from_numpy(data.features[i : i + batch_size]).float()}
        for name in net.input_names[1:]:
            inputs[name] = torch.from_numpy(getattr(data, name)[i : i + batch_size]).float()
        out.append(net(**inputs).argmax(dim=-1).numpy())
    return np.concatenate(out) if out else np.zeros(0, np.int64)


def build_report(
    model: SelectorModule,
    dm: SelectorDataModule,
    out_dir: Path,
    *,
    history: list[dict[str, float]],
    checkpoint: str | None,
    baselines: list[str],
    trainer_info: dict[str, Any] | None = None,
    baseline_max_iter: int = 100,
    seed: int = 0,
    min_gain: float = 0.0,
    gain_quantile: float = 0.1,
    bootstrap: int = 1000,
) -> dict[str, Any]:
    """Score neural vs baselines vs best static vs oracle on the val split; write the report files.

    Also decides the *static groups*. Per sampling group, the validation prompts are resampled with
    replacement ``bootstrap`` times and the network's aggregate tokens/s relative to the best static
    action's is computed on each resample; where its ``gain_quantile`` quantile is below
    ``1 + min_gain`` (the gain is not sure enough: with tens of prompts a 2% "gain" is often noise),
    or the group has no validation rows, the exported selector plays the static action (see
    :meth:`~adaptive_spec.selector.runtime.SelectorRuntime.static_plan_for`). ``adaptive`` in the
    scores is the network with that fallback.
    """
    from adaptive_spec.selector.report import write_report

    train, val = dm.train_split, dm.val_split
    choices = predict(model, val)
    actions = model.actions
    spec = model.hparams.data_spec
    scores = {"neural": score_choices(choices, val)}
    scores.update(run_baselines(train, val, baselines, seed=seed, max_iter=baseline_max_iter))
    scores["best_static"] = score_choices(val.base_action, val)
    try:  # how well the features predict the static action's acceptance, per temperature (train split)
        r2 = predictability(train, seed=seed, max_iter=baseline_max_iter)
    except ValueError:
        r2 = {}
    oracle = oracle_choices(val)
    scores["oracle"] = score_choices(oracle, val)
    groups = score_by_group(choices, val)
    for g, best in score_by_group(oracle, val).items():
        groups[g]["oracle_agg_rel_tps"] = best["agg_rel_tps"]
        if g in r2:
            groups[g]["static_be_r2"] = r2[g]
    for g, q in bootstrap_quantiles(choices, val, gain_quantile, bootstrap, seed).items():
        groups[g]["agg_rel_tps_quantile"] = q
    static_groups = {
        g: a
        for g, a in spec["best_static"].items()
        if min_gain >= 0 and (g not in groups or groups[g]["agg_rel_tps_quantile"] < 1 + min_gain)
    }
    static_rows = np.isin(val.groups, list(static_groups)) if static_groups else np.zeros(len(val), bool)
    adaptive = np.where(static_rows, val.base_action, choices)
    scores = {"adaptive": score_choices(adaptive, val), **scores}
    counts = np.bincount(choices, minlength=len(actions))
    report = {
        "checkpoint": checkpoint,
        "trainer": trainer_info or {},
        "labels": spec.get("labels"),
        "split": spec["split"],
        "best_static": spec["best_static"],
        "use_hidden": bool(model.hparams.use_hidden),
        "hparams": {k: v for k, v in model.hparams.items() if k != "data_spec"},
        "scores": scores,
        "groups": groups,
        "min_gain": min_gain,
        "gain_quantile": gain_quantile,
        "static_groups": static_groups,
        "candidates": [actions[i] for i in model.net.candidates],
        "neural_action_share": {a: float(c / max(1, len(choices))) for a, c in zip(actions, counts, strict=True)},
        "history": history,
    }
    report["files"] = write_report(report, out_dir)
    return report


def bootstrap_quantiles(
    choices: np.ndarray, data: SelectorSplit, quantile: float, resamples: int = 1000, seed: int = 0
) -> dict[str, float]:
    """Per sampling group: the ``quantile`` of ``agg_rel_tps`` over resamples of the group's prompts.

    Each resample draws the group's prompts with replacement (rows of a prompt stay together: they
    are not independent) and scores the ``choices`` on their rows as a ratio of sums.
    """
    if not 0 < quantile < 1:
        raise ValueError(f"gain_quantile must be in (0, 1), got {quantile}")
    if data.groups is None or data.prompts is None:
        raise ValueError("bootstrap_quantiles needs a split from prepare() (sampling groups and prompt keys)")
    rng = np.random.default_rng(seed)
    be, st = data.block_efficiency.astype(np.float64), data.step_time_s.astype(np.float64)
    rows_all = np.arange(len(data))
    tok_c, time_c = be[rows_all, choices], st[rows_all, choices]
    tok_s, time_s = be[rows_all, data.base_action], st[rows_all, data.base_action]
    out = {}
    for g, rows in data.group_rows():
        keys, inverse = np.unique(data.prompts[rows].astype(str), return_inverse=True)
        # Per prompt sums; a resample's totals are weighted sums of them (weight = times drawn).
        sums = np.stack([np.bincount(inverse, w[rows], len(keys)) for w in (tok_c, time_c, tok_s, time_s)])
        weights = rng.multinomial(len(keys), np.full(len(keys), 1 / len(keys)), size=resamples)  # [R, P]
        t = weights @ sums.T  # [R, 4]
        ratios = (t[:, 0] / t[:, 1]) / (t[:, 2] / t[:, 3])
        out[g] = float(np.quantile(ratios, quantile))
    return out


def shipped_configs(argv: list[str]) -> list[str]:
    """``argv`` with every ``--config configs/...`` that does not exist here pointing at the package's copy.

    So ``--config configs/selector/default.yaml`` works from any directory and from an installed wheel.
    """
    from adaptive_spec.files import resolve_config

    out = list(argv)
    for i, arg in enumerate(out):
        if arg == "--config" and i + 1 < len(out):
            out[i + 1] = str(resolve_config(out[i + 1]))
        elif arg.startswith("--config="):
            out[i] = "--config=" + str(resolve_config(arg.split("=", 1)[1]))
    return out
