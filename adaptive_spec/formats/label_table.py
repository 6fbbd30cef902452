"""The label table: what ``adaptive-spec label`` writes and selector training / tuning read.

One row per labelled root context. Columns:

- ``run_id`` (string), ``prompt_key`` (string: identifies the prompt, for splits by prompt),
  ``step`` (int32): where the context was logged;
- one float32 column per scalar feature of :data:`adaptive_spec.formats.features.SCHEMA`, in order;
- ``draft_hidden`` / ``target_hidden``: list<float16> or null (optional hidden states);
- ``block_efficiency``, ``step_time_s``, ``tokens_per_s``: list<float32> of length A, one entry per
  action in the table's action list (E[tau + 1], predicted seconds per step, their ratio).

The Parquet file's key/value metadata holds ``adaptive_spec.actions`` (JSON list of plan strings,
the order of the per-action lists), ``adaptive_spec.schema`` (``SCHEMA.to_dict()``) and
``adaptive_spec.manifest`` (the collection manifest, JSON). Files are written atomically.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from adaptive_spec.files import atomic_write
from adaptive_spec.formats.features import SCHEMA

PER_ACTION = ("block_efficiency", "step_time_s", "tokens_per_s")
META_ACTIONS = b"adaptive_spec.actions"
META_SCHEMA = b"adaptive_spec.schema"
META_MANIFEST = b"adaptive_spec.manifest"
LABELS_FILE = "labels.parquet"


@dataclass
class LabelTable:
    """Labels in memory: features [n, F] plus per-action targets [n, A]."""

    actions: list[str]
    features: np.ndarray  # float32 [n, F], SCHEMA order
    block_efficiency: np.ndarray  # float32 [n, A]
    step_time_s: np.ndarray  # float32 [n, A]
    run_id: list[str]
    prompt_key: list[str]
    step: np.ndarray  # int32 [n]
    draft_hidden: np.ndarray | None = None  # float16 [n, Hd]
    target_hidden: np.ndarray | None = None  # float16 [n, Ht]
    manifest: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        n, a = len(self.run_id), len(self.actions)
        if self.features.shape != (n, SCHEMA.num_scalar):
            raise ValueError(f"features must be [{n}, {SCHEMA.num_scalar}], got {list(self.features.shape)}")
        for name in ("block_efficiency", "step_time_s"):
            if getattr(self, name).shape != (n, a):
                raise ValueError(f"{name} must be [{n}, {a}], got {list(getattr(self, name).shape)}")
        if len(self.prompt_key) != n or len(self.step) != n:
            raise ValueError("run_id, prompt_key and step must have one entry per row")

    def __len__(self) -> int:
        return len(self.run_id)

    @property
    def tokens_per_s(self) -> np.ndarray:
        return self.block_efficiency / self.step_time_s

    def subset(self, rows: np.ndarray | Sequence[int]) -> LabelTable:
        rows = np.asarray(rows, dtype=np.int64)
        pick = lambda x: None if x is None else x[rows]  # noqa: E731
        return LabelTable(
            list(self.actions),
            self.features[rows],
            self.block_efficiency[rows],
            self.step_time_s[rows],
            [self.run_id[i] for i in rows],
            [self.prompt_key[i] for i in rows],
            self.step[rows],
            pick(self.draft_hidden),
            pick(self.target_hidden),
            dict(self.manifest),
        )


def write_labels(table: LabelTable, path: str | Path) -> Path:
    """Write ``table`` to ``path`` (a ``.parquet`` file) atomically: temporary file, then rename."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = Path(path)
    cols: dict[str, Any] = {
        "run_id": pa.array(table.run_id, pa.string()),
        "prompt_key": pa.array(table.prompt_key, pa.string()),
        "step": pa.array(np.asarray(table.step, np.int32)),
    }
    for j, name in enumerate(SCHEMA.names):
        cols[name] = pa.array(table.features[:, j].astype(np.float32))
    for name in ("draft_hidden", "target_hidden"):
        h = getattr(table, name)
        cols[name] = (
            pa.array([None] * len(table), pa.list_(pa.float16()))
            if h is None
            else pa.array(list(np.asarray(h, np.float16)), pa.list_(pa.float16()))
        )
    cols["block_efficiency"] = pa.array(list(table.block_efficiency.astype(np.float32)), pa.list_(pa.float32()))
    cols["step_time_s"] = pa.array(list(table.step_time_s.astype(np.float32)), pa.list_(pa.float32()))
    cols["tokens_per_s"] = pa.array(list(table.tokens_per_s.astype(np.float32)), pa.list_(pa.float32()))
    meta = {
        META_ACTIONS: json.dumps(table.actions).encode(),
        META_SCHEMA: json.dumps(SCHEMA.to_dict()).encode(),
        META_MANIFEST: json.dumps(table.manifest).encode(),
    }
    arrow = pa.table(cols).replace_schema_metadata(meta)
    atomic_write(path, lambda f: pq.write_table(arrow, f))
    return path


def read_labels(path: str | Path) -> LabelTable:
    """Read a label file (or a directory holding ``labels.parquet``); refuse another feature schema."""
    import pyarrow.parquet as pq

    path = Path(path)
    if path.is_dir():
        path = path / LABELS_FILE
    if not path.exists():
        raise FileNotFoundError(f"no label file at {path}; run `adaptive-spec label DIR` first")
    arrow = pq.read_table(path)
    meta = arrow.schema.metadata or {}
    if META_ACTIONS not in meta or META_SCHEMA not in meta:
        raise ValueError(f"{path} is not an adaptive-spec label file (no action list / schema metadata)")
    schema = json.loads(meta[META_SCHEMA])
    SCHEMA.check_compatible(schema["version"], schema["hash"], what=f"the label file {path}")
    actions = json.loads(meta[META_ACTIONS])

    def per_action(name: str) -> np.ndarray:
        values = arrow.column(name).to_pylist()
        return np.asarray(values, dtype=np.float32).reshape(len(values), len(actions))

    def hidden(name: str) -> np.ndarray | None:
        values = arrow.column(name).to_pylist()
        if not values or values[0] is None:
            return None
        return np.asarray(values, dtype=np.float16)

    return LabelTable(
        actions=actions,
        features=np.stack([arrow.column(n).to_numpy() for n in SCHEMA.names], axis=1).astype(np.float32)
        if len(arrow)
        else np.zeros((0, SCHEMA.num_scalar), np.float32),
        block_efficiency=per_action("block_efficiency"),
        step_time_s=per_action("step_time_s"),
        run_id=arrow.column("run_id").to_pylist(),
        prompt_key=arrow.column("prompt_key").to_pylist(),
        step=arrow.column("step").to_numpy().astype(np.int32),
        draft_hidden=hidden("draft_hidden"),
        target_hidden=hidden("target_hidden"),
        manifest=json.loads(meta.get(META_MANIFEST, b"{}")),
    )


def concat_tables(tables: Sequence[LabelTable]) -> LabelTable:
    """One table holding the rows of ``tables`` (e.g. label files of several collection runs).

    Every table must have the same action list. Hidden states are kept only when every table has
    them with the same widths (otherwise dropped: the selector then trains on scalar features). The
    manifest becomes ``{"parts": [each table's manifest]}`` (a single table is returned unchanged).

    Raises:
        ValueError: no tables, or the action lists differ.
    """
    tables = list(tables)
    if not tables:
        raise ValueError("no label tables to concatenate")
    if len(tables) == 1:
        return tables[0]
    actions = tables[0].actions
    for i, t in enumerate(tables[1:], 1):
        if list(t.actions) != list(actions):
            raise ValueError(
                f"label table {i} has another action list ({len(t.actions)} actions vs {len(actions)}); "
                "label every log with the same --actions file"
            )

    def hidden(name: str) -> np.ndarray | None:
        hs = [getattr(t, name) for t in tables]
        if any(h is None for h in hs) or len({h.shape[1] for h in hs}) != 1:
            return None
        return np.concatenate(hs)

    return LabelTable(
        actions=list(actions),
        features=np.concatenate([t.features for t in tables]),
        block_efficiency=np.concatenate([t.block_efficiency for t in tables]),
        step_time_s=np.concatenate([t.step_time_s for t in tables]),
        run_id=[r for t in tables for r in t.run_id],
        prompt_key=[k for t in tables for k in t.prompt_key],
        step=np.concatenate([t.step for t in tables]),
        draft_hidden=hidden("draft_hidden"),
        target_hidden=hidden("target_hidden"),
        manifest={"parts": [t.manifest for t in tables]},
    )


def read_label_sets(paths: str | Path | Sequence[str | Path]) -> LabelTable:
    """:func:`read_labels` of one path, or of several concatenated (:func:`concat_tables`)."""
    if isinstance(paths, (str, Path)):
        return read_labels(paths)
    return concat_tables([read_labels(p) for p in paths])
