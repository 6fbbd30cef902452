from __future__ import annotations

import json
import subprocess
import sys

from adaptive_spec.cli import main


def test_bench_verifiers_writes_the_table_as_json(tmp_path, capsys):
    out = tmp_path / "v.json"
    rc = main(
        ["bench", "verifiers", "--families", "toy", "--shapes", "chain:2,iid:2x2", "--json", str(out), "--no-progress"]
    )
    assert rc == 0
    rows = json.loads(out.read_text())["rows"]
    assert {"family", "shape", "verifier", "block_efficiency", "lp_limit", "ratio"} <= set(rows[0])
    by = {(r["shape"], r["verifier"]): r for r in rows}
    assert abs(by[("chain:2", "block")]["block_efficiency"] - 20 / 9) < 1e-9
    assert abs(by[("chain:2", "block")]["ratio"] - 1.0) < 1e-6
    assert abs(by[("iid:2x2", "gbv")]["ratio"] - 1.0) < 1e-6  # GBV reaches the LP limit on the toy
    assert all(r["block_efficiency"] <= r["lp_limit"] + 1e-6 for r in rows if r["lossless"])
    assert "block_efficiency" in capsys.readouterr().out


def test_bench_verifiers_speed_rows(tmp_path):
    out = tmp_path / "s.json"
    rc = main(
        ["bench", "verifiers", "--speed", "--vocabs", "500", "--nodes", "8", "--repeats", "2", "--json", str(out),
         "--no-progress", "--device", "cpu"]
    )  # fmt: skip
    assert rc == 0
    rows = json.loads(out.read_text())["rows"]
    assert {r["verifier"] for r in rows} >= {"token", "block", "gbv", "spectr", "traversal"}
    assert all(r["vocab"] == 500 and r["us_per_verify"] > 0 for r in rows)


def test_console_script_help():
    res = subprocess.run([sys.executable, "-m", "adaptive_spec", "--help"], capture_output=True, text=True, check=True)
    assert "bench" in res.stdout
