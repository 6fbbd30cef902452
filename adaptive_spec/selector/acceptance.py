"""``adaptive-spec selector acceptance``: collect -> train -> export -> calibrate the acceptance model.

The acceptance model behind the ``learned-chain:D:ρ`` drafting policy
(:class:`~adaptive_spec.trees.policy.LearnedChain`) predicts, per drafted node, from draft-side
features only, the probability that the verifier accepts the node given its parent was accepted
and the probability that a child drawn from its row would be accepted. Stages:

1. ``collect``: the engine generates from training prompts at each temperature with an
   always-extending chain (``--plan``, default ``chain:8/block``) and a
   :class:`~adaptive_spec.formats.nodes.NodeLogger`: every drafted node's features, the feed
   decision and its soft labels (``min(1, p/q)``; ``Σ min(p, q)`` for the next node) go to
   ``OUT/nodes/*.parquet``. The labels are exact expectations, not 0/1 outcomes, so a few
   thousand steps are enough. Any engine run with a node logger is training data too.
2. ``train``: a small MLP (standardisation inside) with Lightning, soft-label binary
   cross-entropy on both heads, the validation split by generation; the best validation
   epoch is kept.
3. ``export``: ONNX (``OUT/acceptance.onnx``), checked against torch with onnxruntime.
4. ``report``: reliability diagrams of both heads on the validation split, per temperature
   (``OUT/report/calibration.png``, ``calibration.json`` with the expected calibration error).

``--install`` copies the model into the user data folder (``$ADAPTIVE_SPEC_HOME``, default
``~/.local/share/adaptive-spec/default``), where ``learned-chain`` plans find it first.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from adaptive_spec.planner.acceptance import ACCEPTANCE_FILE, FORMAT
from adaptive_spec.trees.policy import ACCEPTANCE_FEATURES

__all__ = ["AcceptanceNet", "collect_nodes", "export_acceptance", "load_node_arrays", "train_acceptance"]

DEFAULT_OUT = Path("data/acceptance")
PARITY_TOL = 1e-5


class AcceptanceNet(nn.Module):
    """features [n, F] -> probabilities [n, 2]; standardisation of the inputs is part of the network."""

    def __init__(self, mean: np.ndarray, std: np.ndarray, hidden: int = 16, layers: int = 1) -> None:
        super().__init__()
        self.register_buffer("mean", torch.as_tensor(mean, dtype=torch.float32))
        self.register_buffer("std", torch.as_tensor(std, dtype=torch.float32))
        dims = [len(ACCEPTANCE_FEATURES)] + [hidden] * layers
        blocks: list[nn.Module] = []
        for a, b in itertools.pairwise(dims):
            blocks += [nn.Linear(a, b), nn.ReLU()]  # ReLU: cheap in the numpy runtime too
        blocks.append(nn.Linear(dims[-1], 2))
        self.mlp = nn.Sequential(*blocks)

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        return self.mlp((x - self.mean) / self.std)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.logits(x))

    def layer_weights(self) -> dict[str, Any]:
        """The network as plain lists (standardisation, then ``[W, b]`` per linear layer, ReLU between)."""
        linears = [m for m in self.mlp if isinstance(m, nn.Linear)]
        return {
            "mean": self.mean.tolist(),
            "std": self.std.tolist(),
            "layers": [[m.weight.detach().cpu().tolist(), m.bias.detach().cpu().tolist()] for m in linears],
        }


# ---------------------------------------------------------------------------- collect
def collect_nodes(
    engine: Any,
    prompts: list[Any],
    temperatures: list[float],
    out: str | os.PathLike,
    *,
    plan: str = "chain:8/block",
    max_new_tokens: int = 128,
    seed: int = 0,
    progress: bool = True,
) -> dict[str, Any]:
    """Generate from every prompt at every temperature with ``plan`` and a node logger in ``out``."""
    from tqdm.auto import tqdm

    from adaptive_spec.formats.nodes import NodeLogger

    logger = NodeLogger(out)
    engine.node_log = logger
    t0 = time.perf_counter()
    try:
        runs = [(t, i, p) for t in temperatures for i, p in enumerate(prompts)]
        for t, i, prompt in tqdm(runs, desc="collect nodes", disable=not progress):
            engine.generate(prompt, plan=plan, temperature=t, max_new_tokens=max_new_tokens, seed=seed + i)
            logger.end_generation()
    finally:
        engine.node_log = None
        logger.close()
    return {"rows": logger.rows, "generations": len(prompts) * len(temperatures), "seconds": time.perf_counter() - t0}


def load_node_arrays(directory: str | os.PathLike) -> dict[str, np.ndarray]:
    """A node log as arrays: ``x`` [n, F] float32, ``a``, ``b`` (NaN where unknown) and ``group`` (generation)."""
    from adaptive_spec.formats.nodes import read_node_log

    table = read_node_log(directory)
    cols = {c: table.column(c).to_numpy(zero_copy_only=False) for c in table.column_names}
    x = np.stack([cols[c].astype(np.float32) for c in ACCEPTANCE_FEATURES], axis=1)
    return {
        "x": x,
        "a": cols["label_accept"].astype(np.float32),
        "b": cols["label_next"].astype(np.float32),
        "group": cols["generation"].astype(np.int64),
    }


# ---------------------------------------------------------------------------- train
def _split(group: np.ndarray, val_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    ids = np.unique(group)
    rng = np.random.default_rng(seed)
    val_ids = rng.choice(ids, size=max(1, round(len(ids) * val_fraction)), replace=False)
    val = np.isin(group, val_ids)
    if val.all() or not val.any():
        raise ValueError(f"the node log has {len(ids)} generation(s): too few to split off a validation set")
    return ~val, val


def _soft_bce(logits: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    f = nn.functional.binary_cross_entropy_with_logits
    mask = ~torch.isnan(b)
    loss = f(logits[:, 0], a)
    if mask.any():
        loss = loss + f(logits[mask, 1], b[mask])
    return loss


def _lightning_module(net: AcceptanceNet, lr: float, weight_decay: float) -> Any:
    import lightning as L  # noqa: N812

    class AcceptanceModule(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = net

        def training_step(self, batch: tuple[torch.Tensor, ...], batch_idx: int) -> torch.Tensor:  # noqa: ARG002
            x, a, b = batch
            loss = _soft_bce(self.net.logits(x), a, b)
            self.log("train/loss", loss, prog_bar=True, batch_size=len(x))
            return loss

        def validation_step(self, batch: tuple[torch.Tensor, ...], batch_idx: int) -> None:  # noqa: ARG002
            x, a, b = batch
            self.log("val/loss", _soft_bce(self.net.logits(x), a, b), prog_bar=True, batch_size=len(x))

        def configure_optimizers(self) -> Any:
            return torch.optim.AdamW(self.net.parameters(), lr=lr, weight_decay=weight_decay)

    return AcceptanceModule()


def train_acceptance(
    data: dict[str, np.ndarray],
    out: str | os.PathLike,
    *,
    epochs: int = 30,
    batch_size: int = 512,
    lr: float = 3e-3,
    weight_decay: float = 1e-4,
    hidden: int = 16,
    val_fraction: float = 0.2,
    seed: int = 0,
    progress: bool = True,
) -> tuple[AcceptanceNet, dict[str, Any]]:
    """Train the acceptance network with Lightning; returns the best-validation network and a summary."""
    import lightning as L  # noqa: N812
    from lightning.pytorch.callbacks import ModelCheckpoint
    from torch.utils.data import DataLoader, TensorDataset

    L.seed_everything(seed, workers=True, verbose=False)
    tr, va = _split(data["group"], val_fraction, seed)
    x = data["x"]
    mean, std = x[tr].mean(0), x[tr].std(0)
    std = np.where(std > 1e-6, std, 1.0)
    net = AcceptanceNet(mean, std, hidden=hidden)

    def loader(mask: np.ndarray, shuffle: bool) -> DataLoader:
        tensors = (torch.from_numpy(x[mask]), torch.from_numpy(data["a"][mask]), torch.from_numpy(data["b"][mask]))
        return DataLoader(TensorDataset(*tensors), batch_size=batch_size, shuffle=shuffle)

    module = _lightning_module(net, lr, weight_decay)
    ckpt = ModelCheckpoint(dirpath=out / "checkpoints", monitor="val/loss", mode="min", save_top_k=1)
    trainer = L.Trainer(
        max_epochs=epochs,
        accelerator="cpu",
        devices=1,
        deterministic=True,
        callbacks=[ckpt],
        logger=L.pytorch.loggers.CSVLogger(out, name="lightning_logs"),
        enable_progress_bar=progress,
        enable_model_summary=False,
        log_every_n_steps=10,
    )
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*does not have many workers.*")
        trainer.fit(module, loader(tr, True), loader(va, False))
    best = torch.load(ckpt.best_model_path, map_location="cpu", weights_only=False)["state_dict"]
    module.load_state_dict(best)
    net.eval()
    summary = {
        "rows_train": int(tr.sum()),
        "rows_val": int(va.sum()),
        "epochs": epochs,
        "best_val_loss": float(ckpt.best_model_score),
        "seed": seed,
        "hidden": hidden,
        "split": "by generation",
        "val_groups": sorted(int(g) for g in np.unique(data["group"][va])),
    }
    return net, summary


# ---------------------------------------------------------------------------- export
def export_acceptance(net: AcceptanceNet, path: Path, training: dict[str, Any]) -> dict[str, Any]:
    """Write ``net`` as ONNX (atomically) after a torch/onnxruntime parity check on random rows."""
    import onnxruntime as ort

    from adaptive_spec.selector.export import with_metadata

    net = net.cpu().float().eval()
    example = torch.randn(8, len(ACCEPTANCE_FEATURES))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        logging.getLogger("torch.onnx._internal.exporter._registration").setLevel(logging.ERROR)
        program = torch.onnx.export(
            net,
            (example,),
            input_names=["features"],
            output_names=["probs"],
            dynamic_shapes={"x": {0: torch.export.Dim("batch")}},
            dynamo=True,
            verbose=False,
        )
    proto = program.model_proto
    meta = {
        "adaptive_spec.format": FORMAT,
        "adaptive_spec.feature_names": json.dumps(list(ACCEPTANCE_FEATURES)),
        "adaptive_spec.training": json.dumps(training, default=str),
        "adaptive_spec.weights": json.dumps(net.layer_weights()),
    }
    blob = with_metadata(proto, meta)
    check = torch.randn(256, len(ACCEPTANCE_FEATURES)) * 3
    with torch.no_grad():
        expected = net(check).numpy()
    got = ort.InferenceSession(blob, providers=["CPUExecutionProvider"]).run(None, {"features": check.numpy()})[0]
    diff = float(np.abs(got - expected).max())
    if not diff <= PARITY_TOL:
        raise ValueError(f"ONNX export differs from torch by {diff:.3g} (> {PARITY_TOL:g}); not writing {path}")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_bytes(blob)
    os.replace(tmp, path)
    return {"path": str(path), "max_abs_diff": diff}


# ---------------------------------------------------------------------------- calibration
def calibration(pred: np.ndarray, label: np.ndarray, bins: int = 10) -> dict[str, Any]:
    """Reliability table: per bin of predicted probability, mean prediction, mean label and count; plus ECE."""
    keep = ~np.isnan(label)
    pred, label = pred[keep], label[keep]
    edges = np.linspace(0.0, 1.0, bins + 1)
    idx = np.clip(np.digitize(pred, edges[1:-1]), 0, bins - 1)
    rows, ece = [], 0.0
    for k in range(bins):
        m = idx == k
        if m.any():
            rows.append({"bin": k, "pred": float(pred[m].mean()), "label": float(label[m].mean()), "n": int(m.sum())})
            ece += m.mean() * abs(pred[m].mean() - label[m].mean())
    return {
        "bins": rows,
        "ece": float(ece),
        "n": len(pred),
        "mean_pred": float(pred.mean()) if len(pred) else None,
        "mean_label": float(label.mean()) if len(label) else None,
    }


def calibration_report(net: AcceptanceNet, data: dict[str, np.ndarray], val: np.ndarray, out: Path) -> dict[str, Any]:
    """Reliability diagrams of both heads on the validation rows, per temperature; JSON and PNG in ``out``."""
    with torch.no_grad():
        pred = net(torch.from_numpy(data["x"][val])).numpy()
    temps = data["x"][val][:, ACCEPTANCE_FEATURES.index("temperature")]
    report: dict[str, Any] = {}
    for t in sorted(set(np.round(temps, 4).tolist())):
        m = np.round(temps, 4) == t
        report[f"T={t:g}"] = {
            "accept": calibration(pred[m, 0], data["a"][val][m]),
            "next": calibration(pred[m, 1], data["b"][val][m]),
        }
    out.mkdir(parents=True, exist_ok=True)
    (out / "calibration.json").write_text(json.dumps(report, indent=2))
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:  # the [report] extra
        return report
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.5))
    titles = ("node accepted | parent accepted", "child accepted | node")
    for ax, head, title in zip(axes, ("accept", "next"), titles, strict=True):
        ax.plot([0, 1], [0, 1], color="grey", linestyle=":", label="perfect")
        for group, heads in report.items():
            b = heads[head]["bins"]
            ax.plot(
                [r["pred"] for r in b],
                [r["label"] for r in b],
                marker="o",
                label=f"{group} (ECE {heads[head]['ece']:.3f})",
            )
        ax.set(xlabel="predicted probability", ylabel="mean soft label", title=title, xlim=(0, 1), ylim=(0, 1))
        ax.legend(fontsize=8)
    fig.suptitle("acceptance model calibration (validation generations)")
    fig.tight_layout()
    fig.savefig(out / "calibration.png", dpi=110)
    plt.close(fig)
    return report


def fit_acceptance(
    nodes: str | os.PathLike,
    out: str | os.PathLike,
    *,
    epochs: int = 30,
    seed: int = 0,
    plan: str | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """Train the acceptance model on the node log ``nodes``, export it and report its calibration, in ``out``.

    Writes ``out/<ACCEPTANCE_FILE>`` (ONNX, checked against torch) and ``out/report`` (reliability
    diagram). Returns ``{"training", "export", "calibration"}``: the training summary (``plan``, the
    collecting plan, recorded in it), the export's and the expected calibration error per group and head.
    """
    out = Path(out)
    data = load_node_arrays(nodes)
    net, training = train_acceptance(data, out, epochs=epochs, seed=seed, progress=progress)
    training["plan"] = plan
    exported = export_acceptance(net, out / ACCEPTANCE_FILE, training)
    val = np.isin(data["group"], training["val_groups"])  # the validation rows of the training run
    report = calibration_report(net, data, val, out / "report")
    calibration = {g: {h: r[h]["ece"] for h in r} for g, r in report.items()}
    return {"training": training, "export": exported, "calibration": calibration}
