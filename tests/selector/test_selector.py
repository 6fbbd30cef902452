"""The learned selector: split, loss, LightningCLI training + report, ONNX export parity, runtime checks."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import numpy as np
import onnx
import pytest
import torch

from adaptive_spec.cli import main as cli_main
from adaptive_spec.formats.features import SCHEMA
from adaptive_spec.formats.label_table import read_labels, write_labels
from adaptive_spec.planner import Plan, StepState
from adaptive_spec.selector.datamodule import (
    SelectorSplit,
    oracle_choices,
    prepare,
    sampling_group,
    score_by_group,
    score_choices,
    split_by_prompt,
)
from adaptive_spec.selector.export import PARITY_TOL, export_net, parity
from adaptive_spec.selector.lit import SelectorModule
from adaptive_spec.selector.model import SelectorNet, selector_loss
from adaptive_spec.selector.runtime import (
    AdaptivePlanner,
    SelectorLoadError,
    SelectorRuntime,
    decision_latency_us,
)
from tests.helpers.synthetic_labels import ACTIONS, synthetic_labels

EPOCHS = 12


@pytest.fixture(scope="module")
def labels_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("labels")
    write_labels(synthetic_labels(num_prompts=40, steps=12, seed=1), root / "labels.parquet")
    return root


@pytest.fixture(scope="module")
def trained(labels_dir, tmp_path_factory):
    """One short LightningCLI run through `adaptive-spec selector train`; returns (report, run_dir)."""
    root = tmp_path_factory.mktemp("run")
    rc = cli_main(
        [
            "selector",
            "train",
            "--config",
            "configs/selector/default.yaml",
            "--data.labels",
            str(labels_dir),
            "--data.batch_size",
            "64",
            "--trainer.max_epochs",
            str(EPOCHS),
            "--trainer.default_root_dir",
            str(root),
            "--trainer.enable_progress_bar",
            "false",
            "--model.hidden_sizes",
            "[64, 32]",
            "--model.lr",
            "0.005",
            "--baseline_max_iter",
            "30",
        ]
    )
    assert rc == 0
    [report_file] = root.glob("version_*/report/report.json")
    return json.loads(report_file.read_text()), report_file.parent.parent


@pytest.fixture(scope="module")
def exported(trained, tmp_path_factory):
    report, _ = trained
    out = tmp_path_factory.mktemp("onnx")
    assert cli_main(["selector", "export", report["checkpoint"], "--out", str(out)]) == 0
    return out / "selector.onnx"  # --out is a folder


def _states(features: np.ndarray, **hidden) -> list[StepState]:
    return [
        StepState(
            step=i,
            context_length=10,
            generated=i,
            remaining=100,
            temperature=0.0,
            features=dict(zip(SCHEMA.names, map(float, row), strict=True)),
            **{k: v[i] for k, v in hidden.items()},
        )
        for i, row in enumerate(features)
    ]


# ---------------------------------------------------------------------------- data
def test_split_by_prompt_keeps_prompts_whole_and_is_deterministic():
    rng = np.random.default_rng(0)
    keys = [f"prompt-{k}" for k in rng.integers(0, 30, 500)]
    for seed in range(4):
        for fraction in (0.1, 0.25, 0.5):
            train, val = split_by_prompt(keys, fraction, seed)
            assert sorted(np.concatenate([train, val]).tolist()) == list(range(len(keys)))
            train_keys, val_keys = {keys[i] for i in train}, {keys[i] for i in val}
            assert not train_keys & val_keys and train_keys and val_keys
            assert len(val_keys) == round(fraction * len(set(keys)))
            # Same prompts on the same side whatever the row order.
            perm = rng.permutation(len(keys))
            _, val_perm = split_by_prompt([keys[i] for i in perm], fraction, seed)
            assert {keys[perm[i]] for i in val_perm} == val_keys
    assert {keys[i] for i in split_by_prompt(keys, 0.25, 0)[1]} != {keys[i] for i in split_by_prompt(keys, 0.25, 1)[1]}
    with pytest.raises(ValueError, match="2 distinct prompts"):
        split_by_prompt(["only"] * 5, 0.2, 0)
    with pytest.raises(ValueError, match="val_fraction"):
        split_by_prompt(keys, 1.0, 0)


def test_prepare_picks_the_best_static_action_per_sampling_group_on_train(tmp_path):
    table = synthetic_labels(num_prompts=20, steps=6, seed=2)
    train, val, spec = prepare(table, val_fraction=0.25, seed=0)
    assert spec["split"]["train_rows"] + spec["split"]["val_rows"] == len(table)
    groups = np.asarray(sampling_group(train.features))
    assert set(spec["best_static"]) == {"T=0,top_p=1", "T=1,top_p=1"}
    for g, action in spec["best_static"].items():
        # Chosen by aggregate tokens/s (Σ BE / Σ T), what a benchmark of one static plan measures.
        rows = groups == g
        be, st = train.block_efficiency[rows].astype(np.float64), train.step_time_s[rows].astype(np.float64)
        rates = be.sum(0) / st.sum(0)
        assert action == ACTIONS[int(rates.argmax())]
        assert spec["best_static_rate"][g] == pytest.approx(rates.max())
        assert (train.base_action[rows] == ACTIONS.index(action)).all()
        np.testing.assert_allclose(train.base_rate[rows], rates.max())
    # Net value: BE - λT in static steps; 0 on the static action when its BE/T equals λ on average.
    rows = np.arange(len(train))
    base_tps = train.block_efficiency[rows, train.base_action] / train.step_time_s[rows, train.base_action]
    np.testing.assert_allclose(train.net_value[rows, train.base_action], base_tps / train.base_rate - 1, rtol=1e-5)
    np.testing.assert_allclose(spec["feature_mean"], train.features.astype(np.float64).mean(axis=0), rtol=1e-6)
    # The static choice scores 1 by definition; the oracle at least 1 and a perfect accuracy.
    assert score_choices(val.base_action, val)["rel_tps"] == pytest.approx(1.0)
    oracle = score_choices(val.best_action, val)
    assert oracle["rel_tps"] > 1.0 and oracle["accuracy"] == 1.0
    # The Dinkelbach oracle maximises each group's aggregate: no single choice per row beats it.
    best = oracle_choices(val)
    best_agg = score_by_group(best, val)
    rng = np.random.default_rng(0)
    for _ in range(200):
        other = best.copy()
        flip = rng.integers(0, len(val), 3)
        other[flip] = rng.integers(0, len(ACTIONS), 3)
        for g, sc in score_by_group(other, val).items():
            assert sc["agg_rel_tps"] <= best_agg[g]["agg_rel_tps"] + 1e-12
    assert score_choices(best, val)["agg_rel_tps"] >= oracle["agg_rel_tps"] - 1e-12
    # Candidates: the most often best actions plus the static ones.
    _, _, few = prepare(table, val_fraction=0.25, seed=0, max_actions=1)
    assert set(np.unique(train.base_action)) <= set(few["candidates"]) and len(few["candidates"]) <= 3
    assert spec["candidates"] == list(range(len(ACTIONS)))
    # Bad labels are refused with the row named.
    table.step_time_s[3, 1] = 0.0
    with pytest.raises(ValueError, match="non-positive"):
        prepare(table)


# ---------------------------------------------------------------------------- loss
@pytest.mark.parametrize("objective", ["net", "ddte", "expected"])
def test_loss_is_lowest_on_the_best_action_and_its_gradient_moves_towards_it(objective):
    be = torch.tensor([[1.0, 3.0, 2.0], [4.0, 1.5, 1.0]])
    st = torch.tensor([[1.0, 1.0, 1.0], [2.0, 1.0, 1.0]])
    base = (be / st)[:, 0]
    rate = torch.full((2,), 2.0)  # λ: the static rate over both rows (Σ BE / Σ T of action 0)
    value = (be - rate[:, None] * st) / (rate * st[:, 0])[:, None]
    net = {"net_value": value}
    best = (be / st).argmax(-1)  # [1, 0]; here also the best net value
    assert torch.equal(best, value.argmax(-1))
    sharp = torch.full((2, 3), -20.0)
    on_best, on_worst = sharp.clone(), sharp.clone()
    on_best[torch.arange(2), best] = 20.0
    on_worst[torch.arange(2), (be / st).argmin(-1)] = 20.0
    for kw in ({}, {"tail_weight": 1.0}, {"ce_weight": 1.0}):
        lo = selector_loss(on_best, be, st, base, objective=objective, **net, **kw)
        hi = selector_loss(on_worst, be, st, base, objective=objective, **net, **kw)
        assert lo < hi
    logits = torch.zeros(2, 3, requires_grad=True)
    selector_loss(logits, be, st, base, objective=objective, tail_weight=0.5, ce_weight=0.5, **net).backward()
    stepped = (logits - 0.5 * logits.grad).softmax(-1)
    assert (stepped[torch.arange(2), best] > 1 / 3).all()
    with pytest.raises(ValueError, match="unknown objective"):
        selector_loss(logits, be, st, base, objective="nope")
    if objective == "net":
        with pytest.raises(ValueError, match="needs net_value"):
            selector_loss(logits, be, st, base, objective="net")


def test_net_objective_maximises_the_aggregate_not_the_mean_ratio():
    # Row 0 is a slow context, row 1 a fast one. On row 0 action 1 has the better ratio (0.209 vs
    # 0.2 tokens/s), but its extra second earns 0.3 tokens where the static rate earns 2.9: choosing
    # it lowers the aggregate (32.3 / 12 = 2.69 < 32 / 11 = 2.91).
    be = torch.tensor([[2.0, 2.3], [30.0, 1.0]])
    st = torch.tensor([[10.0, 11.0], [1.0, 1.0]])
    rate = torch.full((2,), 32.0 / 11.0)
    value = (be - rate[:, None] * st) / (rate * st[:, 0])[:, None]
    assert value[0].argmax() == 0 and (be / st)[0].argmax() == 1
    logits = torch.zeros(2, 2, requires_grad=True)
    for _ in range(200):
        loss = selector_loss(logits, be, st, (be / st)[:, 0], objective="net", net_value=value)
        (grad,) = torch.autograd.grad(loss, logits)
        logits = (logits - 5.0 * grad).detach().requires_grad_(True)
    assert logits.argmax(-1).tolist() == [0, 0]


def test_candidates_bias_excludes_actions_in_the_network_and_its_export(tmp_path):
    net = SelectorNet(SCHEMA.num_scalar, len(ACTIONS), hidden_sizes=(8,)).eval()
    net.set_candidates([1, 3])
    assert net.candidates == [1, 3]
    out = net(torch.randn(64, SCHEMA.num_scalar))
    assert set(out.argmax(-1).tolist()) <= {1, 3}
    # The export keeps the bias; parity is checked on the candidates' logits (float32 cannot resolve
    # ±1e-5 around -1e4), and the runtime never picks an excluded action.
    path = tmp_path / "cand.onnx"
    export_net(net, path, actions=ACTIONS)
    planner = AdaptivePlanner(str(path))
    feats = np.random.default_rng(0).normal(size=(100, SCHEMA.num_scalar)).astype(np.float32) * 5
    assert {str(planner.choose(s)) for s in _states(feats)} <= {ACTIONS[1], ACTIONS[3]}
    net.set_candidates(None)
    assert net.candidates == list(range(len(ACTIONS)))
    with pytest.raises(ValueError, match="candidates"):
        net.set_candidates([7])


# ---------------------------------------------------------------------------- training + report
def test_train_selector_cli_learns_and_writes_the_report(trained):
    report, run_dir = trained
    scores = report["scores"]
    assert set(scores) == {"adaptive", "neural", "hgb", "logistic", "best_static", "oracle"}
    assert scores["best_static"]["rel_tps"] == pytest.approx(1.0)
    gain = scores["oracle"]["rel_tps"] - 1.0
    assert gain > 0.03  # the fixture leaves room to learn
    # A selector that learned the structure captures most of the oracle's gain over the static plan.
    assert scores["neural"]["rel_tps"] > 1.0 + 0.5 * gain, scores
    assert scores["hgb"]["rel_tps"] > 1.0 + 0.5 * gain, scores
    assert len(report["history"]) == EPOCHS
    assert all("val/rel_tps" in h and "train/loss" in h for h in report["history"])
    assert report["history"][-1]["train/loss"] < report["history"][0]["train/loss"]
    assert report["trainer"]["world_size"] == 1
    assert report["split"]["val_prompts"] == 8 and report["use_hidden"] is False
    for key in ("json", "markdown", "plot"):
        assert (run_dir / "report" / f"report.{ {'json': 'json', 'markdown': 'md', 'plot': 'png'}[key] }").exists()
    assert (run_dir / "report" / "report.png").read_bytes()[:4] == b"\x89PNG"
    md = (run_dir / "report" / "report.md").read_text()
    assert "| neural |" in md and "| hgb |" in md and "| oracle |" in md
    assert (run_dir / "config.yaml").exists() and (run_dir / "metrics.csv").exists()
    # The checkpoint carries the data spec: it reloads without the label file.
    module = SelectorModule.load_from_checkpoint(report["checkpoint"], map_location="cpu")
    assert module.actions == ACTIONS and module.hparams.data_spec["manifest"]["source"].endswith("_synthetic.py")


def test_selector_module_refuses_hidden_without_hidden_labels(labels_dir):
    from adaptive_spec.selector.lit import SelectorDataModule

    dm = SelectorDataModule(str(labels_dir))
    with pytest.raises(ValueError, match="no hidden states"):
        SelectorModule(data_spec=dm.spec, use_hidden=True)
    with pytest.raises(ValueError, match="data_spec"):
        SelectorModule()


# ---------------------------------------------------------------------------- export + runtime
def test_export_parity_and_metadata(trained, exported, labels_dir):
    report, _ = trained
    module = SelectorModule.load_from_checkpoint(report["checkpoint"], map_location="cpu")
    table = read_labels(labels_dir)
    rng = np.random.default_rng(0)
    wild = torch.from_numpy(table.features[rng.integers(0, len(table), 300)]) * torch.from_numpy(
        rng.uniform(0.5, 2.0, (300, SCHEMA.num_scalar)).astype(np.float32)
    )
    for batch in (wild[:1], wild):  # the batch axis is dynamic
        diff = parity(module.net, exported, {"features": batch})
        assert diff < PARITY_TOL
    meta = {p.key: p.value for p in onnx.load(exported).metadata_props}
    assert meta["adaptive_spec.schema_version"] == str(SCHEMA.version)
    assert meta["adaptive_spec.schema_hash"] == SCHEMA.hash
    assert json.loads(meta["adaptive_spec.actions"]) == ACTIONS
    assert json.loads(meta["adaptive_spec.manifest"]) == table.manifest
    assert json.loads(meta["adaptive_spec.hidden_dims"]) == {"draft_hidden": 0, "target_hidden": 0}
    assert json.loads(meta["adaptive_spec.training"])["split"]["val_prompts"] == 8
    # The run's report decides the static groups (none here: the network wins at both temperatures).
    assert set(report["groups"]) == {"T=0,top_p=1", "T=1,top_p=1"} and report["static_groups"] == {}
    assert json.loads(meta["adaptive_spec.training"])["static_groups"] == {}


def test_export_records_the_reports_static_groups(trained, tmp_path):
    report, run_dir = trained
    edited = dict(json.loads((run_dir / "report" / "report.json").read_text()))
    edited["static_groups"] = {"T=1,top_p=1": report["best_static"]["T=1,top_p=1"]}
    path = tmp_path / "report.json"
    path.write_text(json.dumps(edited))
    out = tmp_path / "gated" / "selector.onnx"
    assert (
        cli_main(
            [
                "selector",
                "export",
                report["checkpoint"],
                "--out",
                str(out.parent),
                "--report",
                str(path),
                "--latency-decisions",
                "0",
            ]
        )
        == 0
    )
    planner = AdaptivePlanner(str(out))
    assert str(planner.runtime.static_plan_for(1.0)) == report["best_static"]["T=1,top_p=1"]
    # With static groups at every temperature, the exported latency still times the network itself.
    edited["static_groups"] = {g: report["best_static"][g] for g in ("T=0,top_p=1", "T=1,top_p=1")}
    path.write_text(json.dumps(edited))
    everywhere = tmp_path / "everywhere" / "selector.onnx"
    assert (
        cli_main(
            [
                "selector",
                "export",
                report["checkpoint"],
                "--out",
                str(everywhere.parent),
                "--report",
                str(path),
                "--latency-decisions",
                "0",
            ]
        )
        == 0
    )
    runtime = AdaptivePlanner(str(everywhere)).runtime
    runs = _count_runs(runtime)
    timed = decision_latency_us(runtime, decisions=50, warmup=5)
    assert timed["n"] == 50 and runs[0] == 55  # every decision ran the network
    for t in (0.0, 1.0):  # while a planner that plays the static groups never runs it
        AdaptivePlanner(runtime).choose(StepState(step=0, context_length=8, generated=0, remaining=9, temperature=t))
    assert runs[0] == 55
    assert planner.runtime.static_plan_for(0.0) is None
    assert (
        cli_main(
            [
                "selector",
                "export",
                report["checkpoint"],
                "--out",
                str(out.parent),
                "--report",
                str(path),
                "--no-static-groups",
                "--latency-decisions",
                "0",
            ]
        )
        == 0
    )
    assert AdaptivePlanner(str(out)).runtime.static_groups == {}
    # The report records the bar it applied.
    assert report["min_gain"] == 0.0 and report["gain_quantile"] == pytest.approx(0.1)
    assert all(sc["agg_rel_tps_quantile"] <= sc["agg_rel_tps"] + 1e-9 for sc in report["groups"].values())


def test_adaptive_planner_decisions_equal_torch_argmax(trained, exported, labels_dir):
    report, _ = trained
    net = SelectorModule.load_from_checkpoint(report["checkpoint"], map_location="cpu").net.eval()
    features = read_labels(labels_dir).features[:200]
    with torch.no_grad():
        logits = net(torch.from_numpy(features))
    planner = AdaptivePlanner(str(exported))
    assert planner.needs_features and not planner.needs_hidden
    chosen = [str(planner.choose(s)) for s in _states(features)]
    assert chosen == [ACTIONS[i] for i in logits.argmax(-1).tolist()]
    assert len(set(chosen)) > 1  # the decisions depend on the features
    stats = planner.latency_us()
    assert stats["n"] == 200 and 0 < stats["median"] <= stats["p90"] <= stats["max"]
    timed = decision_latency_us(planner.runtime, decisions=300, warmup=10)
    assert timed["n"] == 300 and timed["median"] > 0
    # Restricted to a subset: the argmax among those actions.
    allowed = ["chain:1/block", "chain:4/block"]
    restricted = AdaptivePlanner(planner.runtime, allowed=allowed)
    idx = [ACTIONS.index(a) for a in allowed]
    expect = [allowed[i] for i in logits[:, idx].argmax(-1).tolist()]
    assert [str(restricted.choose(s)) for s in _states(features)] == expect
    with pytest.raises(ValueError, match="not one of the selector's actions"):
        AdaptivePlanner(planner.runtime, allowed=["chain:3/block"])


def test_adaptive_planner_refuses_missing_features(exported):
    planner = AdaptivePlanner(exported)
    with pytest.raises(RuntimeError, match=r"StepState\.features"):
        planner.choose(StepState(step=0, context_length=3, generated=0, remaining=5, temperature=0.0))
    partial = {n: 0.0 for n in SCHEMA.names[:-1]}
    with pytest.raises(ValueError, match=SCHEMA.names[-1]):
        planner.choose(StepState(step=0, context_length=3, generated=0, remaining=5, temperature=0.0, features=partial))
    nan = dict.fromkeys(SCHEMA.names, float("nan"))
    with pytest.raises(ValueError, match="not finite"):
        planner.choose(StepState(step=0, context_length=3, generated=0, remaining=5, temperature=0.0, features=nan))


def test_hidden_state_inputs_round_trip(tmp_path):
    torch.manual_seed(0)
    net = SelectorNet(SCHEMA.num_scalar, len(ACTIONS), draft_hidden_dim=8, proj_dim=16, hidden_sizes=(32,)).eval()
    net.set_standardisation(torch.randn(SCHEMA.num_scalar), torch.rand(SCHEMA.num_scalar) + 0.5)
    info = export_net(net, tmp_path / "h.onnx", actions=ACTIONS, manifest={"k": 1})
    assert info["inputs"] == ["features", "draft_hidden"] and info["max_abs_diff"] < PARITY_TOL
    planner = AdaptivePlanner(tmp_path / "h.onnx")
    assert planner.needs_hidden and planner.runtime.hidden_dims == {"draft_hidden": 8, "target_hidden": 0}
    feats = torch.randn(50, SCHEMA.num_scalar) * 3
    hidden = torch.randn(50, 8, dtype=torch.float16) * 2  # the engine hands over model-dtype tensors
    with torch.no_grad():
        expect = net(feats, draft_hidden=hidden.float()).argmax(-1).tolist()
    states = _states(feats.numpy(), draft_hidden=hidden)
    chosen = [planner.runtime.actions.index(str(planner.choose(s))) for s in states]
    assert chosen == expect
    with pytest.raises(RuntimeError, match="draft_hidden"):
        planner.choose(_states(feats[:1].numpy())[0])
    with pytest.raises(ValueError, match="width 8"):
        planner.choose(_states(feats[:1].numpy(), draft_hidden=torch.randn(1, 6))[0])


def _rewrite(src, dst, **changes):
    model = onnx.load(src)
    props = {p.key: p.value for p in model.metadata_props}
    for key, value in changes.items():
        key = f"adaptive_spec.{key}"
        if value is None:
            props.pop(key)
        else:
            props[key] = value
    del model.metadata_props[:]
    for key, value in props.items():
        entry = model.metadata_props.add()
        entry.key, entry.value = key, value
    onnx.save(model, dst)
    return dst


def test_runtime_load_errors_are_clear(exported, tmp_path):
    blob = exported.read_bytes()
    with pytest.raises(FileNotFoundError, match="selector export"):
        SelectorRuntime(tmp_path / "missing.onnx")
    (tmp_path / "garbage.onnx").write_bytes(np.random.default_rng(0).bytes(2048))
    with pytest.raises(SelectorLoadError, match="not a readable ONNX model"):
        SelectorRuntime(tmp_path / "garbage.onnx")
    (tmp_path / "truncated.onnx").write_bytes(blob[: len(blob) // 2])
    with pytest.raises(SelectorLoadError, match="corrupt or truncated"):
        SelectorRuntime(tmp_path / "truncated.onnx")
    with pytest.raises(SelectorLoadError, match="no adaptive-spec selector metadata"):
        SelectorRuntime(_rewrite(exported, tmp_path / "nometa.onnx", format=None))
    with pytest.raises(SelectorLoadError, match="missing or malformed"):
        SelectorRuntime(_rewrite(exported, tmp_path / "noactions.onnx", actions=None))
    with pytest.raises(SelectorLoadError, match=r"feature schema v1 \(hash 0123456789abcdef\)"):
        SelectorRuntime(_rewrite(exported, tmp_path / "hash.onnx", schema_hash="0123456789abcdef"))
    with pytest.raises(SelectorLoadError, match="feature schema v99"):
        SelectorRuntime(_rewrite(exported, tmp_path / "version.onnx", schema_version="99"))
    bad_actions = json.dumps([*ACTIONS[:-1], "chain:4/nosuchverifier"])
    with pytest.raises(SelectorLoadError, match=r"action 4 .* is not a valid plan"):
        SelectorRuntime(_rewrite(exported, tmp_path / "badaction.onnx", actions=bad_actions))
    with pytest.raises(SelectorLoadError, match="6 actions"):
        SelectorRuntime(_rewrite(exported, tmp_path / "count.onnx", actions=json.dumps([*ACTIONS, "chain:3/block"])))
    hidden = json.dumps({"draft_hidden": 8, "target_hidden": 0})
    with pytest.raises(SelectorLoadError, match="graph inputs"):
        SelectorRuntime(_rewrite(exported, tmp_path / "hidden.onnx", hidden_dims=hidden))
    # The untouched file still loads, and its plans are parsed.
    rt = SelectorRuntime(exported)
    assert rt.plans == [Plan.parse(a) for a in ACTIONS]


def test_export_refuses_a_mismatched_action_list(tmp_path):
    net = SelectorNet(SCHEMA.num_scalar, 3, hidden_sizes=(8,))
    with pytest.raises(ValueError, match="2 actions for a network with 3 outputs"):
        export_net(net, tmp_path / "x.onnx", actions=ACTIONS[:2])
    assert not (tmp_path / "x.onnx").exists()


def test_the_runtime_imports_neither_lightning_nor_training_code():
    code = (
        "import sys, adaptive_spec.selector as s; assert 'onnxruntime' not in sys.modules; "
        "from adaptive_spec.selector import AdaptivePlanner; "
        "bad = [m for m in ('lightning', 'sklearn', 'onnx', 'adaptive_spec.selector.lit') if m in sys.modules]; "
        "assert not bad, bad; print('ok')"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert res.returncode == 0 and "ok" in res.stdout, res.stderr[-2000:]


# ---------------------------------------------------------------------------- DDP
@pytest.mark.slow
def test_the_same_config_trains_with_ddp_on_two_cpu_processes(labels_dir, tmp_path):
    root = tmp_path / "ddp"
    for attempt in range(2):
        res = subprocess.run(
            [
                sys.executable,
                "-m",
                "adaptive_spec",
                "selector",
                "train",
                "--config",
                "configs/selector/default.yaml",
                "--config",
                "configs/selector/ddp.yaml",
                "--data.labels",
                str(labels_dir),
                "--trainer.max_epochs",
                "2",
                "--data.batch_size",
                "64",
                "--trainer.default_root_dir",
                str(root / str(attempt)),
                "--trainer.enable_progress_bar",
                "false",
                "--baselines",
                "[]",
            ],
            capture_output=True,
            text=True,
            timeout=300,
        )
        # gloo's worker threads can abort at interpreter exit on a loaded machine ("terminate called
        # without an active exception"); such a run is retried once, any other failure is not.
        if res.returncode == 0 or "terminate called without an active exception" not in res.stderr:
            break
    assert res.returncode == 0, res.stderr[-3000:]
    root = root / str(attempt)
    [report_file] = root.glob("version_*/report/report.json")
    report = json.loads(report_file.read_text())
    assert report["trainer"]["world_size"] == 2 and report["trainer"]["strategy"] == "DDPStrategy"
    # Each process gets half of every epoch's rows: half the optimizer steps of one process.
    per_rank = math.ceil(report["split"]["train_rows"] / 2)
    assert report["trainer"]["global_step"] == 2 * math.ceil(per_rank / 64)
    assert "Initializing distributed: GLOBAL_RANK: 1" in res.stderr + res.stdout
    assert set(report["scores"]) == {"adaptive", "neural", "best_static", "oracle"}
    assert math.isfinite(report["scores"]["neural"]["rel_tps"])
    assert list((root / "version_0" / "checkpoints").glob("*.ckpt"))


def test_predictability_tells_informative_features_from_noise():
    from adaptive_spec.selector.baselines import predictability

    table = synthetic_labels(num_prompts=40, steps=8, seed=3)
    train, _, _ = prepare(table, val_fraction=0.2, seed=0)
    informative = predictability(train)
    assert set(informative) == {"T=0,top_p=1", "T=1,top_p=1"}
    assert min(informative.values()) > 0.8  # l1_target_draft gives the acceptance away
    # The same labels with the features shuffled across rows: nothing to predict from.
    shuffled = train.subset(np.arange(len(train)))
    shuffled.features = train.features[np.random.default_rng(0).permutation(len(train))]
    noise = predictability(shuffled)
    assert max(noise.values()) < 0.3
    with pytest.raises(ValueError, match="prompt keys"):
        predictability(SelectorSplit(train.features, train.block_efficiency, train.step_time_s, train.base_action))


def test_bootstrap_quantiles_over_prompts():
    from adaptive_spec.selector.train import bootstrap_quantiles

    table = synthetic_labels(num_prompts=40, steps=8, seed=3)
    _, val, _ = prepare(table, val_fraction=0.5, seed=0)
    same = bootstrap_quantiles(val.base_action, val, 0.1)
    assert same and all(q == pytest.approx(1.0) for q in same.values())
    oracle = oracle_choices(val)
    sure = bootstrap_quantiles(oracle, val, 0.1)
    by_group = score_by_group(oracle, val)
    for g, q in sure.items():  # a real gain on every prompt: even the low quantile is above 1
        assert 1.0 < q <= by_group[g]["agg_rel_tps"]
    # Quantiles are ordered, and a bad quantile is refused.
    assert all(bootstrap_quantiles(oracle, val, 0.05)[g] <= bootstrap_quantiles(oracle, val, 0.5)[g] for g in sure)
    with pytest.raises(ValueError, match="gain_quantile"):
        bootstrap_quantiles(oracle, val, 1.5)


def _count_runs(runtime) -> list[int]:
    """Count the onnxruntime calls of ``runtime`` from now on (a wrapper around its session)."""
    runs = [0]
    session = runtime.session

    class Counting:
        def __getattr__(self, name):
            return getattr(session, name)

        def run_with_iobinding(self, binding, *args):
            runs[0] += 1
            return session.run_with_iobinding(binding, *args)

    runtime.session = Counting()
    return runs
