"""A small untrained selector exported to ONNX, for wiring tests (engine, CLI, bench, demo).

Its standardisation is spread so that the argmax moves between actions along a generation, and
its training summary can carry what ``selector export`` records: the best static action per
sampling group and the latency features' means.
"""

from __future__ import annotations

from pathlib import Path

import torch

from adaptive_spec.formats.features import SCHEMA
from adaptive_spec.selector.export import export_net
from adaptive_spec.selector.model import SelectorNet

ACTIONS = ["chain:1/block", "chain:3/block", "iid:2x2/traversal", "delayed:1x2x2/traversal", "wor:2x1/rrsw"]
BEST_STATIC = {"T=0,top_p=1": "chain:3/block", "T=1,top_p=1": "iid:2x2/traversal"}


def tiny_selector(
    path: str | Path,
    *,
    best_static: dict[str, str] | None = BEST_STATIC,
    latency_feature_mean: dict[str, float] | None = None,
    manifest: dict | None = None,
    seed: int = 0,
) -> Path:
    """Export an untrained :class:`SelectorNet` over :data:`ACTIONS` to ``path``; returns the path."""
    torch.manual_seed(seed)
    net = SelectorNet(SCHEMA.num_scalar, len(ACTIONS), hidden_sizes=(32,)).eval()
    net.set_standardisation(torch.zeros(SCHEMA.num_scalar), torch.full((SCHEMA.num_scalar,), 0.3))
    training: dict = {}
    if best_static is not None:
        training["best_static"] = best_static
    if latency_feature_mean is not None:
        training["latency_feature_mean"] = latency_feature_mean
    export_net(net, path, actions=ACTIONS, manifest=manifest, training=training)
    return Path(path)


def restamp(src: str | Path, dst: str | Path, *, training: dict | None = None, manifest: dict | None = None) -> Path:
    """Copy the selector ``src`` to ``dst`` with another training summary / label manifest (no re-export)."""
    import json

    import onnx

    model = onnx.load(str(src))
    values = {"adaptive_spec.training": training, "adaptive_spec.manifest": manifest}
    for entry in model.metadata_props:
        if values.get(entry.key) is not None:
            entry.value = json.dumps(values[entry.key])
    onnx.save(model, str(dst))
    return Path(dst)
