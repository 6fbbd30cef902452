"""Online feature logs: one record per speculative step, appended to a directory as Parquet shards.

``SpecEngine(..., feature_log=DIR)`` (or a :class:`FeatureLogger` for non-default settings) logs
every speculative step of its ordinary ``generate`` calls. A log directory holds:

- ``manifest.json``: the feature schema (``SCHEMA.to_dict()``), the models (config dicts,
  vocabulary size, dtypes, hidden sizes), whether hidden states are logged, and one entry per
  run (run id, model names/paths, device, package versions, and the caller's settings, e.g.
  sampling and seeds). A directory holds one schema and one model configuration only: a
  logger refuses a directory whose manifest differs.
- ``shard-<run_id>-<seq:05d>.parquet``: records, written to a hidden temporary file in the same
  directory, flushed and fsynced, then renamed into place, so a reader never sees a partial
  shard, even after a crash.

Columns (see :func:`arrow_schema`): ``run_id``, ``prompt_key`` (16 hex digits of the SHA-1 of the
prompt's token ids, see :func:`prompt_key`), ``prompt_index`` (-1 if unknown), ``step``, one
float32 column per feature of :data:`~adaptive_spec.formats.features.SCHEMA`,
``draft_hidden``/``target_hidden`` (list<float16>, null when not logged), ``action`` (the plan
string), ``num_nodes``, ``accepted`` (τ), ``emitted`` (tokens appended to the context, after
any EOS/budget cut), ``step_time_s`` and its phases ``draft_s``/``target_s``/``verify_s``/
``other_s`` (the last includes computing the features and the planner's choice),
``context_ids`` (the committed context at the root, root token included), ``top_k`` (the
sampling ``temperature`` and ``top_p`` are feature columns), and ``propensity`` (the
probability with which an exploring planner chose the action; null for other planners).

:func:`read_shards` reads every complete shard of a directory into one ``pyarrow.Table``.
"""

from __future__ import annotations

import atexit
import hashlib
import json
import os
import re
import secrets
import time
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from adaptive_spec.files import atomic_write
from adaptive_spec.formats.features import SCHEMA

if TYPE_CHECKING:
    import pyarrow as pa

MANIFEST = "manifest.json"
FORMAT = "adaptive_spec.feature_log"
FORMAT_VERSION = 1
SHARD_GLOB = "shard-*.parquet"
META_SCHEMA = b"adaptive_spec.schema"
META_RUN = b"adaptive_spec.run_id"
DEFAULT_SHARD_SIZE = 1024
_RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
PHASE_COLUMNS = {"draft": "draft_s", "target": "target_s", "verify": "verify_s", "other": "other_s"}


def arrow_schema() -> pa.Schema:
    """The Parquet schema of a record (without metadata)."""
    import pyarrow as pa

    fields = [
        ("run_id", pa.string()),
        ("prompt_key", pa.string()),
        ("prompt_index", pa.int32()),
        ("step", pa.int32()),
        *[(name, pa.float32()) for name in SCHEMA.names],
        ("draft_hidden", pa.list_(pa.float16())),
        ("target_hidden", pa.list_(pa.float16())),
        ("action", pa.string()),
        ("num_nodes", pa.int32()),
        ("accepted", pa.int32()),
        ("emitted", pa.int32()),
        ("step_time_s", pa.float64()),
        ("draft_s", pa.float64()),
        ("target_s", pa.float64()),
        ("verify_s", pa.float64()),
        ("other_s", pa.float64()),
        ("context_ids", pa.list_(pa.int32())),
        # temperature and top_p are feature columns above (float32)
        ("top_k", pa.int32()),
        ("propensity", pa.float32()),
    ]
    return pa.schema(fields)


def prompt_key(token_ids: Sequence[int]) -> str:
    """16 hex digits of the SHA-1 of the prompt's token ids written as decimal, comma-separated."""
    return hashlib.sha1(",".join(str(int(t)) for t in token_ids).encode()).hexdigest()[:16]


def new_run_id() -> str:
    """A fresh run id: UTC time plus 6 random hex digits, e.g. ``20250101T120000-3fa2c1``."""
    return time.strftime("%Y%m%dT%H%M%S", time.gmtime()) + "-" + secrets.token_hex(3)


def first_free_shard(directory: Path, run_id: str) -> int:
    """The sequence number after every ``shard-<run_id>-NNNNN.parquet`` in ``directory`` (never overwrite one)."""
    prefix = f"shard-{run_id}-"
    taken = [
        int(p.stem[len(prefix) :]) for p in directory.glob(f"{prefix}*.parquet") if p.stem[len(prefix) :].isdigit()
    ]
    return max(taken, default=-1) + 1


class FeatureLogger:
    """Buffers step records and appends them to ``directory`` as Parquet shards.

    Attach it to an engine with ``SpecEngine(..., feature_log=logger)``; the engine calls
    :meth:`attach` with its description (which checks or writes the manifest), :meth:`log_step`
    after each speculative step and :meth:`end_generation` after each ``generate`` call.
    Records are flushed every ``shard_size`` records, at the end of each generation (when
    ``flush_each_generation``), on :meth:`close`, at interpreter exit, and when a ``with`` block
    ends.

    Args:
        directory: the log directory (created if needed).
        shard_size: records per shard at most (>= 1).
        hidden: also log the models' hidden states (the engine then computes them).
        run_id: this run's id (letters, digits, ``_.-``); default: time plus random digits.
        manifest_extra: JSON-serialisable settings to record in this run's manifest entry
            (sampling settings, seeds, the plan or planner, ...).
        flush_each_generation: write a shard at the end of every ``generate`` call (safest for
            serving); bulk collection turns it off to get shards of ``shard_size`` records.

    Attributes:
        prompt_index: the index of the prompt being generated, written to each record (-1:
            unknown); set it before ``generate`` when the prompts come from a list.
        records_written: records in complete shards so far.
        shards: paths of the shards written by this logger.

    Raises:
        ValueError: bad ``shard_size`` or ``run_id``.
    """

    def __init__(
        self,
        directory: str | os.PathLike,
        *,
        shard_size: int = DEFAULT_SHARD_SIZE,
        hidden: bool = False,
        run_id: str | None = None,
        manifest_extra: Mapping[str, Any] | None = None,
        flush_each_generation: bool = True,
    ) -> None:
        if isinstance(shard_size, bool) or not isinstance(shard_size, int) or shard_size < 1:
            raise ValueError(f"shard_size must be an integer >= 1, got {shard_size!r}")
        run_id = new_run_id() if run_id is None else str(run_id)
        if not _RUN_ID.match(run_id):
            raise ValueError(f"run_id {run_id!r} must be letters, digits, '_', '.' or '-' (it names files)")
        self.directory = Path(directory)
        self.shard_size = shard_size
        self.hidden = bool(hidden)
        self.run_id = run_id
        self.manifest_extra = dict(manifest_extra or {})
        self.flush_each_generation = flush_each_generation
        self.prompt_index = -1
        self.records_written = 0
        self.shards: list[Path] = []
        self._columns: dict[str, list] = {name: [] for name in arrow_schema().names}
        self._attached = False
        self._closed = False
        self._seq = 0

    # ------------------------------------------------------------------ setup
    def attach(self, engine_info: Mapping[str, Any]) -> None:
        """Check the directory's manifest against ``engine_info`` (or write one); register this run.

        ``engine_info`` (from :meth:`SpecEngine.describe`) has ``models`` (what must match for
        records to be mixed) and ``run`` (what describes this run only).

        Raises:
            ValueError: the directory holds another schema, other models or another hidden
                setting; or it is not a feature log.
        """
        if self._attached:
            raise ValueError("this FeatureLogger is already attached to an engine; make one per engine")
        if self.directory.exists() and not self.directory.is_dir():
            raise ValueError(f"feature log path {self.directory} exists and is not a directory")
        self.directory.mkdir(parents=True, exist_ok=True)
        models = _json_normal(engine_info["models"])
        run = {
            "run_id": self.run_id,
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "shard_size": self.shard_size,
            **_json_normal(dict(engine_info.get("run", {}))),
            **_json_normal(self.manifest_extra),
        }
        run.setdefault("versions", {})["pyarrow"] = _version("pyarrow")
        path = self.directory / MANIFEST
        if path.exists():
            manifest = read_manifest(self.directory)
            _check_same_log(manifest, models, self.hidden, self.directory)
            if any(r.get("run_id") == self.run_id for r in manifest.get("runs", [])):
                raise ValueError(
                    f"run id {self.run_id!r} is already in {path}; pick another run_id (or leave it to the default)"
                )
            manifest.setdefault("runs", []).append(run)
        else:
            manifest = {
                "format": FORMAT,
                "format_version": FORMAT_VERSION,
                "created": run["started"],
                "schema": SCHEMA.to_dict(),
                "hidden": self.hidden,
                "models": models,
                "runs": [run],
            }
        atomic_write(path, json.dumps(manifest, indent=2, sort_keys=True).encode())
        self._attached = True
        atexit.register(self.close)

    # ------------------------------------------------------------------ records
    def log_step(
        self,
        *,
        prompt_key: str,
        step: int,
        features: Mapping[str, float],
        draft_hidden: Any,
        target_hidden: Any,
        action: str,
        num_nodes: int,
        accepted: int,
        emitted: int,
        times: Mapping[str, float],
        context_ids: Sequence[int],
        top_k: int,
        propensity: float | None = None,
    ) -> None:
        """Buffer one step record (see the module docstring for the columns); flush when full.

        ``features`` must hold exactly the schema's names; ``draft_hidden``/``target_hidden``
        are 1-D float16 arrays, or None when hidden states are not logged; ``times`` has the
        phases ``draft``, ``target``, ``verify`` and ``other`` in seconds.
        """
        if not self._attached:
            raise ValueError("attach the FeatureLogger to an engine first (SpecEngine(..., feature_log=logger))")
        if self._closed:
            raise ValueError(f"the feature log {self.directory} is closed")
        if len(features) != SCHEMA.num_scalar:
            SCHEMA.vector(features)  # raises with the missing/unexpected names
        c = self._columns
        c["run_id"].append(self.run_id)
        c["prompt_key"].append(prompt_key)
        c["prompt_index"].append(int(self.prompt_index))
        c["step"].append(int(step))
        for name in SCHEMA.names:
            c[name].append(features[name])
        c["draft_hidden"].append(draft_hidden if self.hidden else None)
        c["target_hidden"].append(target_hidden if self.hidden else None)
        c["action"].append(action)
        c["num_nodes"].append(int(num_nodes))
        c["accepted"].append(int(accepted))
        c["emitted"].append(int(emitted))
        c["step_time_s"].append(float(sum(times.get(k, 0.0) for k in PHASE_COLUMNS)))
        for phase, column in PHASE_COLUMNS.items():
            c[column].append(float(times.get(phase, 0.0)))
        c["context_ids"].append(list(context_ids))
        c["top_k"].append(int(top_k))
        c["propensity"].append(None if propensity is None else float(propensity))
        if len(c["run_id"]) >= self.shard_size:
            self.flush()

    @property
    def buffered(self) -> int:
        """Records not yet in a shard."""
        return len(self._columns["run_id"])

    def end_generation(self) -> None:
        """Called by the engine after each ``generate``: flush if ``flush_each_generation``."""
        if self.flush_each_generation:
            self.flush()

    def flush(self) -> Path | None:
        """Write the buffered records as one shard (atomically); return its path (None if empty)."""
        if not self.buffered:
            return None
        import pyarrow as pa
        import pyarrow.parquet as pq

        schema = arrow_schema().with_metadata(
            {META_SCHEMA: json.dumps(SCHEMA.to_dict()).encode(), META_RUN: self.run_id.encode()}
        )
        arrays = [pa.array(self._columns[f.name], f.type) for f in arrow_schema()]
        table = pa.Table.from_arrays(arrays, schema=schema)
        seq = self._next_seq()
        path = self.directory / f"shard-{self.run_id}-{seq:05d}.parquet"
        atomic_write(path, lambda f: pq.write_table(table, f))
        self.records_written += len(table)
        self.shards.append(path)
        for values in self._columns.values():
            values.clear()
        return path

    def _next_seq(self) -> int:
        if self._seq == 0:
            self._seq = first_free_shard(self.directory, self.run_id)
        seq, self._seq = self._seq, self._seq + 1
        return seq

    def close(self) -> None:
        """Flush what is buffered; further records are refused. Safe to call twice."""
        if self._closed:
            return
        if self._attached:
            self.flush()
            atexit.unregister(self.close)
        self._closed = True

    def __enter__(self) -> FeatureLogger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"FeatureLogger({str(self.directory)!r}, run_id={self.run_id!r}, shard_size={self.shard_size})"


# ---------------------------------------------------------------------- reading
def read_manifest(directory: str | os.PathLike) -> dict[str, Any]:
    """The manifest of a feature log directory.

    Raises:
        FileNotFoundError: no ``manifest.json`` there.
        ValueError: the file is not a feature-log manifest.
    """
    path = Path(directory) / MANIFEST
    if not path.is_file():
        raise FileNotFoundError(
            f"{Path(directory)} is not a feature log (no {MANIFEST}); "
            "collect one with `adaptive-spec collect --out DIR`"
        )
    try:
        manifest = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{path} is not valid JSON: {err}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT or "schema" not in manifest:
        raise ValueError(f"{path} is not an adaptive-spec feature log manifest")
    return manifest


def read_shards(
    directory: str | os.PathLike, columns: Sequence[str] | None = None, *, strict: bool = False
) -> pa.Table:
    """Every complete shard of a feature log directory, as one table (shard order: run id, then sequence).

    Temporary files of shards being written (or of a crashed writer) are ignored. A shard that is
    not a readable Parquet file (torn by a full disk or a copy cut short) is skipped with a warning
    naming it, unless ``strict``. The table's metadata holds the manifest
    (``adaptive_spec.manifest``) and the schema.

    Args:
        directory: the log directory.
        columns: read only these columns (default: all).
        strict: refuse the log when one shard cannot be read, instead of skipping it.

    Raises:
        FileNotFoundError: no manifest, or no complete shard.
        ValueError: the log (or one of its shards) was written with another feature schema; with
            ``strict``, an unreadable shard; without, no readable shard at all.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    directory = Path(directory)
    manifest = read_manifest(directory)
    schema = manifest["schema"]
    SCHEMA.check_compatible(schema.get("version"), schema.get("hash"), what=f"the feature log {directory}")
    files = sorted(directory.glob(SHARD_GLOB))
    if not files:
        raise FileNotFoundError(f"the feature log {directory} has no complete shards yet")
    tables, torn = [], []
    for path in files:
        try:
            table = pq.read_table(path, columns=list(columns) if columns is not None else None)
        except (pa.ArrowException, OSError) as err:
            if strict:
                raise ValueError(f"shard {path} cannot be read ({err}); move it out of {directory}") from None
            warnings.warn(f"skipping shard {path}: not a readable Parquet file ({err})", UserWarning, stacklevel=2)
            torn.append(path.name)
            continue
        meta = json.loads((table.schema.metadata or {}).get(META_SCHEMA, b"{}"))
        if meta.get("hash") != schema.get("hash"):
            raise ValueError(
                f"shard {path.name} was written with feature schema {meta.get('hash')!r}, but {directory}/{MANIFEST} "
                f"says {schema.get('hash')!r}; move it out of the directory"
            )
        tables.append(table.replace_schema_metadata(None))
    if not tables:
        raise ValueError(f"no shard of the feature log {directory} can be read (all {len(torn)} are torn)")
    out = pa.concat_tables(tables)
    return out.replace_schema_metadata(
        {b"adaptive_spec.manifest": json.dumps(manifest).encode(), META_SCHEMA: json.dumps(schema).encode()}
    )


# ---------------------------------------------------------------------- helpers
def _check_same_log(manifest: Mapping[str, Any], models: Any, hidden: bool, directory: Path) -> None:
    schema = manifest.get("schema", {})
    SCHEMA.check_compatible(schema.get("version"), schema.get("hash"), what=f"the feature log {directory}")
    if manifest.get("models") != models:
        diff = _differences(manifest.get("models"), models)
        raise ValueError(
            f"the feature log {directory} was collected with other models or model settings ({'; '.join(diff[:5])}); "
            "records of different models must not be mixed: write to another directory"
        )
    if bool(manifest.get("hidden")) != hidden:
        said = "with" if manifest.get("hidden") else "without"
        raise ValueError(
            f"the feature log {directory} was collected {said} hidden states; use the same setting "
            "(--hidden / FeatureLogger(hidden=...)) or another directory"
        )


def _differences(a: Any, b: Any, where: str = "models") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for key in sorted(set(a) | set(b)):
            out += _differences(a.get(key), b.get(key), f"{where}.{key}")
        return out
    return [] if a == b else [f"{where}: {a!r} here vs {b!r} now"]


def _json_normal(value: Any) -> Any:
    """``value`` as it reads back from JSON (tuples -> lists, int keys -> strings, other types -> str)."""
    return json.loads(json.dumps(value, sort_keys=True, default=str))


def _version(package: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return None
