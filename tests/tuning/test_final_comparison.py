"""``tune plans``'s final comparison runs once per study: the last worker to finish claims it, atomically."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import optuna

from adaptive_spec.tuning.plans import claim_final_comparison
from adaptive_spec.tuning.storage import make_storage, open_study

REPO = Path(__file__).resolve().parents[2]
CLAIM = """
import sys, time
from pathlib import Path
from adaptive_spec.tuning.plans import claim_final_comparison
from adaptive_spec.tuning.storage import make_storage, open_study
study = open_study("s-T1", make_storage(sys.argv[1]), worker=int(sys.argv[2]))
go = Path(sys.argv[3])
while not go.exists():
    time.sleep(0.01)
print(claim_final_comparison(study))
"""


def test_only_the_last_worker_claims_and_only_once(tmp_path) -> None:
    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    a = open_study("s-T1", make_storage(url), worker=0)
    b = open_study("s-T1", make_storage(url), worker=1)
    running = b.ask()  # worker 1 is still at a trial
    a.tell(a.ask(), 1.0)
    assert not claim_final_comparison(a)  # worker 0 finished first: not the last one
    b.tell(running, 2.0)
    assert claim_final_comparison(b)  # worker 1 finished last: it compares
    assert not claim_final_comparison(a) and not claim_final_comparison(b)  # once per round
    a.tell(a.ask(), 3.0)  # the study resumed with more trials: compared again, once
    assert claim_final_comparison(a) and not claim_final_comparison(b)
    names = {s.study_name for s in optuna.get_all_study_summaries(url)}
    assert names == {"s-T1", "s-T1/final-comparison/2", "s-T1/final-comparison/3"}


def test_two_processes_racing_for_the_claim_get_one(tmp_path) -> None:
    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    study = open_study("s-T1", make_storage(url), worker=0)
    study.tell(study.ask(), 1.0)
    go = tmp_path / "go"
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", CLAIM, url, str(w), str(go)], env=env, stdout=subprocess.PIPE, text=True
        )
        for w in (0, 1)
    ]
    go.write_text("go")
    answers = [p.communicate(timeout=120)[0].strip() for p in procs]
    assert sorted(answers) == ["False", "True"], answers
