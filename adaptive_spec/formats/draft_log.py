"""Draft-data logs: the target's features and top-k laws of committed positions, for online distillation.

``engine.draft_data = DraftDataLogger(DIR)`` (or ``collect --draft-data DIR``, ``generate``/``bench
spec-bench --draft-data DIR``) logs, for every speculative generation, the committed token of each
position, the target's last hidden state there (float16, what an EAGLE head reads) and the target's
top-``k`` next-token law there at T = 1 (the soft label a head learns from). The prompt's positions
have features but no law (the prefill keeps one logits row); every position the target scored in a
step (each step's root and its accepted nodes) has both. ``adaptive-spec zoo drafts --from-logs DIR``
fine-tunes a head on them.

The conventions are those of :mod:`adaptive_spec.formats.feature_log`:

- ``manifest.json``: ``format`` (``adaptive_spec.draft_log``), ``format_version``, ``hidden_size``,
  ``top_k``, the ``models`` (which must match for logs to be mixed: a logger refuses a directory whose
  manifest differs) and one entry per run;
- ``shard-<run_id>-<seq:05d>.parquet``: one row per generation, written to a temporary file, fsynced and
  renamed into place (a reader never sees a partial shard); a shard is written whenever the buffered
  generations hold ``shard_tokens`` positions, at :meth:`DraftDataLogger.close` and at interpreter exit.
  A stopped collection resumes by skipping the prompts already logged (:func:`logged_keys`).

Columns: ``run_id``, ``prompt_key`` (as in feature logs), ``prompt_index``, ``temperature``,
``prompt_length``, ``ids`` (list<int32> [n]), ``features`` (list<float16> [n * hidden_size], row-major),
``law_positions`` (list<int32> [m], the positions with a law), ``top_ids`` (list<int32> [m * top_k])
and ``top_p`` (list<float16> [m * top_k]).
"""

from __future__ import annotations

import atexit
import json
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from adaptive_spec.files import atomic_write
from adaptive_spec.formats.feature_log import (
    _differences,
    _json_normal,
    _version,
    first_free_shard,
    new_run_id,
    prompt_key,
)

__all__ = ["DRAFT_LOG_FORMAT", "DraftDataLogger", "logged_keys", "read_draft_log", "read_draft_manifest"]

DRAFT_LOG_FORMAT = "adaptive_spec.draft_log"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
SHARD_GLOB = "shard-*.parquet"
DEFAULT_TOP_K = 32
DEFAULT_SHARD_TOKENS = 8192  # 8192 x 576 fp16 features: about 9.5 MB per shard for SmolLM2


def arrow_schema() -> Any:
    import pyarrow as pa

    return pa.schema(
        [
            ("run_id", pa.string()),
            ("prompt_key", pa.string()),
            ("prompt_index", pa.int32()),
            ("temperature", pa.float32()),
            ("prompt_length", pa.int32()),
            ("ids", pa.list_(pa.int32())),
            ("features", pa.list_(pa.float16())),
            ("law_positions", pa.list_(pa.int32())),
            ("top_ids", pa.list_(pa.int32())),
            ("top_p", pa.list_(pa.float16())),
        ]
    )


class DraftDataLogger:
    """Collects committed positions from an engine and appends them to ``directory`` (see the module docstring).

    The engine calls :meth:`begin` after each prefill, :meth:`add` after each speculative step's commit and
    :meth:`end_generation` when a generation ends. Set :attr:`prompt_index` and :attr:`temperature` before a
    ``generate`` call to record them.

    Raises:
        ValueError: ``top_k`` or ``shard_tokens`` < 1, or a bad ``run_id``.
    """

    def __init__(
        self,
        directory: str | os.PathLike,
        *,
        top_k: int = DEFAULT_TOP_K,
        shard_tokens: int = DEFAULT_SHARD_TOKENS,
        run_id: str | None = None,
        manifest_extra: Mapping[str, Any] | None = None,
    ) -> None:
        if int(top_k) < 1 or int(shard_tokens) < 1:
            raise ValueError(f"top_k and shard_tokens must be >= 1, got {top_k} and {shard_tokens}")
        from adaptive_spec.formats.feature_log import _RUN_ID

        run_id = new_run_id() if run_id is None else str(run_id)
        if not _RUN_ID.match(run_id):
            raise ValueError(f"run_id {run_id!r} must be letters, digits, '_', '.' or '-' (it names files)")
        self.directory = Path(directory)
        self.top_k = int(top_k)
        self.shard_tokens = int(shard_tokens)
        self.run_id = run_id
        self.manifest_extra = dict(manifest_extra or {})
        self.prompt_index = -1
        self.temperature = float("nan")
        self.tokens_written = 0
        self.shards: list[Path] = []
        self.hidden_size: int | None = None
        self._rows: list[dict[str, Any]] = []
        self._buffered = 0
        self._cur: dict[str, Any] | None = None
        self._attached = False
        self._closed = False
        self._seq = 0

    # ------------------------------------------------------------------ setup
    def attach(self, engine_info: Mapping[str, Any], hidden_size: int) -> None:
        """Check the directory's manifest against the engine's ``models`` (or write one); register this run.

        Raises:
            ValueError: the directory holds a log of other models, another width or top-k, or is not a draft log.
        """
        if self._attached:
            raise ValueError("this DraftDataLogger is already attached to an engine; make one per engine")
        if self.directory.exists() and not self.directory.is_dir():
            raise ValueError(f"draft-data path {self.directory} exists and is not a directory")
        self.directory.mkdir(parents=True, exist_ok=True)
        self.hidden_size = int(hidden_size)
        models = _json_normal(engine_info["models"])
        run = {
            "run_id": self.run_id,
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            **_json_normal(dict(engine_info.get("run", {}))),
            **_json_normal(self.manifest_extra),
        }
        run.setdefault("versions", {})["pyarrow"] = _version("pyarrow")
        path = self.directory / MANIFEST
        if path.exists():
            manifest = read_draft_manifest(self.directory)
            if manifest.get("models") != models:
                diff = _differences(manifest.get("models"), models)
                raise ValueError(
                    f"the draft log {self.directory} was collected with other models ({'; '.join(diff[:3])}); "
                    "write to another directory"
                )
            if (manifest.get("hidden_size"), manifest.get("top_k")) != (self.hidden_size, self.top_k):
                raise ValueError(
                    f"the draft log {self.directory} has hidden size {manifest.get('hidden_size')} and top-k "
                    f"{manifest.get('top_k')}, not {self.hidden_size} and {self.top_k}; write to another directory"
                )
            if any(r.get("run_id") == self.run_id for r in manifest.get("runs", [])):
                raise ValueError(f"run id {self.run_id!r} is already in {path}; pick another run_id")
            manifest.setdefault("runs", []).append(run)
        else:
            manifest = {
                "format": DRAFT_LOG_FORMAT,
                "format_version": FORMAT_VERSION,
                "created": run["started"],
                "hidden_size": self.hidden_size,
                "top_k": self.top_k,
                "models": models,
                "runs": [run],
            }
        atomic_write(path, json.dumps(manifest, indent=2, sort_keys=True).encode())
        self._attached = True
        atexit.register(self.close)

    # ------------------------------------------------------------------ the engine's calls
    def begin(self, prompt_ids: Sequence[int], features: torch.Tensor | None) -> None:
        """A new generation: its prompt, and the target's features of its first ``len(features)`` positions."""
        if not self._attached:
            raise ValueError("attach the DraftDataLogger to an engine first (engine.draft_data = logger)")
        if self._closed:
            raise ValueError(f"the draft log {self.directory} is closed")
        self.end_generation()
        ids = [int(t) for t in prompt_ids]
        self._cur = {"prompt": ids, "ids": [], "feat": [], "law_pos": [], "top_ids": [], "top_p": []}
        if features is not None and features.shape[0]:
            self.add(0, ids[: features.shape[0]], features, None, 0)

    def add(
        self, start: int, tokens: Sequence[int], features: torch.Tensor, logits: torch.Tensor | None, first_law: int
    ) -> None:
        """Positions ``start .. start + k - 1``: their tokens, the target's features there (Tensor[k, H]), and
        the target's logits rows (Tensor[k - first_law, V]) of the positions from ``start + first_law`` on.
        """
        cur = self._cur
        if cur is None:
            return
        if start != len(cur["ids"]):
            raise RuntimeError(f"draft data: positions from {start}, but {len(cur['ids'])} are logged")
        cur["ids"].extend(int(t) for t in tokens)
        cur["feat"].append(features.detach().to("cpu", torch.float16))
        if logits is not None and logits.shape[0]:
            top = torch.softmax(logits.detach().float(), dim=-1).topk(self.top_k, dim=-1)
            cur["law_pos"].extend(range(start + first_law, start + first_law + logits.shape[0]))
            cur["top_ids"].append(top.indices.to("cpu", torch.int32))
            cur["top_p"].append(top.values.to("cpu", torch.float16))

    def end_generation(self) -> None:
        """Buffer the current generation as one row; write a shard when ``shard_tokens`` positions are buffered."""
        cur, self._cur = self._cur, None
        if cur is None or not cur["ids"]:
            return
        feat = torch.cat(cur["feat"])
        top_ids = torch.cat(cur["top_ids"]) if cur["top_ids"] else torch.zeros(0, self.top_k, dtype=torch.int32)
        top_p = torch.cat(cur["top_p"]) if cur["top_p"] else torch.zeros(0, self.top_k, dtype=torch.float16)
        self._rows.append(
            {
                "run_id": self.run_id,
                "prompt_key": prompt_key(cur["prompt"]),
                "prompt_index": int(self.prompt_index),
                "temperature": float(self.temperature),
                "prompt_length": len(cur["prompt"]),
                "ids": cur["ids"],
                "features": feat.reshape(-1).numpy(),
                "law_positions": cur["law_pos"],
                "top_ids": top_ids.reshape(-1).numpy(),
                "top_p": top_p.reshape(-1).numpy(),
            }
        )
        self._buffered += len(cur["ids"])
        if self._buffered >= self.shard_tokens:
            self.flush()

    # ------------------------------------------------------------------ shards
    def flush(self) -> Path | None:
        """Write the buffered generations as one shard (atomically); its path (None if nothing was buffered)."""
        if not self._rows:
            return None
        import pyarrow as pa
        import pyarrow.parquet as pq

        schema = arrow_schema()
        arrays = []
        for f in schema:
            values = [r[f.name] for r in self._rows]
            if f.name in ("features", "top_p", "top_ids"):
                import numpy as np

                flat = np.concatenate(values) if values else np.zeros(0)
                offsets = np.cumsum([0, *(len(v) for v in values)]).astype(np.int32)
                arrays.append(pa.ListArray.from_arrays(pa.array(offsets), pa.array(flat, f.type.value_type)))
            else:
                arrays.append(pa.array(values, f.type))
        table = pa.Table.from_arrays(arrays, schema=schema)
        seq = self._next_seq()
        path = self.directory / f"shard-{self.run_id}-{seq:05d}.parquet"
        atomic_write(path, lambda fh: pq.write_table(table, fh))
        self.tokens_written += self._buffered
        self.shards.append(path)
        self._rows, self._buffered = [], 0
        return path

    def _next_seq(self) -> int:
        if self._seq == 0:
            self._seq = first_free_shard(self.directory, self.run_id)
        seq, self._seq = self._seq, self._seq + 1
        return seq

    def close(self) -> None:
        """End the current generation and write what is buffered; further generations are refused."""
        if self._closed:
            return
        if self._attached:
            self.end_generation()
            self.flush()
            atexit.unregister(self.close)
        self._closed = True

    def __enter__(self) -> DraftDataLogger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# ---------------------------------------------------------------------- reading
def read_draft_manifest(directory: str | os.PathLike) -> dict[str, Any]:
    """The manifest of a draft log.

    Raises:
        FileNotFoundError: no ``manifest.json`` there. ValueError: not a draft log's manifest.
    """
    path = Path(directory) / MANIFEST
    if not path.is_file():
        raise FileNotFoundError(
            f"{Path(directory)} is not a draft log (no {MANIFEST}); "
            "log one with `adaptive-spec collect --draft-data DIR`"
        )
    try:
        manifest = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{path} is not valid JSON: {err}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != DRAFT_LOG_FORMAT:
        raise ValueError(f"{path} is not an adaptive-spec draft log manifest")
    return manifest


def _tables(directory: Path, columns: Sequence[str] | None = None) -> list[Any]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    out = []
    for path in sorted(directory.glob(SHARD_GLOB)):
        try:
            out.append(pq.read_table(path, columns=list(columns) if columns is not None else None))
        except (pa.ArrowException, OSError) as err:
            import warnings

            warnings.warn(f"skipping shard {path}: not a readable Parquet file ({err})", UserWarning, stacklevel=3)
    return out


def logged_keys(directory: str | os.PathLike) -> list[tuple[str, int]]:
    """``(prompt_key, prompt_index)`` of every generation already logged (empty for a new directory)."""
    directory = Path(directory)
    if not (directory / MANIFEST).exists():
        return []
    keys = []
    for t in _tables(directory, ["prompt_key", "prompt_index"]):
        keys += list(zip(t.column("prompt_key").to_pylist(), t.column("prompt_index").to_pylist(), strict=True))
    return keys


def read_draft_log(directory: str | os.PathLike) -> list[dict[str, Any]]:
    """Every logged generation: ``prompt_key``, ``prompt_index``, ``temperature``, ``prompt_length`` and tensors
    ``ids`` (int32 [n]), ``feat`` (fp16 [n, H]), ``law_positions`` (int64 [m]), ``top_ids`` (int32 [m, K]),
    ``top_p`` (fp16 [m, K]).

    Raises:
        FileNotFoundError: no manifest, or no complete shard. ValueError: not a draft log.
    """
    directory = Path(directory)
    manifest = read_draft_manifest(directory)
    H, K = int(manifest["hidden_size"]), int(manifest["top_k"])
    tables = _tables(directory)
    if not tables:
        raise FileNotFoundError(f"the draft log {directory} has no complete shards yet")
    out = []
    for t in tables:
        cols = {name: _lists(t.column(name)) for name in ("ids", "features", "law_positions", "top_ids", "top_p")}
        meta = t.select(["prompt_key", "prompt_index", "temperature", "prompt_length"]).to_pylist()
        for i, r in enumerate(meta):
            ids, feat, law, top_ids, top_p = (cols[c][i] for c in cols)
            n, m = len(ids), len(law)
            out.append(
                {
                    **r,
                    "ids": torch.from_numpy(ids.astype("int32")),
                    "feat": torch.from_numpy(feat.astype("float16")).reshape(n, H),
                    "law_positions": torch.from_numpy(law.astype("int64")),
                    "top_ids": torch.from_numpy(top_ids.astype("int32")).reshape(m, K),
                    "top_p": torch.from_numpy(top_p.astype("float16")).reshape(m, K),
                }
            )
    return out


def _lists(column: Any) -> list[Any]:
    """A list<...> column as one numpy array per row (no Python objects per value)."""
    arr = column.combine_chunks()
    values = arr.flatten().to_numpy(zero_copy_only=False)
    offsets = arr.offsets.to_numpy()
    offsets = offsets - offsets[0]
    return [values[offsets[i] : offsets[i + 1]] for i in range(len(arr))]
