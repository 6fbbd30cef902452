r"""Tune the selector's hyper-parameters with Optuna, pruning on the validation metric.

Each trial trains :class:`~adaptive_spec.selector.lit.SelectorModule` on one
:class:`~adaptive_spec.selector.lit.SelectorDataModule` (the label table is read once, the split
by prompt is fixed by ``split_seed``) for ``max_epochs`` epochs, with the weights initialised
from the same seed in every trial, so trials differ only by their hyper-parameters
(:data:`~adaptive_spec.tuning.space.SELECTOR_SPACE`). The selector logs ``val/agg_rel_tps`` (the
tokens/s of its choices relative to the best static action's, as a ratio of sums over the
validation prompts: what a benchmark measures) every epoch;
``optuna_integration.PyTorchLightningPruningCallback`` reports it to the trial and a
:class:`optuna.pruners.MedianPruner` stops trials that fall below the median of earlier ones at
the same epoch. A trial's value is its best epoch's ``val/agg_rel_tps`` (the epoch
``selector train``'s checkpoint callback would keep).

Output: the study (any SQLAlchemy storage, resumable), and in the report folder ``summary.json``,
Optuna's plots and ``best-selector.yaml``, a LightningCLI config fragment::

    adaptive-spec selector train --config configs/selector/default.yaml \
        --config data/tuning/reports/selector/best-selector.yaml --data.labels DIR
"""

from __future__ import annotations

import logging
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from adaptive_spec.files import atomic_write
from adaptive_spec.tuning.storage import DEFAULT_GRACE_S, DEFAULT_HEARTBEAT_S, DEFAULT_STORAGE

__all__ = ["MONITOR", "SelectorTuningConfig", "tune_selector"]

MONITOR = "val/agg_rel_tps"  # logged by SelectorModule at each validation epoch's end; higher is better
log = logging.getLogger(__name__)


@dataclass
class SelectorTuningConfig:
    """Settings of ``tune selector`` (the CLI's options).

    Attributes:
        labels: label table directory or file.
        storage: SQLAlchemy URL of the study storage.
        study: study name.
        n_trials: trials this worker runs (the enqueued default included).
        timeout: seconds this worker spends at most (None: no limit).
        max_epochs: training epochs per trial.
        val_fraction, split_seed, batch_size: the data module's split and batches.
        seed: weight-initialisation seed (the same for every trial) and the sampler's base seed.
        worker: index of this worker process; parallel workers need distinct indices.
        accelerator: Lightning accelerator (``auto``, ``cpu``, ``gpu``).
        pruner_startup_trials: complete trials before the median pruner prunes.
        pruner_warmup_epochs: epochs of every trial that are never pruned.
        heartbeat_interval, grace_period: seconds (see :mod:`adaptive_spec.tuning.storage`).
        enqueue: enqueue :data:`~adaptive_spec.tuning.space.SELECTOR_KNOWN_GOOD` first (worker 0).
        report: report folder (None: ``<sqlite folder>/reports/<study>``).
        write_report: write the report and ``best-selector.yaml``.
        progress: show Optuna's progress bar.
    """

    labels: str
    storage: str = DEFAULT_STORAGE
    study: str = "selector"
    n_trials: int = 20
    timeout: float | None = None
    max_epochs: int = 20
    val_fraction: float = 0.2
    split_seed: int = 0
    batch_size: int = 256
    seed: int = 0
    worker: int = 0
    accelerator: str = "auto"
    pruner_startup_trials: int = 3
    pruner_warmup_epochs: int = 2
    heartbeat_interval: int = DEFAULT_HEARTBEAT_S
    grace_period: int = DEFAULT_GRACE_S
    enqueue: bool = True
    report: str | None = None
    write_report: bool = True
    progress: bool = True

    def __post_init__(self) -> None:
        if self.n_trials < 0 or self.max_epochs < 1 or self.batch_size < 1:
            raise ValueError("n_trials must be >= 0, max_epochs and batch_size >= 1")
        if not 0 < self.val_fraction < 1:
            raise ValueError(f"val_fraction must lie in (0, 1), got {self.val_fraction}")


def _report_dir(cfg: SelectorTuningConfig) -> Path:
    from adaptive_spec.tuning.storage import report_dir

    return report_dir(cfg.report, cfg.storage, cfg.study)


class SelectorObjective:
    """``objective(trial) -> float``: train the selector with the trial's hyper-parameters.

    Args:
        datamodule: the :class:`~adaptive_spec.selector.lit.SelectorDataModule` (shared by trials).
        cfg: the tuning settings (epochs, seed, accelerator).
    """

    def __init__(self, datamodule: Any, cfg: SelectorTuningConfig) -> None:
        self.datamodule = datamodule
        self.cfg = cfg

    def __call__(self, trial: Any) -> float:
        import lightning as L  # noqa: N812 (Lightning's own convention)
        from optuna_integration import PyTorchLightningPruningCallback

        from adaptive_spec.selector.lit import HistoryCallback, SelectorModule
        from adaptive_spec.tuning.space import suggest_selector_hparams

        hparams = suggest_selector_hparams(trial)
        trial.set_user_attr("worker", self.cfg.worker)
        L.seed_everything(self.cfg.seed, workers=True, verbose=False)
        model = SelectorModule(data_spec=self.datamodule.spec, **hparams)
        history = HistoryCallback()
        trainer = L.Trainer(
            max_epochs=self.cfg.max_epochs,
            accelerator=self.cfg.accelerator,
            devices=1,
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            num_sanity_val_steps=0,
            callbacks=[history, PyTorchLightningPruningCallback(trial, monitor=MONITOR)],
        )
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*(does not have many workers|GPU available but not used).*")
            trainer.fit(model, datamodule=self.datamodule)
        curve = [row[MONITOR] for row in history.history if MONITOR in row]
        if not curve:
            raise RuntimeError(f"the selector logged no {MONITOR!r}; is the validation split empty?")
        best = max(range(len(curve)), key=curve.__getitem__)
        trial.set_user_attr("best_epoch", best)
        trial.set_user_attr("curve", curve)
        trial.set_user_attr("oracle_rel_tps", history.history[-1].get("val/oracle_rel_tps"))
        return float(curve[best])


def _write_best_yaml(study: Any, path: Path, value: float) -> Path:
    import yaml

    from adaptive_spec.tuning.space import selector_kwargs

    best = study.best_trial
    model = {k: (float(v) if isinstance(v, float) else v) for k, v in selector_kwargs(best.params).items()}
    header = (
        f"# Best selector hyper-parameters from `adaptive-spec tune selector`: study {study.study_name!r}, "
        f"trial {best.number}, {MONITOR} = {value:.4f}.\n"
        "# Use: adaptive-spec selector train --config configs/selector/default.yaml --config <this file> "
        "--data.labels DIR\n"
    )
    atomic_write(path, header + yaml.safe_dump({"model": model}, sort_keys=False))
    return path


def tune_selector(cfg: SelectorTuningConfig) -> dict[str, Any]:
    """Run (or resume) the selector study; write the report and ``best-selector.yaml``.

    Returns:
        The report summary (study summary, best hyper-parameters, plots).
    """
    import optuna

    from adaptive_spec.selector.lit import SelectorDataModule
    from adaptive_spec.tuning.report import plot_study, study_summary, write_summary
    from adaptive_spec.tuning.space import SELECTOR_KNOWN_GOOD, selector_kwargs
    from adaptive_spec.tuning.storage import check_settings, make_storage, open_study

    optuna.logging.set_verbosity(optuna.logging.WARNING if cfg.progress else optuna.logging.INFO)
    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)
    storage = make_storage(cfg.storage, cfg.heartbeat_interval, cfg.grace_period)
    datamodule = SelectorDataModule(
        str(cfg.labels), val_fraction=cfg.val_fraction, split_seed=cfg.split_seed, batch_size=cfg.batch_size
    )
    pruner = optuna.pruners.MedianPruner(
        n_startup_trials=cfg.pruner_startup_trials, n_warmup_steps=cfg.pruner_warmup_epochs
    )
    study = open_study(cfg.study, storage, seed=cfg.seed, worker=cfg.worker, pruner=pruner)
    check_settings(
        study,
        {
            "objective": MONITOR,
            "labels": str(Path(cfg.labels).resolve()),
            "max_epochs": cfg.max_epochs,
            "val_fraction": cfg.val_fraction,
            "split_seed": cfg.split_seed,
            "batch_size": cfg.batch_size,
            "seed": cfg.seed,
        },
    )
    if cfg.enqueue and cfg.worker == 0:
        study.enqueue_trial(dict(SELECTOR_KNOWN_GOOD), user_attrs={"enqueued": True}, skip_if_exists=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        study.optimize(
            SelectorObjective(datamodule, cfg),
            n_trials=cfg.n_trials,
            timeout=cfg.timeout,
            catch=(ValueError, RuntimeError),
            show_progress_bar=cfg.progress and cfg.n_trials > 0,
        )
    info = study_summary(study)
    summary: dict[str, Any] = {"config": asdict(cfg), "study": info}
    if info["best"] is None:
        log.warning("study %s has no complete trial yet", cfg.study)
        return summary
    summary["best_hparams"] = selector_kwargs(info["best"]["params"])
    print(
        f"study {cfg.study}: best {MONITOR} = {info['best']['value']:.4f} (trial {info['best']['number']}; "
        f"states {info['states']}): {summary['best_hparams']}"
    )
    if cfg.write_report:
        report_dir = _report_dir(cfg)
        summary["best_yaml"] = str(_write_best_yaml(study, report_dir / "best-selector.yaml", info["best"]["value"]))
        summary["plots"] = plot_study(study, report_dir)
        print(f"report: {write_summary(summary, report_dir).parent}")
    return summary
