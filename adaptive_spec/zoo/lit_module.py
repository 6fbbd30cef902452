"""LightningModules that train the built-in pair; they wrap the plain models of ``model.py``.

``LMModule`` trains the target by next-token cross-entropy. ``DistillModule`` trains the
draft to imitate a frozen target (see its docstring for why forward KL on corpus text).
Both share the optimiser and a learning-rate schedule that decays with the *budget* used,
whichever of wall-clock time or steps runs out first, so a time-limited run still ends at
a low learning rate.
"""

from __future__ import annotations

import math
import time

import lightning as L  # noqa: N812 (Lightning's own convention)
import torch
import torch.nn.functional as F  # noqa: N812 (PyTorch's own convention)
from transformers import PreTrainedModel

from adaptive_spec.zoo.config import TrainSpec


class _BudgetedModule(L.LightningModule):
    """Optimiser, schedule and validation shared by both stages."""

    def __init__(self, model: PreTrainedModel, train: TrainSpec, budget_s: float) -> None:
        super().__init__()
        self.model = model
        self.train_spec = train
        self.budget_s = budget_s
        self._t0: float | None = None
        self.history: list[dict[str, float]] = []  # one entry per validation run

    def budget_used(self) -> float:
        """Fraction of the budget spent: the larger of the time and the step fractions, in [0, 1]."""
        used = 0.0
        if self._t0 is not None and self.budget_s > 0:
            used = (time.monotonic() - self._t0) / self.budget_s
        if self.train_spec.max_steps:
            used = max(used, self.global_step / self.train_spec.max_steps)
        return min(1.0, used)

    def on_train_start(self) -> None:
        self._t0 = time.monotonic()

    def _lr_factor(self, step: int) -> float:
        spec = self.train_spec
        if step < spec.warmup_steps:
            return (step + 1) / spec.warmup_steps
        cosine = 0.5 * (1 + math.cos(math.pi * self.budget_used()))
        return spec.min_lr_ratio + (1 - spec.min_lr_ratio) * cosine

    def configure_optimizers(self):
        spec = self.train_spec
        # No weight decay on norms (1-D weights); tied embeddings appear once in parameters().
        decay = [p for p in self.model.parameters() if p.ndim >= 2]
        no_decay = [p for p in self.model.parameters() if p.ndim < 2]
        opt = torch.optim.AdamW(
            [{"params": decay, "weight_decay": spec.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
            lr=spec.lr,
            betas=(0.9, 0.95),
        )
        sched = torch.optim.lr_scheduler.LambdaLR(opt, self._lr_factor)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    def on_validation_epoch_end(self) -> None:
        metrics = {k: float(v) for k, v in self.trainer.callback_metrics.items() if k.startswith("val_")}
        if metrics and not self.trainer.sanity_checking:
            self.history.append({"step": float(self.global_step), "budget_used": self.budget_used(), **metrics})
            shown = ", ".join(f"{k} {v:.4f}" for k, v in metrics.items())
            self.print(f"step {self.global_step} ({self.budget_used():.0%} of budget): {shown}")


def lm_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy; logits [B, T, V], labels [B, T] (already shifted)."""
    return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten())


class LMModule(_BudgetedModule):
    """Next-token cross-entropy training of a causal LM (the target)."""

    def __init__(self, model: PreTrainedModel, train: TrainSpec, budget_s: float) -> None:
        super().__init__(model, train, budget_s)
        self.save_hyperparameters({"train": vars(train), "budget_s": budget_s, "config": model.config.to_dict()})

    def _common_step(self, batch: torch.Tensor, stage: str) -> torch.Tensor:
        inputs, labels = batch[:, :-1], batch[:, 1:]  # [B, T] each
        loss = lm_loss(self.model(input_ids=inputs).logits, labels)
        self.log(f"{stage}_loss", loss, prog_bar=True, on_step=stage == "train", on_epoch=stage == "val")
        return loss

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:  # noqa: ARG002
        return self._common_step(batch, "train")

    def validation_step(self, batch: torch.Tensor, batch_idx: int) -> None:  # noqa: ARG002
        self._common_step(batch, "val")


class DistillModule(_BudgetedModule):
    """Distils the draft from a frozen target: forward KL(target || draft) per position on corpus text.

    Why this objective. The speed-up of speculative decoding is governed by the acceptance
    rate, which for one token at T=1 is ``sum_v min(target_probs_v, draft_probs_v) =
    1 - TV(target, draft)``. Pinsker's inequality bounds the total variation by
    ``sqrt(KL / 2)``, so lowering the KL raises the guaranteed acceptance. Forward KL
    (``target_probs`` as the weights) is the standard distillation loss (Hinton et al.
    2015) and DistillSpec (Zhou et al. 2023, arXiv:2310.08461) found it a strong default
    for speculative drafts; unlike TV it has informative gradients everywhere, and unlike
    the reverse KL it does not let the draft drop modes the target samples from, which
    would be rejected tokens. Matching the whole distribution, not the corpus' one-hot
    labels, is the point: the draft should predict what the *target* will say, including
    its mistakes, since that is what verification compares against.

    Why corpus text. The target's full next-token distribution is available at every
    position of a corpus window with one teacher-forced forward pass (no sampling loop),
    and the held-out prompts the engine uses are of the same kind of text. Departure from
    DistillSpec: no on-policy (draft- or target-generated) sequences, because autoregressive
    generation on a 2-core CPU costs far more target forwards per trained token.
    """

    def __init__(self, model: PreTrainedModel, teacher: PreTrainedModel, train: TrainSpec, budget_s: float) -> None:
        super().__init__(model, train, budget_s)
        self.save_hyperparameters({"train": vars(train), "budget_s": budget_s, "config": model.config.to_dict()})
        teacher.eval().requires_grad_(False)
        # A list hides the teacher from Lightning: not trained, not checkpointed, not summarised.
        self._teacher = [teacher]

    def on_fit_start(self) -> None:
        self._teacher[0].to(self.device)

    def _common_step(self, batch: torch.Tensor, stage: str) -> torch.Tensor:
        inputs, labels = batch[:, :-1], batch[:, 1:]  # [B, T] each
        with torch.no_grad():
            target_logp = F.log_softmax(self._teacher[0](input_ids=inputs).logits.float(), dim=-1)  # [B, T, V]
        draft_logits = self.model(input_ids=inputs).logits.float()  # [B, T, V]
        draft_logp = F.log_softmax(draft_logits, dim=-1)
        # KL(target || draft), summed over the vocabulary, averaged over positions.
        kl = F.kl_div(draft_logp.flatten(0, 1), target_logp.flatten(0, 1), log_target=True, reduction="batchmean")
        self.log(f"{stage}_kl", kl, prog_bar=True, on_step=stage == "train", on_epoch=stage == "val")
        if stage == "val":
            self.log("val_loss", lm_loss(draft_logits, labels), prog_bar=True, on_epoch=True)
            accept = torch.minimum(target_logp.exp(), draft_logp.exp()).sum(-1).mean()
            self.log("val_acceptance", accept, prog_bar=True, on_epoch=True)
        return kl

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:  # noqa: ARG002
        return self._common_step(batch, "train")

    def validation_step(self, batch: torch.Tensor, batch_idx: int) -> None:  # noqa: ARG002
        self._common_step(batch, "val")
