"""What the benchmark, ``generate`` and the demo read from a selector: lookup, best static actions, latency flag."""

from __future__ import annotations

import json
import shutil
import warnings

import numpy as np
import pytest

import adaptive_spec.files as files
from adaptive_spec.formats.features import SCHEMA
from adaptive_spec.formats.label_table import write_labels
from adaptive_spec.planner import Plan
from adaptive_spec.planner.plan import StepState
from adaptive_spec.selector.runtime import (
    AdaptivePlanner,
    SelectorLoadError,
    SelectorRuntime,
    default_selector_paths,
    find_selector,
    latency_model_for,
)
from tests.helpers.profiles import synthetic_profile
from tests.helpers.synthetic_labels import synthetic_labels
from tests.helpers.tiny_selector import ACTIONS, BEST_STATIC, restamp, tiny_selector


@pytest.fixture(scope="module")
def selector(tmp_path_factory):
    return tiny_selector(tmp_path_factory.mktemp("sel") / "selector.onnx")


def test_best_static_per_temperature_from_the_metadata(selector):
    rt = SelectorRuntime(selector)
    assert rt.best_static_groups == BEST_STATIC
    assert rt.best_static(0.0) == Plan.parse("chain:3/block")
    assert rt.best_static(1.0, top_p=1.0) == Plan.parse("iid:2x2/traversal")
    with pytest.warns(UserWarning, match="group T=1,top_p=1"):  # nearest sampling group
        assert rt.best_static(0.7) == Plan.parse("iid:2x2/traversal")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        rt.best_static(1)  # exact: no warning


def test_best_static_never_crosses_greedy_and_sampling(tmp_path, selector):
    rt = SelectorRuntime(
        restamp(selector, tmp_path / "s.onnx", training={"best_static": {"T=0,top_p=1": "chain:3/block"}})
    )
    with pytest.raises(LookupError, match=r"no best static action for T=0\.7.*T=0,top_p=1"):
        rt.best_static(0.7)
    bare = SelectorRuntime(restamp(selector, tmp_path / "bare.onnx", training={}))
    assert bare.best_static_groups == {}
    with pytest.raises(LookupError, match="none recorded"):
        bare.best_static(0.0)


def test_a_best_static_entry_outside_the_actions_is_refused_at_load(tmp_path, selector):
    path = restamp(selector, tmp_path / "bad.onnx", training={"best_static": {"T=0,top_p=1": "chain:7/block"}})
    with pytest.raises(SelectorLoadError, match="chain:7/block"):
        SelectorRuntime(path)
    path = restamp(selector, tmp_path / "bad2.onnx", training={"best_static": {"temperature 0": "chain:3/block"}})
    with pytest.raises(SelectorLoadError, match="T=<t>,top_p=<p>"):
        SelectorRuntime(path)


def test_trained_with_latency_features(tmp_path, selector):
    assert SelectorRuntime(selector).trained_with_latency_features is None  # nothing recorded
    means = {"draft_ms": 1.5, "target_ms": 8.0, "target_ms_per_token": 0.3}
    assert SelectorRuntime(
        restamp(selector, tmp_path / "a.onnx", training={"latency_feature_mean": means})
    ).trained_with_latency_features
    zeros = dict.fromkeys(means, 0.0)
    assert (
        SelectorRuntime(
            restamp(selector, tmp_path / "b.onnx", training={"latency_feature_mean": zeros})
        ).trained_with_latency_features
        is False
    )
    # Older files: the label manifest says whether `collect` had a profile.
    logged = {"log": {"runs": [{"collect": {"profile": None}}, {"collect": {"profile": "p.json"}}]}}
    assert (
        SelectorRuntime(restamp(selector, tmp_path / "c.onnx", manifest=logged)).trained_with_latency_features is True
    )


def test_latency_model_for_warns_only_without_a_profile(tmp_path, monkeypatch, selector):
    monkeypatch.chdir(tmp_path)  # no data/profile/profile.json here
    means = {"draft_ms": 1.5, "target_ms": 8.0, "target_ms_per_token": 0.3}
    rt = SelectorRuntime(restamp(selector, tmp_path / "a.onnx", training={"latency_feature_mean": means}))
    model, warning = latency_model_for(rt)
    assert model is None and "adaptive-spec profile" in warning
    profile = tmp_path / "data" / "profile" / "profile.json"
    profile.parent.mkdir(parents=True)
    profile.write_text(json.dumps(synthetic_profile()))
    model, warning = latency_model_for(rt)  # the default location now exists
    assert warning is None and model.features(100)["target_ms"] > 0
    with pytest.raises(FileNotFoundError, match="adaptive-spec profile"):
        latency_model_for(rt, tmp_path / "missing.json")


def test_find_selector_looks_next_to_the_pair_then_in_data(tmp_path, monkeypatch, selector):
    pair = tmp_path / "pair"
    pair.mkdir()
    monkeypatch.setattr(files, "default_pair_path", lambda: pair)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError, match=r"make selector.*selector pipeline"):
        find_selector()
    (tmp_path / "data" / "selector").mkdir(parents=True)
    shutil.copyfile(selector, tmp_path / "data" / "selector" / "selector.onnx")
    assert find_selector().resolve() == (tmp_path / "data" / "selector" / "selector.onnx").resolve()
    shutil.copyfile(selector, pair / "selector.onnx")
    assert find_selector() == pair / "selector.onnx"  # the one shipped next to the pair wins over data/
    monkeypatch.setenv("ADAPTIVE_SPEC_HOME", str(tmp_path / "home"))
    installed = tmp_path / "home" / "default" / "selector.onnx"
    assert default_selector_paths()[0] == installed  # where --install writes
    installed.parent.mkdir(parents=True)
    shutil.copyfile(selector, installed)
    assert find_selector() == installed  # the one installed in the user data folder wins
    assert find_selector(selector) == selector
    with pytest.raises(FileNotFoundError, match="no selector at"):
        find_selector(tmp_path / "nope.onnx")


def test_adaptive_planner_counts_its_choices(selector):
    planner = AdaptivePlanner(selector)
    rng = np.random.default_rng(0)
    for i in range(50):
        feats = dict(zip(SCHEMA.names, (3 * rng.standard_normal(SCHEMA.num_scalar)).tolist(), strict=True))
        planner.choose(StepState(step=i, context_length=9, generated=i, remaining=99, temperature=0.0, features=feats))
    counts = planner.action_counts()
    assert sum(counts.values()) == 50 == len(planner.decision_times_s)
    assert list(counts.values()) == sorted(counts.values(), reverse=True) and set(counts) <= set(ACTIONS)
    assert len(counts) > 1
    assert planner.action_counts(top=1) == dict(list(counts.items())[:1])


def test_export_checkpoint_records_the_best_static_actions_of_training(tmp_path):
    """Train one step with Lightning, export: the runtime gives prepare()'s best static action per temperature."""
    import lightning as L  # noqa: N812 (Lightning's own convention)

    from adaptive_spec.selector.export import export_checkpoint
    from adaptive_spec.selector.lit import SelectorDataModule, SelectorModule

    write_labels(synthetic_labels(num_prompts=8, steps=4, seed=2), tmp_path / "labels.parquet")
    dm = SelectorDataModule(str(tmp_path / "labels.parquet"), batch_size=16)
    module = SelectorModule(data_spec=dm.spec, hidden_sizes=(8,), proj_dim=8)
    trainer = L.Trainer(
        max_steps=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
        accelerator="cpu",
        devices=1,
    )
    trainer.fit(module, datamodule=dm)
    trainer.save_checkpoint(tmp_path / "one.ckpt")
    export_checkpoint(tmp_path / "one.ckpt", tmp_path / "one.onnx", check_batch=4)
    rt = SelectorRuntime(tmp_path / "one.onnx")
    assert rt.best_static_groups == dm.spec["best_static"]
    assert set(rt.best_static_groups) == {"T=0,top_p=1", "T=1,top_p=1"}
    for t in (0.0, 1.0):
        assert rt.best_static(t) == Plan.parse(dm.spec["best_static"][f"T={t:g},top_p=1"])
    assert rt.trained_with_latency_features is True  # the synthetic labels carry draft_ms = 1.5 etc.


def test_the_selector_runs_with_its_own_profile_or_one_measured_on_first_use(tmp_path, monkeypatch, selector):
    from adaptive_spec.bench.profile import cached_profile_path, latency_for_selector
    from adaptive_spec.engine import SpecEngine
    from adaptive_spec.selector.runtime import selector_profile_path
    from tests.helpers.tiny import perturbed, tiny_model

    monkeypatch.chdir(tmp_path)  # no data/profile/profile.json here
    monkeypatch.setenv("ADAPTIVE_SPEC_HOME", str(tmp_path / "home"))
    means = {"draft_ms": 1.5, "target_ms": 8.0, "target_ms_per_token": 0.3}
    (tmp_path / "sel").mkdir()
    path = restamp(selector, tmp_path / "sel" / "selector.onnx", training={"latency_feature_mean": means})
    rt = SelectorRuntime(path)
    target = tiny_model(max_positions=160)
    engine = SpecEngine(target, perturbed(target))

    # 1. No profile anywhere: measured once for this pair and device, cached in the user data folder.
    model, note = latency_for_selector(engine, rt, progress=False)
    cached = cached_profile_path(engine)
    assert cached.is_file() and cached.is_relative_to(tmp_path / "home")
    assert "measured" in note and str(cached) in note
    assert model.features(50)["target_ms"] > 0
    assert max(json.loads(cached.read_text())["contexts"]) + 64 <= 160  # a grid that fits the window
    mtime = cached.stat().st_mtime_ns
    model, note = latency_for_selector(engine, rt, progress=False)  # 2. the cache, not a new measurement
    assert cached.stat().st_mtime_ns == mtime and "from" in note and model is not None

    # 3. The selector's own profile (the one it was trained with) comes before the cache.
    own = synthetic_profile()
    own["target_ms"] = [[123.0 for _ in row] for row in own["target_ms"]]
    selector_profile_path(path).write_text(json.dumps(own))
    assert selector_profile_path(path) == tmp_path / "sel" / "selector.profile.json"
    model, note = latency_for_selector(engine, rt, progress=False)
    assert note is None and model.features(50)["target_ms"] == pytest.approx(123.0)

    # 4. A selector trained without latency features gets none, and nothing is measured.
    bare = SelectorRuntime(restamp(selector, tmp_path / "bare.onnx", training={}))
    assert latency_for_selector(engine, bare, progress=False) == (None, None)
