"""Worker processes for the storage tests.

``python -m tests.tuning._worker tune <tune plans options>`` runs the ``tune plans`` command
module (its own parser and ``run``), without the full CLI table, whose other commands import
the engine and would add seconds of start-up to every process. With ``WORKER_READY`` and
``WORKER_GO`` set (file paths) it imports everything, writes the first and waits for the second,
so that two workers start their trials together.

``python -m tests.tuning._worker hang STORAGE_URL STUDY MARKER`` opens the study the way
``tune plans`` does (``make_storage`` + ``open_study``: heartbeats on), samples a plan through
the real objective, writes ``MARKER`` once the trial is RUNNING and has a heartbeat in the
storage, and then blocks, heartbeating, until the test kills it (SIGKILL).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path


def hang(url: str, study_name: str, marker: str) -> None:
    from adaptive_spec.tuning.objectives import PlanObjective
    from adaptive_spec.tuning.storage import make_storage, open_study

    storage = make_storage(url, heartbeat_interval=1, grace_period=2)
    study = open_study(study_name, storage, seed=0, worker=7)

    def evaluate(plan):
        # Write the marker only once the trial's first heartbeat is in the storage: the heartbeat
        # thread starts with the trial, but on a loaded machine its first write can come after
        # this call, and a trial killed before any heartbeat is never seen as stale.
        import sqlalchemy

        engine = sqlalchemy.create_engine(url)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with engine.connect() as conn:
                if conn.execute(sqlalchemy.text("SELECT COUNT(*) FROM trial_heartbeats")).scalar():
                    break
            time.sleep(0.1)
        engine.dispose()
        Path(marker).write_text(str(plan))
        while True:
            time.sleep(1)

    study.optimize(PlanObjective(evaluate, temperature=1.0, worker=7), n_trials=1)


def tune(argv: list[str], ready: str | None = None, go: str | None = None) -> int:
    """Run ``tune plans``; with ``ready``/``go`` files, import everything, write ``ready``, wait for ``go``."""
    from adaptive_spec.cli import tune_plans

    parser = argparse.ArgumentParser(prog="tune plans")
    tune_plans.add_arguments(parser)
    args = parser.parse_args(argv)
    if ready and go:  # start together with the other worker: imports done, then a common start signal
        import adaptive_spec.formats.label_table
        import adaptive_spec.tuning.objectives
        import adaptive_spec.tuning.plans
        import adaptive_spec.tuning.storage  # noqa: F401

        Path(ready).write_text("ready")
        deadline = time.monotonic() + 120
        while not Path(go).exists():
            if time.monotonic() > deadline:
                raise SystemExit("no start signal")
            time.sleep(0.01)
    return tune_plans.run(args)


if __name__ == "__main__":
    if sys.argv[1] == "hang":
        hang(*sys.argv[2:5])
    else:
        sys.exit(tune(sys.argv[2:], os.environ.get("WORKER_READY"), os.environ.get("WORKER_GO")))
