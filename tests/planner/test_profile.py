"""``adaptive-spec profile`` and ``bench latency-model`` on a tiny pair: files, formats, rough accuracy."""

from __future__ import annotations

import json

import pytest

from adaptive_spec.cli import main
from adaptive_spec.formats.features import SCHEMA
from adaptive_spec.planner import LatencyModel

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def tiny_profile(module_tiny_pair, tmp_path_factory):
    out = tmp_path_factory.mktemp("prof")
    rc = main(
        [
            "profile",
            "--out",
            str(out),
            "--contexts",
            "4,32",
            "--tokens",
            "1,4,16",
            "--warmup",
            "1",
            "--repeats",
            "3",
            "--verify-trees",
            "1",
            "--calibration-plans",
            "chain:1/token,chain:4/block,iid:3x3/specinfer,wor:2x2x1/rrsw",
            "--calibration-tokens",
            "12",
            "--no-progress",
            "--device",
            "cpu",
        ]
    )
    assert rc == 0
    return out / "profile.json"  # --out is a folder


@pytest.mark.slow
def test_profile_writes_a_loadable_profile_and_a_plot(tiny_profile):
    data = json.loads(tiny_profile.read_text())
    assert data["contexts"] == [4, 32] and data["tokens"] == [1, 4, 16]
    assert data["device"]["type"] == "cpu" and data["device"]["torch_threads"] >= 1
    assert data["models"]["target"]["parameters"] > data["models"]["draft"]["parameters"] * 0.5
    assert data["vocab_size"] == 48 and data["created"]
    for name in ("draft", "target"):
        grid = data[f"{name}_ms"]
        assert len(grid) == 2 and all(len(r) == 3 and all(v > 0 for v in r) for r in grid)
        for lo_r, m_r, hi_r in zip(data[f"{name}_q1_ms"], grid, data[f"{name}_q3_ms"], strict=True):
            assert all(lo <= m <= hi for lo, m, hi in zip(lo_r, m_r, hi_r, strict=True))
    # Every lossless verifier on every law it accepts, with increasing tree sizes.
    assert {"traversal", "token", "block", "gbv", "spectr", "specinfer", "rrsw", "nss", "naive", "greedy"} <= set(
        data["verify_ms"]
    )
    assert set(data["verify_ms"]["traversal"]) == {"chain", "iid", "delayed", "without_replacement"}
    assert set(data["verify_ms"]["block"]) == {"chain"}
    ovh = data["overhead"]
    assert ovh["steps"] > 10 and ovh["const_ms"] >= 0 and ovh["per_level_ms"] >= 0 and ovh["per_node_ms"] >= 0
    assert tiny_profile.with_suffix(".png").read_bytes()[:8] == PNG
    model = LatencyModel.load(tiny_profile)
    feats = model.features(20)
    assert set(feats) <= set(SCHEMA.names) and feats["target_ms"] > 0 and feats["draft_ms"] > 0


@pytest.mark.slow
def test_latency_model_predicts_measured_steps_to_the_right_order(tiny_profile, tmp_path):
    out = tmp_path / "lm.json"
    rc = main(
        [
            "bench",
            "latency-model",
            "--profile",
            str(tiny_profile),
            "--plans",
            "chain:2/token,iid:2x3/traversal,delayed:1x2x2/gbv,wor:3x2/traversal",
            "--limit",
            "2",
            "--max-new-tokens",
            "12",
            "--json",
            str(out),
            "--no-progress",
            "--device",
            "cpu",
        ]
    )
    assert rc == 0
    report = json.loads(out.read_text())
    assert set(report["per_plan"]) == {"chain:2/token", "iid:2x3/traversal", "delayed:1x2x2/gbv", "wor:3x2/traversal"}
    for s in report["per_plan"].values():
        assert s["steps"] >= 2
        # Loose: timing on a shared CI machine is noisy; the model must get the order of magnitude.
        assert 0.2 < s["predicted_ms"] / s["measured_ms"] < 5
    assert report["overall"]["mape"] >= 0 and report["overall"]["steps"] == len(report["steps"])
    step = report["steps"][0]
    assert step["predicted"]["total_s"] == pytest.approx(step["predicted_s"])
    assert out.with_suffix(".png").read_bytes()[:8] == PNG


def test_profile_refuses_a_grid_beyond_the_context_window(module_tiny_pair, tmp_path):
    with pytest.raises(SystemExit, match="context window is 256"):
        main(
            [
                "profile",
                "--out",
                str(tmp_path / "p"),
                "--contexts",
                "250",
                "--tokens",
                "1,16",
                "--no-progress",
                "--device",
                "cpu",
            ]
        )
    assert not (tmp_path / "p" / "profile.json").exists()


def test_bench_latency_model_without_a_profile_says_how_to_make_one(module_tiny_pair, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit, match="adaptive-spec profile"):
        main(["bench", "latency-model", "--no-progress"])


def test_forwards_are_measured_with_an_eagle_head_as_the_draft():
    """An EAGLE head reads the target's features: the profile feeds them and times a level of n children."""
    from adaptive_spec.bench.profile.measure import measure_forwards
    from tests.engine.test_eagle import make_head
    from tests.helpers.tiny import tiny_model

    target = tiny_model("llama", vocab=48, hidden=32, seed=3, eos=None)
    head = make_head(target, 40, range(8, 48))
    out = measure_forwards(target, head, contexts=[0, 8], tokens=[1, 3], warmup=0, repeats=1, progress=False)
    for name in ("draft_ms", "target_ms"):
        assert len(out[name]) == 2 and all(len(row) == 2 and all(ms > 0 for ms in row) for row in out[name])


def test_profile_times_the_row_major_target_beside_the_engines(module_tiny_pair, tmp_path, capsys):
    """``--row-major-too``: stock-order and column-major copies of the target timed interleaved, and the
    order the host's calibration chose (the engine's own stays column-major: the tests' override)."""
    rc = main(
        ["profile", "--out", str(tmp_path), "--contexts", "4", "--tokens", "1,3", "--warmup", "0", "--repeats", "1"]
        + ["--calibration-plans", "", "--verify-trees", "1", "--row-major-too", "--no-plot", "--no-progress"]
    )
    assert rc == 0
    profile = json.loads((tmp_path / "profile.json").read_text())
    for name in ("target_row_major_ms", "target_column_major_ms"):
        assert len(profile[name]) == 1 and len(profile[name][0]) == 2 and all(ms > 0 for ms in profile[name][0])
    assert len(profile["target_ms"][0]) == 2
    order = profile["weight_order"]
    assert order["setting"] == "column" and order["target"]["column"] > 0 == order["target"]["row"]
    assert order["shapes"] and all(s["order"] in ("column", "per-size", "row") for s in order["shapes"])
    assert all(len(s["row_ms"]) == len(s["column_ms"]) == len(s["sizes"]) for s in order["shapes"])
    out = capsys.readouterr().out
    assert "target_column_major" in out and "weight order (ADAPTIVE_SPEC_WEIGHT_ORDER=column)" in out
