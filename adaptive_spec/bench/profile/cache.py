"""The profile of a loaded pair, cached in the user data folder (measured once on first use)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from adaptive_spec.bench.profile.measure import DEFAULT_CONTEXTS, DEFAULT_TOKENS, measure_profile
from adaptive_spec.files import write_json_atomic


def cached_profile_path(engine: Any) -> Path:
    """Where :func:`latency_for_selector` keeps a profile measured on first use.

    ``<user data>/profiles/<target>-<draft>-<device>-<dtype>.json``: one per pair (by weight
    fingerprint), device type and dtype, since a profile is only valid for those.
    """
    from adaptive_spec.engine.fingerprint import pair_fingerprints
    from adaptive_spec.files import user_data_dir

    fp = pair_fingerprints(engine.target, engine.draft)
    dtype = str(engine.target.dtype).removeprefix("torch.")
    name = f"{fp['target'][:12]}-{fp['draft'][:12]}-{engine.device.type}-{dtype}.json"
    return user_data_dir() / "profiles" / name


def latency_for_selector(
    engine: Any, runtime: Any, profile: str | Path | None = None, progress: bool = True
) -> tuple[Any, str | None]:
    """The latency model for a selector's latency features, measured on first use if none exists.

    First :func:`adaptive_spec.selector.runtime.latency_model_for` (``profile``, the selector's
    own profile beside its file, the default ``data/profile/profile.json``). If none is found and
    the selector was trained with latency features, a profile of ``engine``'s pair on this
    device is measured once (about half a minute on a CPU, with progress bars) and cached at
    :func:`cached_profile_path`, where later runs find it.

    Args:
        engine: the :class:`~adaptive_spec.engine.SpecEngine` that will run the selector.
        runtime: the :class:`~adaptive_spec.selector.runtime.SelectorRuntime` (None: no selector).
        profile: an explicit latency profile JSON.
        progress: show progress bars while measuring.

    Returns:
        ``(model or None, note or None)``: the note says where a profile was measured or read
        from the cache (or why the latency features stay 0), for the caller to show.
    """
    from adaptive_spec.planner.latency import LatencyModel
    from adaptive_spec.selector.runtime import latency_model_for

    model, warning = latency_model_for(runtime, profile)
    if model is not None or warning is None:
        return model, None
    path = cached_profile_path(engine)
    if path.is_file():
        return LatencyModel.load(path), f"latency profile of this pair and device from {path}"
    windows = [
        getattr(m.config.get_text_config(), "max_position_embeddings", None) or 10**9
        for m in (engine.target, engine.draft)
    ]
    tokens = [t for t in DEFAULT_TOKENS if t <= min(windows) // 2] or [1]
    contexts = [c for c in DEFAULT_CONTEXTS if c + tokens[-1] <= min(windows)] or [0]
    t0 = time.perf_counter()
    measured = measure_profile(engine, contexts, tokens, progress=progress)
    write_json_atomic(measured, path)
    model = LatencyModel(measured)
    model.source = str(path)
    note = (
        f"the selector {runtime.path} has no latency profile here: measured one for this pair on this device in "
        f"{time.perf_counter() - t0:.0f} s, cached at {path}"
    )
    return model, note
