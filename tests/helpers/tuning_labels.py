"""A synthetic label table over the whole plan search space (for the predicted objective)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from adaptive_spec.formats.features import SCHEMA
from adaptive_spec.formats.label_table import LabelTable, write_labels
from adaptive_spec.tuning.space import iter_plans

VERIFIER_GAIN = {
    "token": 0.9,
    "block": 1.0,
    "traversal": 1.05,
    "specinfer": 0.95,
    "spectr": 1.0,
    "gbv": 1.08,
    "nss": 0.9,
    "naive": 0.85,
    "rrsw": 1.02,
    "greedy": 1.0,
}


def synthetic_labels(temperatures=(0.0, 1.0), contexts=6, seed=0) -> LabelTable:
    """Block efficiency from a per-context acceptance rate and the tree's depth and width; step time
    affine in nodes and depth. Covers every plan of the space at each temperature."""
    rng = np.random.default_rng(seed)
    actions = list(dict.fromkeys(str(p) for t in temperatures for p in iter_plans(t)))
    n = contexts * len(temperatures)
    alpha = rng.uniform(0.5, 0.9, size=(n, 1))
    depth = np.array([[__import__("adaptive_spec").TreeShape.parse(a.split("/")[0]).depth for a in actions]])
    nodes = np.array([[__import__("adaptive_spec").TreeShape.parse(a.split("/")[0]).max_nodes for a in actions]])
    gain = np.array([[VERIFIER_GAIN[a.split("/")[1]] for a in actions]])
    width_bonus = 1 + 0.1 * np.log(nodes / (depth + 1))
    be = (1 - alpha ** (depth + 1)) / (1 - alpha) * gain * width_bonus
    step = 0.004 + 0.0002 * nodes + 0.001 * depth
    feats = rng.normal(size=(n, SCHEMA.num_scalar)).astype(np.float32)
    feats[:, SCHEMA.names.index("temperature")] = np.repeat(np.asarray(temperatures, np.float32), contexts)
    return LabelTable(
        actions=actions,
        features=feats,
        block_efficiency=be.astype(np.float32),
        step_time_s=step.repeat(n, 0).astype(np.float32),
        run_id=[f"r{i // contexts}" for i in range(n)],
        prompt_key=[f"p{i}" for i in range(n)],
        step=np.arange(n, dtype=np.int32),
        manifest={"note": "synthetic test labels"},
    )


def write_synthetic_labels(directory: Path, **kw) -> Path:
    write_labels(synthetic_labels(**kw), Path(directory) / "labels.parquet")
    return Path(directory)
