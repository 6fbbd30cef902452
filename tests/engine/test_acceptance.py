"""The acceptance model: node logs and their soft labels, training, ONNX export, runtime, learned-chain."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from adaptive_spec.engine import Plan, SpecEngine
from adaptive_spec.formats.nodes import NodeLogger, node_rows, read_node_log
from adaptive_spec.planner.acceptance import AcceptanceModel
from adaptive_spec.trees import DraftTree, TreeShape
from adaptive_spec.trees.policy import ACCEPTANCE_FEATURES, LearnedChain, NodeView, PolicyContext
from tests.helpers.dynamic_cases import TinyAcceptanceNet
from tests.helpers.tiny import perturbed, tiny_model


def _chain_tree() -> tuple[DraftTree, torch.Tensor]:
    """A 2-token chain over V=3 with known draft and target rows."""
    q = torch.tensor([[0.5, 0.3, 0.2], [0.1, 0.6, 0.3], [0.2, 0.2, 0.6]])
    p = torch.tensor([[0.25, 0.5, 0.25], [0.3, 0.3, 0.4], [1 / 3, 1 / 3, 1 / 3]])
    tree = DraftTree([-1, 0, 1], [-1, 0, 1], [0, 1, 2], q, [[1], [2], []], TreeShape.chain(2))
    return tree, p


def test_node_rows_soft_labels_and_features() -> None:
    tree, p = _chain_tree()
    rows = node_rows(tree, [True, True, False], p, temperature=1.0)
    assert rows["node"] == [1, 2] and rows["depth"] == [1, 2]
    # min(1, p/q) over the parent's rows: node 1 is token 0 from the root (0.25 / 0.5), node 2 token 1 (0.3/0.6)
    assert rows["label_accept"] == pytest.approx([0.5, 0.5])
    # next: Σ min(p, q) at node 1's rows; node 2 was not fed, so unknown
    assert rows["label_next"][0] == pytest.approx(0.1 + 0.3 + 0.3)
    assert math.isnan(rows["label_next"][1])
    assert rows["log_token_prob"] == pytest.approx([math.log(0.5), math.log(0.6)])
    assert rows["log_path_prob"] == pytest.approx([math.log(0.5), math.log(0.3)])
    assert rows["parent_top1"] == pytest.approx([0.5, 0.6])
    ent0 = -sum(x * math.log(x) for x in (0.5, 0.3, 0.2))
    assert rows["parent_entropy"][0] == pytest.approx(ent0)
    assert rows["fed"] == [True, False]
    # T=0: the target's rows are one-hot; next = p(argmax q)
    one_hot = torch.nn.functional.one_hot(p.argmax(1), 3).float()
    greedy = node_rows(tree, [True, True, False], one_hot, temperature=0.0)
    assert greedy["label_accept"] == [0.0, 0.0]  # tokens 0 and 1 are not the target's argmax (1 and 2)
    assert greedy["label_next"][0] == 0.0  # argmax q at node 1 is 1, the target's argmax is 2


def test_learned_chain_rule_is_gain_per_time() -> None:
    class Const:
        def __init__(self, a: float, b: float) -> None:
            self.a, self.b = a, b

        def __call__(self, rows: list) -> list:
            assert all(len(r) == len(ACCEPTANCE_FEATURES) for r in rows)
            return [(self.a, self.b)] * len(rows)

    ctx = PolicyContext(budget_left=8, temperature=1.0)
    view = NodeView(1, 0, 5, 1, 0.5, 0.5, 1.0, 0.5)
    # P = 0.9, E = 1.9; gain 0.9 * 0.8 = 0.72 per rho=0.5 vs rate 1.9 / 1.5: feed
    assert LearnedChain(depth=4, cost_ratio=0.5, predictor=Const(0.9, 0.8)).feed([view], ctx, None) == [True]
    assert view.memo == pytest.approx((0.9, 1.9))
    # a deeper node on a weak path: P = 0.2 * 0.5 = 0.1, E = 1.2 + 0.1; gain 0.1 * 0.5 = 0.05 * (1 + 0.5*2) < 0.5 * 1.3
    deep = NodeView(2, 1, 6, 2, 0.5, 0.25, 1.0, 0.5, parent_memo=(0.2, 1.2))
    assert LearnedChain(depth=4, cost_ratio=0.5, predictor=Const(0.5, 0.5)).feed([deep], ctx, None) == [False]
    assert deep.memo == pytest.approx((0.1, 1.3))
    with pytest.raises(ValueError, match="cost_ratio"):
        LearnedChain(depth=4, cost_ratio=0.0)
    assert str(Plan.parse("learned-chain:6:0.15/block")) == "learned-chain:6:0.15/block"


@pytest.fixture(scope="module")
def tiny_engine():
    target = tiny_model("llama", vocab=48, eos=None)
    return SpecEngine(target, perturbed(target, scale=0.3))


def test_engine_node_log_and_greedy_equality(tiny_engine: SpecEngine, tmp_path) -> None:
    logger = NodeLogger(tmp_path / "nodes", shard_rows=40)
    tiny_engine.node_log = logger
    try:
        for t in (0.0, 1.0):
            tiny_engine.generate([0, 5, 7], plan="chain:4/block", temperature=t, max_new_tokens=24, seed=1)
            logger.end_generation()
    finally:
        tiny_engine.node_log = None
        logger.close()
    table = read_node_log(tmp_path / "nodes")
    assert len(list((tmp_path / "nodes").glob("nodes-*.parquet"))) >= 2  # shards of 40 rows
    assert table.num_rows == logger.rows > 0
    assert set(table.column("generation").to_pylist()) == {0, 1}
    fed = table.column("fed").to_pylist()
    depth = table.column("depth").to_pylist()
    assert not any(f for f, d in zip(fed, depth, strict=True) if d == 4)  # the leaf of chain:4 is never fed
    assert sum(fed) > len(fed) / 2  # the rest are, except near the end of the budget (truncated chains)
    nxt = np.array(table.column("label_next").to_pylist())
    assert np.isnan(nxt[~np.array(fed)]).all() and not np.isnan(nxt[np.array(fed)]).any()
    with NodeLogger(tmp_path / "nodes") as again:  # a second run appends: new generation ids
        assert again.generation == 2
    acc = np.array(table.column("label_accept").to_pylist())
    assert ((acc >= 0) & (acc <= 1)).all()
    # greedy decoding with a learned chain equals the target's own greedy decoding
    plan = Plan(LearnedChain(depth=5, cost_ratio=0.1, predictor=TinyAcceptanceNet(2)), "block")
    for prompt in ([0, 5, 7], [0, 9], [0, 11, 3, 4]):
        expected = tiny_engine.generate(prompt, plan="autoregressive", temperature=0, max_new_tokens=16).token_ids
        out = tiny_engine.generate(prompt, plan=plan, temperature=0, max_new_tokens=16)
        assert out.token_ids == expected
        assert out.stats.policy_levels > 0


def test_node_log_skips_looked_up_nodes(tiny_engine: SpecEngine, tmp_path) -> None:
    """A looked-up node's tree row is the lookup's one-hot row (q = 1), not the draft's: it gets no node-log row.

    A hybrid:2:1 step draws exactly one token from the draft model, so one row per step; a lookup
    step draws none.
    """
    prompt = [0, 7, 3, 9, 5, 0, 7, 3, 9, 5, 0, 7]
    for plan, per_step in (("hybrid:2:1/block", 1), ("lookup:3/block", 0)):
        logger = NodeLogger(tmp_path / plan.replace(":", "-").replace("/", "-"))
        tiny_engine.node_log = logger
        try:
            out = tiny_engine.generate(prompt, plan=plan, temperature=1.0, max_new_tokens=12, seed=3)
        finally:
            tiny_engine.node_log = None
            logger.close()
        deep = [s for s in out.steps if s.num_nodes > 1]
        assert deep and any(s.num_nodes > 2 for s in deep)  # looked-up tokens were drafted
        assert logger.rows == per_step * len(deep), plan


def _synthetic(n: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = np.stack(
        [
            rng.integers(1, 8, n),
            np.log(rng.uniform(0.01, 1, n)),
            rng.uniform(0.1, 1, n),
            rng.uniform(0, 4, n),
            np.log(rng.uniform(0.001, 1, n)),
            rng.choice([0.0, 0.7, 1.0], n),
        ],
        axis=1,
    ).astype(np.float32)
    a = 1 / (1 + np.exp(-(3 * x[:, 2] + 0.8 * x[:, 1] - 1)))
    b = 1 / (1 + np.exp(-(2 * x[:, 2] - 0.5 * x[:, 3])))
    b[rng.uniform(size=n) < 0.2] = np.nan
    return {"x": x, "a": a.astype(np.float32), "b": b.astype(np.float32), "group": rng.integers(0, 20, n)}


def test_train_export_and_runtime(tmp_path) -> None:
    pytest.importorskip("lightning")
    from adaptive_spec.selector.acceptance import _split, calibration_report, export_acceptance, train_acceptance

    data = _synthetic(3000, 0)
    net, summary = train_acceptance(data, tmp_path, epochs=8, seed=0, progress=False)
    assert summary["rows_train"] + summary["rows_val"] == 3000
    info = export_acceptance(net, tmp_path / "acceptance.onnx", summary)
    assert info["max_abs_diff"] < 1e-5
    model = AcceptanceModel(tmp_path / "acceptance.onnx")
    x = data["x"][:200]
    assert np.abs(model.run_numpy(x) - model.run_onnx(x)).max() < 1e-4
    assert np.abs(np.array(model(x[:3].tolist())) - model.run_onnx(x[:3])).max() < 1e-4  # the row path
    import torch

    h = torch.tensor(x[:50], dtype=torch.float64)  # the layers a policy decided on the device runs (float64)
    layers = model.device_layers(torch.device("cpu"))
    for i, (W, b) in enumerate(layers):
        h = torch.addmm(b, h, W.t())
        h = h.clamp_min(0.0) if i + 1 < len(layers) else torch.sigmoid(h)
    assert np.abs(h.numpy() - np.array(model.run_rows(x[:50].tolist()))).max() < 1e-12  # the row path's arithmetic
    assert model.device_layers(torch.device("cpu")) is layers  # made once
    pred = model(x)
    assert pred.shape == (200, 2)
    assert np.corrcoef(pred[:, 0], data["a"][:200])[0, 1] > 0.9  # it learned the signal
    _, val = _split(data["group"], 0.2, 0)
    report = calibration_report(net, data, val, tmp_path / "report")
    assert (tmp_path / "report" / "calibration.png").is_file()
    assert all(r["accept"]["ece"] < 0.1 for r in report.values())


def test_runtime_refuses_foreign_and_corrupt_files(tmp_path) -> None:
    bad = tmp_path / "acceptance.onnx"
    bad.write_bytes(b"not a model")
    with pytest.raises(ValueError, match="not a readable ONNX model"):
        AcceptanceModel(bad)
    with pytest.raises(FileNotFoundError, match="selector acceptance"):
        AcceptanceModel(tmp_path / "missing.onnx")
    pytest.importorskip("onnx")
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 6])],
    )
    onnx.save(helper.make_model(graph), tmp_path / "other.onnx")
    with pytest.raises(ValueError, match="not an acceptance model"):
        AcceptanceModel(tmp_path / "other.onnx")


def test_runtime_features_equal_the_node_logs(tiny_engine: SpecEngine) -> None:
    """What a learned chain's model sees while drafting equals what the node log records for training."""
    seen: list[list[tuple]] = []

    class Recorder(TinyAcceptanceNet):
        def __call__(self, rows):
            seen[-1].extend(rows)
            return super().__call__(rows)

    logged: list[dict] = []

    def node_log(tree, fed, target_probs, temperature, drawn=None):
        logged.append(node_rows(tree, fed, target_probs, temperature, drawn))
        seen.append([])  # the next step's decisions

    plan = Plan(LearnedChain(depth=5, cost_ratio=0.05, predictor=Recorder(2)), "block")
    for t in (0.0, 0.8):
        seen.append([])
        tiny_engine.node_log = node_log
        try:
            tiny_engine.generate([0, 5, 7], plan=plan, temperature=t, max_new_tokens=20, seed=3)
        finally:
            tiny_engine.node_log = None
        seen.pop()  # opened after the last step
    assert len(seen) == len(logged) > 4
    compared = 0
    for decided, rows in zip(seen, logged, strict=True):
        by_depth = {d: i for i, d in enumerate(rows["depth"])}  # a chain: one node per depth
        for row in decided:
            i = by_depth[int(row[0])]
            logged_row = [rows[name][i] for name in ACCEPTANCE_FEATURES]
            assert logged_row == pytest.approx(list(row), abs=1e-6)
            compared += 1
    assert compared > 10
    assert any(r[-1] == 0.8 for step in seen for r in step) and any(r[-1] == 0.0 for step in seen for r in step)
