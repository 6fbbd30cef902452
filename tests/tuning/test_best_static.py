"""configs/plans/best-static.yaml: write, merge, load, fallbacks, refusal to clobber a bad file."""

from __future__ import annotations

import multiprocessing as mp

import pytest
import yaml

from adaptive_spec.planner.plan import Plan
from adaptive_spec.planner.presets import (
    best_static_path,
    load_best_static,
    read_best_static,
    write_best_static,
)
from adaptive_spec.temperatures import temperature_key


def test_write_merges_per_temperature_and_load_returns_plans(tmp_path):
    path = tmp_path / "configs" / "plans" / "best-static.yaml"
    write_best_static(0.0, {"plan": "chain:5/greedy", "tokens_per_s": 120.0, "study": "p-T0"}, path)
    write_best_static(1.0, {"plan": "delayed:2x2x3/gbv", "tokens_per_s": 99.5}, path)
    write_best_static(1.0, {"plan": "chain:4/block", "tokens_per_s": 101.0}, path)  # replaces T=1 only
    entries = read_best_static(path)
    assert list(entries) == ["0", "1"]
    assert entries["0"]["plan"] == "chain:5/greedy" and entries["0"]["study"] == "p-T0"
    assert entries["1"]["plan"] == "chain:4/block" and entries["1"]["tokens_per_s"] == 101.0
    assert "updated" in entries["1"]
    assert load_best_static(0, path) == Plan.parse("chain:5/greedy")
    assert load_best_static(1.0, path) == Plan.parse("chain:4/block")
    text = path.read_text()
    assert text.startswith("# Best static plan per temperature")
    assert yaml.safe_load(text)["version"] == 1
    assert [p.name for p in path.parent.iterdir()] == ["best-static.yaml"]  # no temporary files left


def test_nearest_temperature_of_the_same_kind_is_a_warned_fallback(tmp_path):
    path = tmp_path / "best-static.yaml"
    write_best_static(0, {"plan": "chain:5/greedy"}, path)
    write_best_static(1, {"plan": "iid:2x3/specinfer"}, path)
    with pytest.warns(UserWarning, match="using the one tuned at 1"):
        assert load_best_static(0.7, path) == Plan.parse("iid:2x3/specinfer")
    only_greedy = tmp_path / "greedy.yaml"
    write_best_static(0, {"plan": "chain:5/greedy"}, only_greedy)
    with pytest.raises(LookupError, match=r"no plan for temperature 0\.7.*tune plans --temperatures 0\.7"):
        load_best_static(0.7, only_greedy)


def test_missing_file_says_where_it_looked_and_how_to_create_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError, match="adaptive-spec tune plans --temperatures 1"):
        load_best_static(1.0, tmp_path / "nope.yaml")
    assert best_static_path() == tmp_path / "configs" / "plans" / "best-static.yaml"
    assert best_static_path(tmp_path / "cfg") == tmp_path / "cfg" / "plans" / "best-static.yaml"
    write_best_static(1.0, {"plan": "chain:3/block"})  # default path: ./configs/plans/best-static.yaml
    assert load_best_static(1.0) == Plan.parse("chain:3/block")


def test_a_malformed_file_is_reported_and_never_overwritten(tmp_path):
    path = tmp_path / "best-static.yaml"
    path.write_text("plans: [not, a, mapping]\n")
    with pytest.raises(ValueError, match="not a best-static file"):
        write_best_static(1.0, {"plan": "chain:3/block"}, path)
    assert path.read_text() == "plans: [not, a, mapping]\n"
    path.write_text("version: 1\nplans:\n  '1': {plan: 'chain:3/nonsense'}\n")
    with pytest.raises(ValueError, match="unknown verifier 'nonsense'"):
        load_best_static(1.0, path)
    with pytest.raises(ValueError, match="unknown verifier"):
        write_best_static(1.0, {"plan": "chain:3/nonsense"}, tmp_path / "other.yaml")
    assert not (tmp_path / "other.yaml").exists()
    with pytest.raises(ValueError, match="temperature must be"):
        temperature_key(-1)


def _write(args):
    path, t = args
    write_best_static(t, {"plan": f"chain:{1 + int(t * 4) % 8}/block"}, path)


def test_concurrent_writers_do_not_lose_entries(tmp_path):
    path = tmp_path / "best-static.yaml"
    temps = [i / 4 for i in range(1, 9)]
    with mp.get_context("fork").Pool(4) as pool:
        pool.map(_write, [(path, t) for t in temps])
    assert set(read_best_static(path)) == {temperature_key(t) for t in temps}


def test_reading_best_static_imports_neither_optuna_nor_the_tuner():
    import subprocess
    import sys

    code = (
        "import sys, adaptive_spec.tuning, adaptive_spec.planner.presets; "
        "bad = [m for m in ('optuna', 'optuna_integration', 'adaptive_spec.tuning.plans') if m in sys.modules]; "
        "assert not bad, bad"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr[-2000:]


def test_a_best_static_plan_tuned_on_a_gpu_goes_to_its_section_and_is_read_first_there(tmp_path):
    """``tune plans --device cuda``: the GPU's entry in the file's ``devices: cuda`` section, the other sections kept
    by every write (a stamp is not: it named the pair of the plans it saw); read first on that kind of device only."""
    import yaml

    from adaptive_spec.engine.fingerprint import stamp_plan_file

    path = tmp_path / "best-static.yaml"
    write_best_static(0.0, {"plan": "chain:2/greedy"}, path)
    stamp_plan_file(path, {"target": "v1:t", "draft": "v1:d"})
    write_best_static(0.0, {"plan": "chain:6/greedy"}, path, device="cuda")
    write_best_static(1.0, {"plan": "chain:3/block"}, path)  # a CPU's write keeps the GPU's section
    data = yaml.safe_load(path.read_text())
    assert "models" not in data and next(iter(data)) == "version"
    assert data["devices"]["cuda"]["plans"]["0"]["plan"] == "chain:6/greedy"
    assert {k: v["plan"] for k, v in data["plans"].items()} == {"0": "chain:2/greedy", "1": "chain:3/block"}
    assert load_best_static(0.0, path) == Plan.parse("chain:2/greedy")
    assert load_best_static(0.0, path, "cuda") == Plan.parse("chain:6/greedy")
    assert load_best_static(1.0, path, "cuda") == Plan.parse("chain:3/block")  # none tuned on the GPU at T > 0
