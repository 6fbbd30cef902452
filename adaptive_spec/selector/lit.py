"""Lightning wrappers for selector training: the data module over a label table and the module.

:class:`SelectorDataModule` reads the labels once, at construction, so that the model's shapes and
feature standardisation (:attr:`SelectorDataModule.spec`) are known before the model is built;
LightningCLI links ``data.spec`` into ``model.data_spec``. Programmatic use::

    dm = SelectorDataModule("runs/labels", val_fraction=0.2)
    model = SelectorModule(data_spec=dm.spec, lr=1e-3)
    L.Trainer(max_epochs=20).fit(model, dm)

The plain network is :class:`adaptive_spec.selector.model.SelectorNet` (``model.net``); only it
is exported. The engine never imports this module.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Literal

import lightning as L  # noqa: N812 (Lightning's own convention)
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from adaptive_spec.formats.features import SCHEMA
from adaptive_spec.formats.label_table import read_label_sets
from adaptive_spec.selector.datamodule import SelectorSplit, prepare
from adaptive_spec.selector.model import SelectorNet, selector_loss


class _SplitDataset(Dataset):
    """Rows of a :class:`SelectorSplit` as tensors; fetched a whole batch at a time."""

    def __init__(self, data: SelectorSplit) -> None:
        self.tensors = {
            "features": torch.from_numpy(np.ascontiguousarray(data.features, np.float32)),
            "block_efficiency": torch.from_numpy(np.ascontiguousarray(data.block_efficiency, np.float32)),
            "step_time_s": torch.from_numpy(np.ascontiguousarray(data.step_time_s, np.float32)),
            "base_tps": torch.from_numpy(np.ascontiguousarray(data.base_tps, np.float32)),
            "base_action": torch.from_numpy(np.ascontiguousarray(data.base_action, np.int64)),
            "net_value": torch.from_numpy(np.ascontiguousarray(data.net_value, np.float32)),
        }
        for name in ("draft_hidden", "target_hidden"):
            h = getattr(data, name)
            if h is not None:
                self.tensors[name] = torch.from_numpy(np.ascontiguousarray(h, np.float16))

    def __len__(self) -> int:
        return len(self.tensors["features"])

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {k: v[i] for k, v in self.tensors.items()}

    def __getitems__(self, rows: list[int]) -> dict[str, torch.Tensor]:
        index = torch.as_tensor(rows, dtype=torch.long)
        return {k: v[index] for k, v in self.tensors.items()}


def _batched(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return batch  # __getitems__ already stacked the rows


class SelectorDataModule(L.LightningDataModule):
    """Train/val loaders over a label table, split by prompt.

    Args:
        labels: a label file or a directory holding ``labels.parquet`` (``adaptive-spec label``), or
            a list of them (concatenated; they must share the action list).
        val_fraction: share of the *prompts* held out for validation.
        max_actions: candidate actions: the ones with the best net value on most train contexts (at
            most this many, plus the best static ones); None: all (see
            :func:`~adaptive_spec.selector.datamodule.prepare`).
        split_seed: seeds the prompt split (independent of ``seed_everything``).
        batch_size: rows per batch (per process under DDP).
        num_workers: DataLoader workers; the data sits in memory, so 0 is usually fastest.
    """

    def __init__(
        self,
        labels: str | list[str],
        val_fraction: float = 0.2,
        split_seed: int = 0,
        batch_size: int = 256,
        num_workers: int = 0,
        max_actions: int | None = None,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.labels = Path(labels) if isinstance(labels, (str, Path)) else [Path(p) for p in labels]
        self.batch_size, self.num_workers = batch_size, num_workers
        self.train_split, self.val_split, self.spec = prepare(
            read_label_sets(self.labels),
            val_fraction=val_fraction,
            seed=split_seed,
            labels=self.labels,
            max_actions=max_actions,
        )

    def _loader(self, data: SelectorSplit, shuffle: bool) -> DataLoader:
        return DataLoader(
            _SplitDataset(data),
            batch_size=self.batch_size,
            shuffle=shuffle,
            num_workers=self.num_workers,
            collate_fn=_batched,
            persistent_workers=self.num_workers > 0,
        )

    def train_dataloader(self) -> DataLoader:
        return self._loader(self.train_split, shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader(self.val_split, shuffle=False)


class SelectorModule(L.LightningModule):
    """Trains :class:`SelectorNet` to maximise tokens/s relative to the best static action.

    Args:
        data_spec: :attr:`SelectorDataModule.spec` (actions, widths, standardisation, manifest);
            LightningCLI fills it in, do not set it in a config file.
        use_hidden: also feed the label table's hidden states (needs them in the labels; each
            decision then copies the hidden states to the host).
        proj_dim: width of each hidden-state projection.
        hidden_sizes: MLP hidden layer widths.
        dropout: MLP dropout.
        clip: standardised features are clipped to ``±clip``.
        lr: AdamW learning rate (cosine decay to 10% over the run).
        weight_decay: AdamW weight decay on matrices (none on biases and norms).
        objective: ``"net"`` (aggregate tokens/s), ``"ddte"`` or ``"expected"``; see
            :func:`~adaptive_spec.selector.model.selector_loss`.
        tail_weight: weight of the worst-contexts penalty.
        tail_fraction: share of the batch that penalty averages over.
        ce_weight: weight of the cross-entropy towards the soft per-context best action. The
            tokens/s objectives alone stall: their gradient towards an action vanishes with the
            action's probability, so an action the policy has dropped is never found again (on the
            test fixture: 93% accuracy without this term, 99% with it, equal to the boosted trees).
        ce_temperature: temperature of that soft target (in log tokens/s).
    """

    def __init__(
        self,
        data_spec: dict[str, Any] | None = None,
        use_hidden: bool = False,
        proj_dim: int = 128,
        hidden_sizes: tuple[int, ...] = (512, 32),
        dropout: float = 0.1,
        clip: float = 8.0,
        lr: float = 1e-3,  # noqa: ARG002 (read back from self.hparams)
        weight_decay: float = 1e-4,  # noqa: ARG002 (read back from self.hparams)
        objective: Literal["net", "ddte", "expected"] = "net",
        tail_weight: float = 0.0,
        tail_fraction: float = 0.1,
        ce_weight: float = 0.5,
        ce_temperature: float = 0.05,
    ) -> None:
        super().__init__()
        if data_spec is None:
            raise ValueError(
                "SelectorModule needs data_spec, the SelectorDataModule's .spec (LightningCLI links it; in code pass "
                "SelectorModule(data_spec=dm.spec, ...))"
            )
        SCHEMA.check_compatible(data_spec["schema"]["version"], data_spec["schema"]["hash"], what="the label data")
        self.save_hyperparameters()
        hd, ht = int(data_spec["draft_hidden_dim"]), int(data_spec["target_hidden_dim"])
        if use_hidden and not (hd or ht):
            raise ValueError("use_hidden=True but the label table has no hidden states; relabel with them or set false")
        self.use_hidden = use_hidden
        self.net = SelectorNet(
            int(data_spec["num_features"]),
            len(data_spec["actions"]),
            hd if use_hidden else 0,
            ht if use_hidden else 0,
            proj_dim=proj_dim,
            hidden_sizes=tuple(hidden_sizes),
            dropout=dropout,
            clip=clip,
        )
        self.net.set_standardisation(data_spec["feature_mean"], data_spec["feature_std"])
        self.net.set_candidates(data_spec.get("candidates"))
        self.loss_args = {
            "objective": objective,
            "tail_weight": tail_weight,
            "tail_fraction": tail_fraction,
            "ce_weight": ce_weight,
            "ce_temperature": ce_temperature,
        }

    @property
    def actions(self) -> list[str]:
        return list(self.hparams.data_spec["actions"])

    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:  # [B, A] logits
        hidden = {k: batch[k] for k in self.net.input_names[1:]}
        return self.net(batch["features"], **hidden)

    def _common_step(self, batch: dict[str, torch.Tensor], stage: str) -> torch.Tensor:
        logits = self(batch)
        be, st, base = batch["block_efficiency"], batch["step_time_s"], batch["base_tps"]
        value = batch["net_value"]
        loss = selector_loss(logits, be, st, base, net_value=value, action_bias=self.net.action_bias, **self.loss_args)
        n = len(logits)
        if stage == "train":
            self.log("train/loss", loss, on_step=False, on_epoch=True, batch_size=n, sync_dist=True)
            return loss
        rel = be / st / base[:, None]  # [B, A]
        choice = logits.argmax(dim=-1)
        rows = torch.arange(n, device=logits.device)
        oracle = value.argmax(dim=-1)  # the per-context best net value (the aggregate-optimal choice)
        # Sums for the aggregate ratio (tokens over time, as measured tokens/s is), logged at epoch end.
        static = batch["base_action"]
        sums = torch.stack(
            [be[rows, choice].sum(), st[rows, choice].sum(), be[rows, static].sum(), st[rows, static].sum()]
        ).double()
        self._val_sums = sums if getattr(self, "_val_sums", None) is None else self._val_sums + sums
        metrics = {
            "val/loss": loss,
            "val/rel_tps": rel[rows, choice].mean(),
            "val/oracle_rel_tps": rel[rows, oracle].mean(),
            "val/acc": (choice == oracle).float().mean(),
        }
        self.log_dict(metrics, on_step=False, on_epoch=True, batch_size=n, sync_dist=True)
        return loss

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:  # noqa: ARG002
        return self._common_step(batch, "train")

    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:  # noqa: ARG002
        return self._common_step(batch, "val")

    def on_validation_epoch_start(self) -> None:
        self._val_sums = None

    def on_validation_epoch_end(self) -> None:
        """``val/agg_rel_tps``: (Σ BE / Σ T of the choices) / (Σ BE / Σ T of the best static actions)."""
        sums = getattr(self, "_val_sums", None)
        if sums is not None and float(sums[1]) > 0 and float(sums[2]) > 0:
            agg = (sums[0] / sums[1]) / (sums[2] / sums[3])
            self.log("val/agg_rel_tps", agg.float(), sync_dist=True)

    def configure_optimizers(self) -> dict[str, Any]:
        decay = [p for p in self.net.parameters() if p.ndim >= 2]
        no_decay = [p for p in self.net.parameters() if p.ndim < 2]
        opt = torch.optim.AdamW(
            [{"params": decay, "weight_decay": self.hparams.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
            lr=self.hparams.lr,
        )
        total = max(1, int(self.trainer.estimated_stepping_batches))

        def factor(step: int) -> float:  # cosine from 1 to 0.1 over the run
            return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(step, total) / total))

        sched = torch.optim.lr_scheduler.LambdaLR(opt, factor)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


class HistoryCallback(L.Callback):
    """Keeps one row of epoch-level metrics per training epoch (for the report's curves)."""

    def __init__(self) -> None:
        self.history: list[dict[str, float]] = []

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:  # noqa: ARG002
        metrics = {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith(("train/", "val/"))}
        self.history.append({"epoch": float(trainer.current_epoch), "step": float(trainer.global_step), **metrics})
