"""Feature logs: schema round trip, manifest checks, atomic shards, and logging from ordinary generate calls."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from adaptive_spec.engine import SpecEngine, StepState
from adaptive_spec.formats.feature_log import FeatureLogger, arrow_schema, prompt_key, read_manifest, read_shards
from adaptive_spec.formats.features import SCHEMA
from tests.helpers.tiny import perturbed, tiny_model, tiny_tokenizer

V = 48
INFO = {"models": {"target": {"config": {"hidden_size": 8}}, "vocab_size": 7}, "run": {"device": "cpu"}}


@pytest.fixture(scope="module")
def models():
    target = tiny_model("llama", vocab=V, eos=None, seed=11)
    return target, perturbed(target, scale=0.1, seed=12)


class Recorder:
    needs_features = True

    def __init__(self, plan: str) -> None:
        self.plan = plan
        self.states: list[StepState] = []

    def choose(self, state: StepState) -> str:
        self.states.append(state)
        return self.plan


def record(i: int, hidden: bool = False) -> dict:
    rng = np.random.default_rng(i)
    return dict(
        prompt_key=prompt_key([0, i]),
        step=i,
        features={n: float(rng.normal()) for n in SCHEMA.names},
        draft_hidden=rng.normal(size=4).astype(np.float16) if hidden else None,
        target_hidden=rng.normal(size=6).astype(np.float16) if hidden else None,
        action="chain:2/token",
        num_nodes=3,
        accepted=i % 3,
        emitted=i % 3 + 1,
        times={"draft": 0.001 * i, "target": 0.002, "verify": 0.0005, "other": 0.0001},
        context_ids=list(range(i + 2)),
        top_k=5 * i,
        propensity=None if i % 2 else 0.25,
    )


def test_schema_round_trip(tmp_path) -> None:
    written = [record(i, hidden=True) for i in range(7)]
    with FeatureLogger(tmp_path, shard_size=3, hidden=True, run_id="rt") as log:
        log.attach(INFO)
        log.prompt_index = 4
        for r in written:
            log.log_step(**r)
        assert log.records_written == 6 and log.buffered == 1  # two full shards so far
    assert log.records_written == 7 and [p.name for p in log.shards] == [
        "shard-rt-00000.parquet",
        "shard-rt-00001.parquet",
        "shard-rt-00002.parquet",
    ]
    table = read_shards(tmp_path)
    assert table.schema.remove_metadata() == arrow_schema()
    types = {f.name: f.type for f in table.schema}
    for name in SCHEMA.names:
        assert types[name] == pa.float32()
        np.testing.assert_array_equal(
            table.column(name).to_numpy(), np.array([r["features"][name] for r in written], np.float32)
        )
    assert types["draft_hidden"] == types["target_hidden"] == pa.list_(pa.float16())
    assert types["context_ids"] == pa.list_(pa.int32())
    for name in ("prompt_index", "step", "num_nodes", "accepted", "emitted", "top_k"):
        assert types[name] == pa.int32(), name
    for name in ("step_time_s", "draft_s", "target_s", "verify_s", "other_s"):
        assert types[name] == pa.float64(), name
    for name in ("temperature", "top_p", "propensity"):
        assert types[name] == pa.float32(), name
    rows = table.to_pylist()
    for r, row in zip(written, rows, strict=True):
        assert row["run_id"] == "rt" and row["prompt_index"] == 4 and row["step"] == r["step"]
        assert row["prompt_key"] == r["prompt_key"] and len(row["prompt_key"]) == 16
        np.testing.assert_array_equal(np.array(row["draft_hidden"], np.float16), r["draft_hidden"])
        np.testing.assert_array_equal(np.array(row["target_hidden"], np.float16), r["target_hidden"])
        assert row["context_ids"] == r["context_ids"] and row["top_k"] == r["top_k"]
        assert row["step_time_s"] == pytest.approx(sum(r["times"].values()))
        assert row["draft_s"] == r["times"]["draft"] and row["action"] == "chain:2/token"
        assert row["propensity"] == r["propensity"]
    manifest = json.loads(table.schema.metadata[b"adaptive_spec.manifest"])
    assert manifest["schema"] == SCHEMA.to_dict() and manifest["runs"][0]["run_id"] == "rt"


def test_manifest_refuses_other_models_hidden_setting_or_schema(tmp_path) -> None:
    with FeatureLogger(tmp_path, run_id="a") as log:
        log.attach(INFO)
        log.log_step(**record(0))
    other = {**INFO, "models": {**INFO["models"], "vocab_size": 8}}
    with pytest.raises(ValueError, match=r"other models.*vocab_size: 7 here vs 8 now"):
        FeatureLogger(tmp_path).attach(other)
    with pytest.raises(ValueError, match="without hidden states"):
        FeatureLogger(tmp_path, hidden=True).attach(INFO)
    with pytest.raises(ValueError, match="already in"):
        FeatureLogger(tmp_path, run_id="a").attach(INFO)
    # A compatible second run appends, and registers itself in the manifest.
    with FeatureLogger(tmp_path, run_id="b") as log:
        log.attach({**INFO, "run": {"device": "cuda:0"}})
        log.log_step(**record(1))
    assert read_shards(tmp_path).column("run_id").to_pylist() == ["a", "b"]
    assert [r["run_id"] for r in read_manifest(tmp_path)["runs"]] == ["a", "b"]
    # Another schema version: refused by both the reader and a new writer.
    path = tmp_path / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest["schema"]["hash"] = "0123456789abcdef"
    path.write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match="relabel and retrain"):
        read_shards(tmp_path)
    with pytest.raises(ValueError, match="feature schema"):
        FeatureLogger(tmp_path).attach(INFO)


def test_reader_ignores_temporaries_and_explains_empty_logs(tmp_path) -> None:
    with pytest.raises(FileNotFoundError, match="not a feature log"):
        read_shards(tmp_path)
    log = FeatureLogger(tmp_path, run_id="x")
    log.attach(INFO)
    with pytest.raises(FileNotFoundError, match="no complete shards"):
        read_shards(tmp_path)
    log.log_step(**record(0))
    log.close()
    # What a writer killed mid-shard leaves behind: a hidden, partial temporary file.
    good = (tmp_path / "shard-x-00000.parquet").read_bytes()
    (tmp_path / ".shard-x-00001.parquet.tmp-123").write_bytes(good[: len(good) // 2])
    assert len(read_shards(tmp_path)) == 1
    with pytest.raises(ValueError, match="closed"):
        log.log_step(**record(1))
    with pytest.raises(ValueError, match="run_id"):
        FeatureLogger(tmp_path, run_id="../evil")
    with pytest.raises(ValueError, match="shard_size"):
        FeatureLogger(tmp_path, shard_size=0)


def test_a_new_logger_with_the_same_run_id_never_overwrites(tmp_path) -> None:
    log = FeatureLogger(tmp_path, run_id="r")
    log.attach(INFO)
    log.log_step(**record(0))
    log.close()
    manifest = read_manifest(tmp_path)
    manifest["runs"] = []  # e.g. a manifest restored from a backup
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    log = FeatureLogger(tmp_path, run_id="r")
    log.attach(INFO)
    log.log_step(**record(1))
    log.close()
    assert sorted(p.name for p in tmp_path.glob("shard-*")) == ["shard-r-00000.parquet", "shard-r-00001.parquet"]
    assert read_shards(tmp_path).column("step").to_pylist() == [0, 1]


@pytest.mark.parametrize("hidden", [False, True])
def test_engine_logs_what_the_planner_saw(models, tmp_path, hidden: bool) -> None:
    log = FeatureLogger(tmp_path, hidden=hidden, shard_size=4)
    rec = Recorder("delayed:1x2x2/traversal")
    engine = SpecEngine(*models, tokenizer=tiny_tokenizer(V), planner=rec, feature_log=log)
    prompts = [[0, 5, 6], [0, 9]]
    outs = []
    for i, prompt in enumerate(prompts):
        log.prompt_index = i
        outs.append(engine.generate(prompt, max_new_tokens=12, temperature=1.0, top_p=0.9, seed=i))
    assert engine.generate([0, 5], max_new_tokens=3, plan=None).steps == []  # autoregressive: nothing logged
    engine.close()
    table = read_shards(tmp_path)
    steps = [s for out in outs for s in out.steps]
    assert len(table) == len(rec.states) == len(steps)
    for name in SCHEMA.names:  # exactly the features the planner got, as float32
        np.testing.assert_array_equal(
            table.column(name).to_numpy(), np.array([s.features[name] for s in rec.states], np.float32)
        )
    rows = table.to_pylist()
    k = 0
    for i, (prompt, out) in enumerate(zip(prompts, outs, strict=True)):
        context = prompt + out.token_ids
        assert sum(r["emitted"] for r in rows[k : k + len(out.steps)]) == len(out.token_ids)
        for j, step in enumerate(out.steps):
            row = rows[k + j]
            assert row["prompt_index"] == i and row["prompt_key"] == prompt_key(prompt) and row["step"] == j
            assert row["context_ids"] == context[: rec.states[k + j].context_length]
            assert row["action"] == str(step.plan) and row["accepted"] == step.num_accepted
            assert row["num_nodes"] == step.num_nodes and row["draft_s"] == step.times["draft"] > 0
            assert row["temperature"] == 1.0 and row["top_p"] == pytest.approx(0.9) and row["top_k"] == 0
            assert row["propensity"] is None
            if hidden:
                state = rec.states[k + j]
                np.testing.assert_array_equal(
                    np.array(row["draft_hidden"], np.float16), state.draft_hidden.to(torch.float16).numpy()
                )
                np.testing.assert_array_equal(
                    np.array(row["target_hidden"], np.float16), state.target_hidden.to(torch.float16).numpy()
                )
            else:
                assert row["draft_hidden"] is None and row["target_hidden"] is None
        k += len(out.steps)
    manifest = read_manifest(tmp_path)
    assert manifest["hidden"] is hidden and manifest["models"]["vocab_size"] == V
    assert manifest["models"]["target"]["hidden_size"] == 32 and manifest["runs"][0]["versions"]["torch"]
    # Flushed at the end of each generate call: no shard spans two generations.
    for path in sorted(tmp_path.glob("shard-*.parquet")):
        assert len(set(pq.read_table(path, columns=["prompt_key"]).column(0).to_pylist())) == 1


def test_engine_refuses_a_log_of_other_models(models, tmp_path) -> None:
    SpecEngine(*models, feature_log=tmp_path).close()
    other = tiny_model("llama", vocab=V, eos=None, seed=11, hidden=16)
    with pytest.raises(ValueError, match="other models"):
        SpecEngine(other, perturbed(other), feature_log=tmp_path)
