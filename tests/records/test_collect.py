"""`adaptive-spec collect`: a run killed with SIGKILL leaves only complete shards; runs append; explore mode."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from adaptive_spec.cli import main
from adaptive_spec.engine.features import LATENCY_NAMES
from adaptive_spec.formats.feature_log import read_manifest, read_shards
from adaptive_spec.formats.features import SCHEMA
from tests.helpers.profiles import synthetic_profile
from tests.helpers.tiny import perturbed, tiny_model, tiny_tokenizer

V = 48


@pytest.fixture(scope="module")
def pair(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("pair")
    tok = tiny_tokenizer(V)
    target = tiny_model("llama", vocab=V, eos=None, seed=3)
    for name, model in (("target", target), ("draft", perturbed(target, scale=0.2, seed=4))):
        model.save_pretrained(root / name)
        tok.save_pretrained(root / name)
    (root / "prompts.txt").write_text("w5 w6 w7\nw9 w3\n\nw11 w12 w13 w14\n")
    return root


def collect_args(pair: Path, out: Path, *extra: str) -> list[str]:
    return [
        "collect",
        "--target",
        str(pair / "target"),
        "--draft",
        str(pair / "draft"),
        "--prompts",
        str(pair / "prompts.txt"),
        "--out",
        str(out),
        "--device",
        "cpu",
        "--no-progress",
        *extra,
    ]


def command() -> list[str]:
    script = Path(sys.executable).parent / "adaptive-spec"
    if script.exists():
        return [str(script)]
    found = shutil.which("adaptive-spec")
    return [found] if found else [sys.executable, "-m", "adaptive_spec.cli"]


@pytest.mark.slow
def test_sigkill_leaves_only_complete_shards_and_a_second_run_appends(pair, tmp_path, capsys) -> None:
    out = tmp_path / "log"
    # Long enough that it is still writing when killed: 3 prompts x 2 temperatures x 200 repeats.
    args = collect_args(
        pair,
        out,
        "--shard-size",
        "2",
        "--max-new-tokens",
        "24",
        "--repeats",
        "200",
        "--temperatures",
        "0,1",
        "--plan",
        "chain:2/token",
        "--run-id",
        "killed",
    )
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(command() + args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    try:
        deadline = time.monotonic() + 120
        while len(list(out.glob("shard-*.parquet"))) < 2:
            assert proc.poll() is None, proc.communicate()[1].decode()[-2000:]
            assert time.monotonic() < deadline, "no shards within 120 s"
            time.sleep(0.05)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.communicate()
    assert proc.returncode == -signal.SIGKILL
    shards = sorted(out.glob("shard-*.parquet"))
    for path in shards:  # every visible shard is complete
        assert pq.read_table(path).num_rows == 2
    leftovers = {p.name for p in out.iterdir()} - {p.name for p in shards} - {"manifest.json"}
    assert all(name.startswith(".shard-killed-") and ".tmp-" in name for name in leftovers), leftovers
    table = read_shards(out)
    assert len(table) == 2 * len(shards) and set(table.column("run_id").to_pylist()) == {"killed"}
    assert set(table.column("prompt_index").to_pylist()) <= {0, 1, 2}

    # A second run into the same directory appends (in-process this time, to completion).
    rc = main(
        collect_args(
            pair,
            out,
            "--shard-size",
            "4",
            "--max-new-tokens",
            "10",
            "--temperatures",
            "0.7",
            "--top-k",
            "8",
            "--run-id",
            "second",
        )
    )
    assert rc == 0
    printed = capsys.readouterr().out
    assert "run second: 3 generations" in printed and "delayed" in printed
    after = read_shards(out)
    second = after.filter(after.column("run_id").to_numpy(zero_copy_only=False) == "second")
    assert len(after) == len(table) + len(second) and len(second) > 0
    assert set(second.column("prompt_index").to_pylist()) == {0, 1, 2}
    assert set(second.column("top_k").to_pylist()) == {8}
    assert second.column("temperature").to_pylist() == [pytest.approx(0.7)] * len(second)
    # The default plan (cut shorter near the end of the budget; the executed plan is logged).
    assert second.column("action").to_pylist()[0] == "delayed:2x2x2/traversal"
    assert [r["run_id"] for r in read_manifest(out)["runs"]] == ["killed", "second"]
    assert f"{len(second)} records in" in printed


def test_explore_with_profile_logs_propensities_latency_and_refuses_other_models(pair, tmp_path, capsys) -> None:
    from adaptive_spec.planner import ActionSpace, LatencyModel

    space = tmp_path / "actions.yaml"
    space.write_text(
        "name: tiny\nfamilies:\n  - law: chain\n    length: [1, 3]\n    verifiers: [token, block]\n"
        "  - law: iid\n    paths: 2\n    length: 2\n    verifiers: [traversal]\n"
    )
    n_actions = len(ActionSpace.from_yaml(space))
    profile = tmp_path / "profile.json"
    profile.write_text(json.dumps(synthetic_profile()))
    out = tmp_path / "log"
    rc = main(
        collect_args(
            pair,
            out,
            "--explore",
            "uniform",
            "--actions",
            str(space),
            "--temperatures",
            "1",
            "--max-new-tokens",
            "16",
            "--limit",
            "2",
            "--hidden",
            "--seed",
            "3",
            "--profile",
            str(profile),
            "--node-log",
            str(tmp_path / "nodes"),
        )
    )
    assert rc == 0
    printed = capsys.readouterr().out
    # The in-draft node log of the same run: one group per generation, soft labels in [0, 1].
    from adaptive_spec.formats.nodes import read_node_log

    nodes = read_node_log(tmp_path / "nodes")
    assert nodes.num_rows > 0 and set(nodes.column("generation").to_pylist()) == {0, 1}
    assert all(0.0 <= a <= 1.0 for a in nodes.column("label_accept").to_pylist())
    assert "drafted nodes" in printed
    table = read_shards(out)
    actions = set(table.column("action").to_pylist())
    assert len(actions & {str(p) for p in ActionSpace.from_yaml(space)}) > 1
    assert table.column("propensity").to_pylist() == [pytest.approx(1 / n_actions)] * len(table)
    assert all(len(h) == 32 for h in table.column("draft_hidden").to_pylist())
    assert set(table.column("prompt_index").to_pylist()) == {0, 1}
    latency = LatencyModel.load(profile)
    for row in table.select(["context_length", *LATENCY_NAMES]).to_pylist():
        want = latency.features(int(row["context_length"]))
        assert want["target_ms"] > 0
        assert [row[n] for n in LATENCY_NAMES] == [pytest.approx(want[n], rel=1e-6) for n in LATENCY_NAMES]
    for family in ("chain", "iid"):
        assert family in printed
    manifest = read_manifest(out)
    assert manifest["runs"][0]["collect"]["explore"] == "uniform"
    assert manifest["schema"]["hash"] == SCHEMA.hash and manifest["hidden"] is True
    assert json.dumps(manifest)  # plain JSON

    # Same directory, other draft model: refused with a clear message, nothing written.
    other = tmp_path / "other_draft"
    perturbed(tiny_model("llama", vocab=V, eos=None, seed=3, layers=1), seed=9).save_pretrained(other)
    tiny_tokenizer(V).save_pretrained(other)
    args = collect_args(pair, out, "--hidden", "--max-new-tokens", "4")
    args[args.index("--draft") + 1] = str(other)
    with pytest.raises(SystemExit, match="other models"):
        main(args)
    assert len(read_shards(out)) == len(table)


def test_bad_arguments_are_explained(pair, tmp_path) -> None:
    with pytest.raises(SystemExit, match="--explore must be"):
        main(collect_args(pair, tmp_path / "a", "--explore", "greedy"))
    with pytest.raises(SystemExit, match="temperatures"):
        main(collect_args(pair, tmp_path / "b", "--temperatures", "hot"))
    with pytest.raises(SystemExit, match="does not exist"):
        main([*collect_args(pair, tmp_path / "c"), "--prompts", str(tmp_path / "missing.txt")])
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_label_skips_a_torn_shard_and_names_it(pair, tmp_path, capsys) -> None:
    out = tmp_path / "log"
    profile = tmp_path / "profile.json"
    profile.write_text(json.dumps(synthetic_profile()))
    assert main(collect_args(pair, out, "--shard-size", "2", "--max-new-tokens", "6", "--temperatures", "1")) == 0
    shards = sorted(out.glob("shard-*.parquet"))
    assert len(shards) >= 2
    whole = len(read_shards(out))
    torn = shards[0]
    torn_rows = pq.read_table(torn).num_rows
    torn.write_bytes(torn.read_bytes()[: torn.stat().st_size // 2])  # a copy cut short
    label = ["label", str(out), "--every", "1", "--samples", "1", "--no-progress", "--profile", str(profile)]
    with pytest.warns(UserWarning, match=rf"skipping shard {re.escape(str(torn))}: not a readable Parquet file"):
        assert main([*label, "--actions", str(_two_actions(tmp_path))]) == 0
    labelled = pq.read_table(out / "labels.parquet").num_rows
    assert 0 < labelled <= whole - torn_rows  # the other shards' roots were labelled
    with pytest.raises(SystemExit, match=rf"shard {re.escape(str(torn))} cannot be read .*move it out of"):
        main([*label, "--actions", str(_two_actions(tmp_path)), "--strict"])
    for path in shards[1:]:
        path.write_bytes(b"PAR1")
    with pytest.raises(SystemExit, match=r"no shard of the feature log .* can be read"), pytest.warns(UserWarning):
        main([*label, "--actions", str(_two_actions(tmp_path))])


def _two_actions(tmp_path: Path) -> Path:
    path = tmp_path / "actions.yaml"
    path.write_text("families:\n  - law: chain\n    length: 1-2\n    verifiers: [block]\n")
    return path
