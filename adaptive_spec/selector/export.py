"""Export a trained selector to ONNX (``adaptive-spec selector export CKPT --out DIR`` writes ``DIR/selector.onnx``).

The graph is :class:`~adaptive_spec.selector.model.SelectorNet` in eval mode, traced with
``torch.onnx.export(..., dynamo=True)`` (the torch.export-based exporter, the default since torch
2.9). Inputs: ``features`` float32 [batch, F] in schema order (raw; the standardisation is inside
the graph), plus ``draft_hidden`` / ``target_hidden`` float32 [batch, H] when the model uses them;
output ``logits`` float32 [batch, A]; the batch axis is dynamic.

The model's ``metadata_props`` (see :data:`META_KEYS`) carry what the runtime checks at load: the
feature schema's version and hash, the feature names, the action list, the hidden widths, the
label data's manifest and a summary of the training run. The file is written atomically and only
after onnxruntime reproduces the torch logits on a random batch (``max |Δ| <= tol``).
"""

from __future__ import annotations

import json
import logging
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch

from adaptive_spec.files import atomic_write
from adaptive_spec.formats.features import SCHEMA
from adaptive_spec.selector.model import SelectorNet

FORMAT = "adaptive-spec-selector/1"
META_KEYS = (
    "adaptive_spec.format",
    "adaptive_spec.schema_version",
    "adaptive_spec.schema_hash",
    "adaptive_spec.feature_names",
    "adaptive_spec.actions",
    "adaptive_spec.hidden_dims",
    "adaptive_spec.manifest",
    "adaptive_spec.training",
)
PARITY_TOL = 1e-5


def example_inputs(net: SelectorNet, batch: int, *, seed: int = 0) -> dict[str, torch.Tensor]:
    """A random input batch for ``net``: features around the training mean, standard-normal hidden states."""
    g = torch.Generator().manual_seed(seed)
    mean, std = net.feature_mean.float().cpu(), net.feature_std.float().cpu()
    out = {"features": mean + std * torch.randn(batch, net.num_features, generator=g)}
    for name, dim in (("draft_hidden", net.draft_hidden_dim), ("target_hidden", net.target_hidden_dim)):
        if name in net.input_names:
            out[name] = torch.randn(batch, dim, generator=g)
    return out


def export_net(
    net: SelectorNet,
    out: str | Path,
    *,
    actions: list[str],
    manifest: dict[str, Any] | None = None,
    training: dict[str, Any] | None = None,
    check_batch: int = 64,
    tol: float = PARITY_TOL,
) -> dict[str, Any]:
    """Write ``net`` as an ONNX selector at ``out`` (atomically), after a torch/onnxruntime parity check.

    Args:
        net: the trained network (any device; exported from a float32 CPU copy in eval mode).
        out: the ``.onnx`` path to write.
        actions: plan strings, one per logit.
        manifest: the label data's manifest (stored as JSON metadata).
        training: a JSON-serialisable summary of the training run (stored as metadata).
        check_batch: rows of the random parity batch.
        tol: the largest accepted max |torch - onnxruntime| on that batch.

    Returns:
        ``{"path", "max_abs_diff", "inputs", "num_actions"}``.

    Raises:
        ValueError: the action count differs from the network's outputs, or the parity check fails
            (the file is then not written).
    """
    if len(actions) != net.num_actions:
        raise ValueError(f"{len(actions)} actions for a network with {net.num_actions} outputs")
    if net.num_features != SCHEMA.num_scalar:
        raise ValueError(
            f"the network takes {net.num_features} features, schema v{SCHEMA.version} has {SCHEMA.num_scalar}"
        )
    out = Path(out)
    model = _cpu_copy(net)
    names = model.input_names
    inputs = example_inputs(model, 4)
    batch = torch.export.Dim("batch")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # exporter chatter about axis names and deprecated pytree classes
        logging.getLogger("torch.onnx._internal.exporter._registration").setLevel(logging.ERROR)
        program = torch.onnx.export(
            model,
            (),
            kwargs=inputs,
            input_names=names,
            output_names=["logits"],
            dynamic_shapes={k: {0: batch} for k in names},
            dynamo=True,
            verbose=False,
        )
    proto = program.model_proto
    hidden_dims = {
        "draft_hidden": model.draft_hidden_dim if "draft_hidden" in names else 0,
        "target_hidden": model.target_hidden_dim if "target_hidden" in names else 0,
    }
    meta = {
        "adaptive_spec.format": FORMAT,
        "adaptive_spec.schema_version": str(SCHEMA.version),
        "adaptive_spec.schema_hash": SCHEMA.hash,
        "adaptive_spec.feature_names": json.dumps(list(SCHEMA.names)),
        "adaptive_spec.actions": json.dumps(list(actions)),
        "adaptive_spec.hidden_dims": json.dumps(hidden_dims),
        "adaptive_spec.manifest": json.dumps(manifest or {}),
        "adaptive_spec.training": json.dumps(training or {}, default=str),
    }
    blob = with_metadata(proto, meta)
    diff = parity(model, blob, example_inputs(model, check_batch, seed=1))
    if not diff <= tol:
        raise ValueError(f"ONNX export differs from torch by {diff:.3g} (> {tol:g}); not writing {out}")
    atomic_write(out, blob)
    return {"path": str(out), "max_abs_diff": diff, "inputs": names, "num_actions": len(actions)}


def with_metadata(proto: Any, meta: dict[str, str]) -> bytes:
    """The ONNX model ``proto`` with exactly ``meta`` as its metadata, checked, serialised."""
    import onnx

    del proto.metadata_props[:]
    for key, value in meta.items():
        entry = proto.metadata_props.add()
        entry.key, entry.value = key, value
    onnx.checker.check_model(proto)
    return proto.SerializeToString()


def parity(net: SelectorNet, onnx_model: bytes | str | Path, inputs: dict[str, torch.Tensor]) -> float:
    """Max |torch logits - onnxruntime logits| over a batch (``inputs`` by input name).

    Only the candidate actions' logits count: the others sit near ``EXCLUDED_BIAS`` (-1e4), where
    float32 resolves only ~1e-3; that they stay excluded is checked instead (an excluded action
    winning anywhere returns ``inf``).
    """
    import onnxruntime as ort

    model = _cpu_copy(net)
    with torch.no_grad():
        expected = model(**inputs).numpy()
    source = str(onnx_model) if isinstance(onnx_model, Path) else onnx_model
    session = ort.InferenceSession(source, providers=["CPUExecutionProvider"])
    got = session.run(["logits"], {k: v.numpy().astype(np.float32) for k, v in inputs.items()})[0]
    candidates = np.asarray(model.candidates, dtype=np.int64)
    if not np.isin(got.argmax(axis=1), candidates).all():
        return float("inf")
    return float(np.abs(got[:, candidates] - expected[:, candidates]).max())


def run_report_path(ckpt: str | Path) -> Path:
    """Where ``selector train`` writes the report of a checkpoint's run: ``version_N/report/report.json``."""
    return Path(ckpt).resolve().parent.parent / "report" / "report.json"


def export_checkpoint(
    ckpt: str | Path, out: str | Path, *, check_batch: int = 64, report: str | Path | bool | None = None
) -> dict[str, Any]:
    """Export a ``SelectorModule`` Lightning checkpoint (``selector train`` writes them) to ONNX.

    Args:
        report: the training report whose ``static_groups`` (sampling settings where the network did
            not beat the best static action on validation) are recorded for the runtime; None: the
            run's own report (:func:`run_report_path`) if it exists and scored this checkpoint;
            False: none (the network decides at every setting).
    """
    from adaptive_spec.selector.lit import SelectorModule

    ckpt = Path(ckpt)
    if not ckpt.is_file():
        raise FileNotFoundError(f"no checkpoint at {ckpt}; train one with `adaptive-spec selector train`")
    static_groups: dict[str, str] = {}
    report_path = run_report_path(ckpt) if report is None else (None if report is False else Path(report))
    if report_path is not None and (report is not None or report_path.is_file()):
        try:
            info = json.loads(Path(report_path).read_text())
        except (OSError, ValueError) as err:
            raise ValueError(
                f"cannot read the training report {report_path} ({err}); pass --no-static-groups to export without it"
            ) from err
        scored = info.get("checkpoint")
        if report is None and scored and Path(scored).name != ckpt.name:
            warnings.warn(f"{report_path} scored {scored}, not {ckpt}; its static groups are not used", stacklevel=2)
        else:
            static_groups = dict(info.get("static_groups") or {})
    module = SelectorModule.load_from_checkpoint(ckpt, map_location="cpu")
    spec = module.hparams.data_spec
    hparams = {k: v for k, v in module.hparams.items() if k != "data_spec"}
    training = {
        "checkpoint": str(ckpt),
        "labels": spec.get("labels"),
        "split": spec.get("split"),
        "best_static": spec.get("best_static"),
        "best_static_overall": spec.get("best_static_overall"),
        # Train-split means of the latency features: all 0 when the log had no latency profile
        # (the runtime warns when such a selector runs without one, see SelectorRuntime).
        "latency_feature_mean": _latency_means(spec),
        "static_groups": static_groups,
        "hparams": hparams,
    }
    info = export_net(
        module.net,
        out,
        actions=list(spec["actions"]),
        manifest=spec.get("manifest"),
        training=training,
        check_batch=check_batch,
    )
    return {**info, "static_groups": static_groups}


def _latency_means(spec: dict[str, Any]) -> dict[str, float] | None:
    from adaptive_spec.selector.runtime import LATENCY_FEATURES

    mean = spec.get("feature_mean")
    if mean is None or len(mean) != SCHEMA.num_scalar:
        return None
    return {name: float(mean[SCHEMA.names.index(name)]) for name in LATENCY_FEATURES}


def _cpu_copy(net: SelectorNet) -> SelectorNet:
    import copy

    return copy.deepcopy(net).to(device="cpu", dtype=torch.float32).eval()
