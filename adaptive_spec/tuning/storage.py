"""Study storage: any SQLAlchemy URL, heartbeats so that a killed worker's trial is failed, seeded samplers.

``sqlite:///data/tuning/optuna.db`` (relative to the working directory) is the embedded default;
``postgresql+psycopg2://user@host:port/db`` (or any URL SQLAlchemy and Optuna's RDB storage
accept) works the same. Several worker processes may run the same study against one storage.

Killed workers: every running trial records a heartbeat every ``heartbeat_interval`` seconds.
A trial whose heartbeat is older than ``grace_period`` is *stale*: the next worker that opens
the study (or starts a trial in it) marks it ``FAIL`` (``optuna.storages.fail_stale_trials``)
and, through :class:`optuna.storages.RetryHeartbeatStaleTrialCallback`, re-enqueues its
parameters once, so a plan interrupted by a crash is measured again rather than lost.

SQLite: every transaction is ``BEGIN IMMEDIATE`` (see :func:`_serialize_sqlite`), so worker
processes on one file never claim the same enqueued trial; a server database (PostgreSQL) is
still the better choice for many workers.

Seeds: worker ``w`` of a study samples with ``TPESampler(seed=worker_seed(seed, w, key))``, a
fixed function of the base seed, the worker index and the study; distinct workers therefore
draw distinct but reproducible random streams. (With several workers the *order* in which
trials finish still depends on timing, so only single-worker studies replay exactly.)
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import random
import time
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import optuna

__all__ = ["DEFAULT_STORAGE", "check_settings", "make_storage", "open_study", "sqlite_path", "worker_seed"]

DEFAULT_STORAGE = "sqlite:///data/tuning/optuna.db"
DEFAULT_HEARTBEAT_S = 10
DEFAULT_GRACE_S = 30
_OPEN_ATTEMPTS = 5

log = logging.getLogger(__name__)


def sqlite_path(url: str) -> Path | None:
    """The database file of a ``sqlite:///`` URL (None for other back ends and in-memory SQLite)."""
    from sqlalchemy.engine import make_url

    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite" or parsed.database in (None, "", ":memory:"):
        return None
    return Path(parsed.database)


def postgres_driver_url(url: str) -> str:
    """A ``postgresql://`` URL with the driver that is installed made explicit.

    SQLAlchemy 2 maps a bare ``postgresql://`` to psycopg2; recent releases to psycopg 3.
    Whichever of the two is installed is named in the URL (psycopg 3 first); other URLs are
    returned unchanged.

    Raises:
        ValueError: a bare PostgreSQL URL and neither driver is installed (names the extra).
    """
    import importlib.util

    scheme, sep, rest = url.partition("://")
    if not sep or scheme not in ("postgresql", "postgres"):
        return url
    for module, driver in (("psycopg", "psycopg"), ("psycopg2", "psycopg2")):
        if importlib.util.find_spec(module) is not None:
            return f"postgresql+{driver}://{rest}"
    raise ValueError(
        f"storage {url!r} needs a PostgreSQL driver and neither psycopg nor psycopg2 is installed; "
        "install the extra: pip install 'adaptive-spec[postgres]'"
    )


def make_storage(
    url: str = DEFAULT_STORAGE,
    heartbeat_interval: int = DEFAULT_HEARTBEAT_S,
    grace_period: int = DEFAULT_GRACE_S,
    retry_stale: int = 1,
) -> optuna.storages.RDBStorage:
    """An RDB storage with heartbeats; creates the folder of a SQLite file.

    Args:
        url: SQLAlchemy URL.
        heartbeat_interval: seconds between a running trial's heartbeats.
        grace_period: seconds without a heartbeat after which a running trial counts as dead.
        retry_stale: how many times a dead trial's parameters are enqueued again (0: never).

    Raises:
        ValueError: a malformed URL, or a back end that cannot be reached (the message names it).
    """
    import optuna
    from sqlalchemy.exc import ArgumentError, DBAPIError

    if grace_period <= heartbeat_interval:
        raise ValueError(
            f"grace_period ({grace_period} s) must exceed heartbeat_interval ({heartbeat_interval} s), "
            "or live trials would be failed"
        )
    engine_kwargs = {}
    try:
        db_file = sqlite_path(url)
    except ArgumentError as err:
        msg = f"storage {url!r} is not a SQLAlchemy URL (e.g. sqlite:///data/tuning/optuna.db): {err}"
        raise ValueError(msg) from None
    url = postgres_driver_url(url)
    if db_file is not None:
        db_file.parent.mkdir(parents=True, exist_ok=True)
        # Several processes write one SQLite file: wait for the lock instead of failing after 5 s.
        engine_kwargs["connect_args"] = {"timeout": 120}
    else:
        engine_kwargs["pool_pre_ping"] = True
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        callback = optuna.storages.RetryHeartbeatStaleTrialCallback(max_retry=retry_stale) if retry_stale else None
        for attempt in range(_OPEN_ATTEMPTS):
            try:
                storage = optuna.storages.RDBStorage(
                    url,
                    engine_kwargs=engine_kwargs,
                    heartbeat_interval=heartbeat_interval,
                    grace_period=grace_period,
                    heartbeat_stale_trial_callback=callback,
                )
                if db_file is not None:
                    _serialize_sqlite(storage.engine)
                return storage
            except ImportError as err:  # the URL's database driver is not installed
                raise ValueError(
                    f"cannot open the study storage {url!r}: its database driver is not installed ({err}); "
                    "for PostgreSQL install the extra: pip install 'adaptive-spec[postgres]'"
                ) from err
            except DBAPIError as err:
                # Workers starting together on a fresh storage race to create its tables and stamp
                # the schema version; the loser sees a duplicate and finds the schema on a retry.
                if attempt == _OPEN_ATTEMPTS - 1:
                    raise ValueError(f"cannot open the study storage {url!r}: {err}") from err
                time.sleep(0.2 * (attempt + 1) + random.random() * 0.2)
    raise AssertionError("unreachable")


def _serialize_sqlite(engine) -> None:
    """Make every SQLite transaction ``BEGIN IMMEDIATE`` (SQLAlchemy's pysqlite recipe).

    Optuna claims a waiting (enqueued) trial by reading its state and then writing RUNNING, with
    ``SELECT ... FOR UPDATE``, which SQLite ignores: two processes could both read WAITING and run
    the same trial (the second then fails with "Cannot tell a COMPLETE trial"). An immediate
    transaction takes the database's write lock when it begins, so such read-then-write steps of
    different processes no longer interleave; waiting for the lock is bounded by the connection
    timeout.
    """
    from sqlalchemy import event

    @event.listens_for(engine, "connect")
    def _no_implicit_begin(dbapi_connection, _record) -> None:
        dbapi_connection.isolation_level = None  # pysqlite emits no BEGIN of its own

    @event.listens_for(engine, "begin")
    def _begin_immediate(conn) -> None:
        conn.exec_driver_sql("BEGIN IMMEDIATE")

    engine.dispose()  # connections opened before the listeners existed


def worker_seed(seed: int, worker: int, key: str = "") -> int:
    """A 32-bit sampler seed for worker ``worker`` of the study ``key``, fixed by ``seed``."""
    if worker < 0:
        raise ValueError(f"worker index must be >= 0, got {worker}")
    digest = hashlib.sha256(f"{seed}:{worker}:{key}".encode()).digest()
    return int.from_bytes(digest[:4], "little")


def open_study(
    name: str,
    storage: optuna.storages.BaseStorage | str,
    *,
    seed: int = 0,
    worker: int = 0,
    direction: str = "maximize",
    pruner: optuna.pruners.BasePruner | None = None,
    n_startup_trials: int = 5,
) -> optuna.Study:
    """Create the study or resume it (``load_if_exists``), with a seeded TPE sampler.

    Opening a study also fails the trials of dead workers (stale heartbeats), so a resumed
    study never keeps a ``RUNNING`` trial that nobody runs.

    Args:
        name: study name.
        storage: an :class:`~optuna.storages.RDBStorage` (see :func:`make_storage`) or a URL.
        seed: base seed; the sampler's seed is :func:`worker_seed` of it.
        worker: index of this worker process (give parallel workers distinct indices).
        direction: ``"maximize"`` (tokens/s) or ``"minimize"``.
        pruner: the pruner (None: Optuna's default, a median pruner).
        n_startup_trials: random trials before TPE takes over (enqueued trials count).
    """
    import optuna

    if isinstance(storage, str):
        storage = make_storage(storage)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        # constant_liar: parallel workers treat each other's running trials as bad, not as unknown.
        sampler = optuna.samplers.TPESampler(
            seed=worker_seed(seed, worker, name), n_startup_trials=n_startup_trials, constant_liar=True
        )
        study = optuna.create_study(
            study_name=name,
            storage=storage,
            sampler=sampler,
            pruner=pruner,
            direction=direction,
            load_if_exists=True,
        )
        before = {t.number for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,))}
        optuna.storages.fail_stale_trials(study)
    failed = [
        t.number for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.FAIL,)) if t.number in before
    ]
    if failed:
        log.warning("study %s: trials %s of a dead worker marked FAIL", name, failed)
    return study


def check_settings(study: optuna.Study, settings: dict[str, Any]) -> None:
    """Record what the study's values depend on, or refuse to go on with other settings.

    The first run stores ``settings`` as the study's ``fingerprint`` user attribute; a resumed run
    must bring the same values, since figures measured under other settings do not compare.

    Raises:
        ValueError: a setting differs (the message lists each one, before and now).
    """
    old = study.user_attrs.get("fingerprint")
    if old is None:
        study.set_user_attr("fingerprint", settings)
        return
    diff = {k: (old.get(k), v) for k, v in settings.items() if old.get(k) != v}
    if diff:
        detail = ", ".join(f"{k}: study has {a!r}, now {b!r}" for k, (a, b) in diff.items())
        raise ValueError(
            f"study {study.study_name!r} was run with other settings ({detail}); its values would not compare. "
            "Use another study name or the study's settings."
        )


def report_dir(report: str | None, storage: str, study: str) -> Path:
    """A study's report folder: ``report`` if given, else ``reports/<study>`` next to a SQLite file
    (``data/tuning/reports/<study>`` for other storages).
    """
    import re

    if report:
        return Path(report)
    db = sqlite_path(storage)
    base = db.parent if db is not None else Path("data") / "tuning"
    return base / "reports" / re.sub(r"[^A-Za-z0-9_.-]+", "_", study)


def add_heartbeat_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``--heartbeat-interval`` and ``--grace-period`` options shared by the ``tune`` commands."""
    parser.add_argument(
        "--heartbeat-interval",
        type=int,
        default=DEFAULT_HEARTBEAT_S,
        help="seconds between heartbeats of a running trial (default: %(default)s)",
    )
    parser.add_argument(
        "--grace-period",
        type=int,
        default=DEFAULT_GRACE_S,
        help="seconds without heartbeat after which a trial of a dead worker is failed (default: %(default)s)",
    )
