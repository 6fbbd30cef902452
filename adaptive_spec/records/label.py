"""``adaptive-spec label DIR``: label a feature log, and the label report.

Takes every k-th logged root context of a feature log (the Parquet shards written by
``collect`` or by ``SpecEngine(feature_log=DIR)``), labels it for every action with the models
that logged it (:class:`~adaptive_spec.records.labeller.Labeller`), writes ``labels.parquet``
atomically, and reports the oracle gain over the best static action.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections import defaultdict
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from adaptive_spec.formats.features import SCHEMA
from adaptive_spec.formats.label_table import LABELS_FILE, LabelTable, write_labels
from adaptive_spec.records.labeller import LabelConfig, Labeller

__all__ = ["LabelConfig", "label_directory", "label_log", "label_report", "log_models", "select_roots", "write_report"]


def select_roots(table, every: int, max_contexts: int | None) -> list[int]:
    """Row indices of the logged roots to label: steps that are multiples of ``every``."""
    steps = table.column("step").to_numpy()
    rows = [i for i, s in enumerate(steps) if int(s) % every == 0]
    return rows[:max_contexts] if max_contexts is not None else rows


def label_directory(
    log_dir: str | Path,
    labeller: Labeller,
    *,
    out: str | Path | None = None,
    progress: bool = True,
    strict: bool = False,
) -> tuple[LabelTable, Path]:
    """Label the roots of a feature log; write ``labels.parquet`` next to the shards (atomically).

    A torn shard is skipped with a warning naming it, unless ``strict`` (then it is an error).
    """
    from tqdm.auto import tqdm

    from adaptive_spec.formats.feature_log import read_shards

    log_dir = Path(log_dir)
    table = read_shards(log_dir, strict=strict)
    manifest_path = log_dir / "manifest.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
    cfg = labeller.config
    rows = select_roots(table, cfg.every, cfg.max_contexts)
    if not rows:
        raise ValueError(f"{log_dir}: no logged step is a multiple of every={cfg.every}; lower --every")
    cols = {
        name: table.column(name)
        for name in ("run_id", "prompt_key", "step", "context_ids", "temperature", "top_k", "top_p")
    }
    feats = np.stack([table.column(name).to_numpy() for name in SCHEMA.names], axis=1).astype(np.float32)
    hidden = {h: table.column(h) if h in table.column_names else None for h in ("draft_hidden", "target_hidden")}
    be, times = [], []
    t0 = time.perf_counter()
    for i in tqdm(rows, desc="labelling roots", unit="root", disable=not progress):
        ctx = cols["context_ids"][i].as_py()
        seed = int.from_bytes(hashlib.sha256(f"{cfg.seed}:{i}:{cols['run_id'][i]}".encode()).digest()[:4], "little")
        b, t = labeller.label(
            ctx,
            float(cols["temperature"][i].as_py()),
            int(cols["top_k"][i].as_py()),
            float(cols["top_p"][i].as_py()),
            seed,
        )
        be.append(b)
        times.append(t)

    def hidden_rows(name: str) -> np.ndarray | None:
        col = hidden[name]
        if col is None or col[rows[0]].as_py() is None:
            return None
        return np.asarray([col[i].as_py() for i in rows], dtype=np.float16)

    label_manifest = {
        "log": manifest,
        "label_config": asdict(cfg),
        "actions": [str(p) for p in labeller.plans],
        "latency_profile": getattr(labeller.latency, "profile", {}).get("device", None),
        "seconds": round(time.perf_counter() - t0, 1),
        "roots": len(rows),
    }
    out_table = LabelTable(
        actions=[str(p) for p in labeller.plans],
        features=feats[rows],
        block_efficiency=np.asarray(be, np.float32),
        step_time_s=np.asarray(times, np.float32),
        run_id=[str(cols["run_id"][i]) for i in rows],
        prompt_key=[str(cols["prompt_key"][i]) for i in rows],
        step=np.asarray([int(cols["step"][i].as_py()) for i in rows], np.int32),
        draft_hidden=hidden_rows("draft_hidden"),
        target_hidden=hidden_rows("target_hidden"),
        manifest=label_manifest,
    )
    path = write_labels(out_table, Path(out) if out is not None else log_dir / LABELS_FILE)
    return out_table, path


# ---------------------------------------------------------------------------------------- the report
def _family(plan: str) -> str:
    return plan.split(":", 1)[0]


def label_report(table: LabelTable) -> dict[str, Any]:
    """Summary of a label set: best actions, winning verifiers/shapes, oracle gain per temperature."""
    tps = table.tokens_per_s
    temps = table.features[:, SCHEMA.names.index("temperature")]
    out: dict[str, Any] = {"roots": len(table), "actions": len(table.actions), "per_temperature": {}}
    best = tps.argmax(axis=1)
    for t in sorted({round(float(x), 3) for x in temps}):
        sel = np.isclose(temps, t)
        sub, b = tps[sel], best[sel]
        static = int(sub.mean(axis=0).argmax())
        oracle = float(sub.max(axis=1).mean() / sub[:, static].mean())
        counts = np.bincount(b, minlength=len(table.actions))
        verifier_wins: dict[str, int] = defaultdict(int)
        family_wins: dict[str, int] = defaultdict(int)
        for a, c in enumerate(counts):
            if c:
                verifier_wins[table.actions[a].split("/")[1]] += int(c)
                family_wins[_family(table.actions[a])] += int(c)
        top = np.argsort(-counts)[:10]
        out["per_temperature"][str(t)] = {
            "roots": int(sel.sum()),
            "best_static": table.actions[static],
            "best_static_tokens_per_s": float(sub[:, static].mean()),
            "oracle_tokens_per_s": float(sub.max(axis=1).mean()),
            "oracle_gain": oracle,
            "best_static_block_efficiency": float(table.block_efficiency[sel][:, static].mean()),
            "top_best_actions": {table.actions[a]: int(counts[a]) for a in top if counts[a]},
            "verifier_wins": dict(sorted(verifier_wins.items(), key=lambda kv: -kv[1])),
            "family_wins": dict(sorted(family_wins.items(), key=lambda kv: -kv[1])),
            "distinct_best_actions": int((counts > 0).sum()),
        }
    return out


def write_report(table: LabelTable, out_dir: str | Path) -> dict[str, Any]:
    """Write ``report.json``, ``report.md`` and PNG plots of a label set to ``out_dir``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    rep = label_report(table)
    (out_dir / "report.json").write_text(json.dumps(rep, indent=2))
    temps = list(rep["per_temperature"])
    fig, axes = plt.subplots(len(temps), 3, figsize=(16, 3.6 * len(temps)), squeeze=False)
    for r, t in enumerate(temps):
        d = rep["per_temperature"][t]
        ax = axes[r][0]
        names = list(d["top_best_actions"])[::-1]
        ax.barh(names, [d["top_best_actions"][n] for n in names], color="tab:blue")
        ax.set_title(f"T={t}: most frequent best actions ({d['distinct_best_actions']} distinct)")
        ax.tick_params(axis="y", labelsize=7)
        for c, key, title in ((1, "verifier_wins", "verifier"), (2, "family_wins", "tree shape")):
            ax = axes[r][c]
            ax.bar(list(d[key]), list(d[key].values()), color="tab:green" if c == 1 else "tab:orange")
            ax.set_title(f"T={t}: wins per {title}")
            ax.tick_params(axis="x", labelrotation=30, labelsize=8)
    fig.suptitle("Label set: which action has the highest predicted tokens/s per root")
    fig.tight_layout()
    fig.savefig(out_dir / "best_actions.png", dpi=110)
    plt.close(fig)
    lines = [
        "# Label report",
        "",
        f"{rep['roots']} roots, {rep['actions']} actions.",
        "",
        "| T | roots | best static | its tok/s | oracle tok/s | **oracle gain** | distinct best |",
        "|---|---|---|---|---|---|---|",
    ]
    for t, d in rep["per_temperature"].items():
        lines.append(
            f"| {t} | {d['roots']} | `{d['best_static']}` | {d['best_static_tokens_per_s']:.1f} | "
            f"{d['oracle_tokens_per_s']:.1f} | **{d['oracle_gain']:.3f}** | {d['distinct_best_actions']} |"
        )
    lines += ["", "![best actions](best_actions.png)", ""]
    (out_dir / "report.md").write_text("\n".join(lines))
    return rep


def log_models(manifest: dict, target: str | None = None, draft: str | None = None) -> tuple[str | None, str | None]:
    """The models to label a log with: explicit, else the log's last run's (if they are local folders), else built-in.

    ``(None, None)`` means the built-in pair. Raises ``ValueError`` when only one of the two is given.
    """
    if target or draft:
        from adaptive_spec.engine.models import PAIRED_DRAFT

        if not (target and (draft or target in PAIRED_DRAFT)):
            raise ValueError("give both --target and --draft, a short-named --target alone (smollm2), or neither")
        return target, draft
    runs = manifest.get("runs") or []
    if runs:
        logged_target, logged_draft = runs[-1].get("target"), runs[-1].get("draft")
        if logged_target and logged_draft and Path(logged_target).is_dir() and Path(logged_draft).is_dir():
            return logged_target, logged_draft
    return None, None


def label_log(
    log_dir: str | Path,
    config: LabelConfig,
    *,
    target: str | None = None,
    draft: str | None = None,
    device: str | None = None,
    dtype: str | None = None,
    actions: str | Path | None = None,
    profile: str | Path | None = None,
    out: str | Path | None = None,
    progress: bool = True,
    strict: bool = False,
) -> tuple[LabelTable, Path]:
    """Label a feature log with the models that logged it (see :func:`log_models`); write the label file.

    The models are loaded in the logged dtype unless ``dtype`` is given; ``actions`` is an
    action-space YAML (default: the built-in grid), ``profile`` a latency profile (default:
    :func:`~adaptive_spec.planner.latency.default_profile_path`), ``out`` the label file (default
    ``log_dir/labels.parquet``), ``strict`` refuses a log with a torn shard (default: skip it with a
    warning). Returns the table and the file written.

    Raises:
        ValueError: the loaded models are not the ones that produced the log.
    """
    from adaptive_spec.engine import SpecEngine
    from adaptive_spec.formats.feature_log import _differences, _json_normal, read_manifest
    from adaptive_spec.planner.actions import ActionSpace
    from adaptive_spec.planner.latency import LatencyModel

    manifest = read_manifest(log_dir)
    target, draft = log_models(manifest, target, draft)
    logged = manifest.get("models")
    dtype = dtype or (logged or {}).get("target", {}).get("dtype")  # label in the dtype that was logged
    engine = SpecEngine.from_pretrained(target, draft, device=device, dtype=dtype)
    if logged is not None and _json_normal(engine.describe()["models"]) != logged:
        diff = "; ".join(_differences(logged, _json_normal(engine.describe()["models"]))[:5])
        raise ValueError(
            f"{log_dir} was logged with other models than the ones loaded for labelling ({diff}); pass the "
            "log's models with --target/--draft (labels must use the models that produced the features)"
        )
    space = ActionSpace.from_yaml(actions) if actions else ActionSpace.default()
    latency = LatencyModel.load(profile)
    labeller = Labeller(engine.target, engine.draft, list(space), latency, engine.vocab_size, config)
    return label_directory(log_dir, labeller, out=out, progress=progress, strict=strict)
