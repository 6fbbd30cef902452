"""The exported selector driving the engine on tiny models: decisions, hidden states, losslessness."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from adaptive_spec.engine import SpecEngine
from adaptive_spec.formats.features import SCHEMA
from adaptive_spec.planner import Plan
from adaptive_spec.selector.export import export_net
from adaptive_spec.selector.model import SelectorNet
from adaptive_spec.selector.runtime import AdaptivePlanner
from tests.helpers.tiny import perturbed, tiny_model, tiny_tokenizer

V = 48
ACTIONS = ["chain:1/block", "chain:3/block", "iid:2x2/traversal", "delayed:1x2x2/traversal", "wor:2x1/rrsw"]
PROMPT = [0, 5, 6, 7, 9]


class RecordingPlanner(AdaptivePlanner):
    """An AdaptivePlanner that keeps what it saw and chose."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.seen: list[tuple[dict[str, float], torch.Tensor | None, str]] = []

    def choose(self, state):
        plan = super().choose(state)
        hidden = None if state.draft_hidden is None else state.draft_hidden.detach().float().cpu().clone()
        self.seen.append((dict(state.features), hidden, str(plan)))
        return plan


@pytest.fixture(scope="module")
def engine() -> SpecEngine:
    target = tiny_model("llama", vocab=V, eos=None)
    return SpecEngine(target, perturbed(target, scale=0.3), tokenizer=tiny_tokenizer(V))


def _selector(tmp_path, draft_hidden_dim: int = 0) -> tuple[SelectorNet, str]:
    torch.manual_seed(0)
    net = SelectorNet(SCHEMA.num_scalar, len(ACTIONS), draft_hidden_dim=draft_hidden_dim, hidden_sizes=(32,)).eval()
    # Spread the features so that the argmax moves between actions along a generation.
    net.set_standardisation(torch.zeros(SCHEMA.num_scalar), torch.full((SCHEMA.num_scalar,), 0.3))
    path = tmp_path / f"sel{draft_hidden_dim}.onnx"
    export_net(net, path, actions=ACTIONS)
    return net, str(path)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_engine_follows_the_selectors_argmax_on_its_features(engine, tmp_path, temperature):
    net, path = _selector(tmp_path)
    planner = RecordingPlanner(path)
    res = engine.generate(PROMPT, max_new_tokens=40, temperature=temperature, plan=planner, seed=0)
    assert len(planner.seen) == len(res.steps) == len(planner.decision_times_s)
    feats = torch.tensor(np.stack([SCHEMA.vector(f) for f, _, _ in planner.seen]))
    with torch.no_grad():
        expect = [ACTIONS[i] for i in net(feats).argmax(-1).tolist()]
    assert [plan for _, _, plan in planner.seen] == expect
    assert len(set(expect)) > 1  # the features the engine passes move the decision
    assert feats[0, SCHEMA.names.index("is_first_step")] == 1.0
    assert (feats[:, SCHEMA.names.index("temperature")] == temperature).all()
    # The step that ran is the chosen plan (cut to the token budget at the end).
    for step, (_, _, plan) in zip(res.steps, planner.seen, strict=True):
        assert step.plan == Plan.parse(plan).truncated(step.plan.shape.depth)
    assert planner.latency_us()["median"] > 0


def test_engine_level_planner_and_hidden_states(engine, tmp_path):
    hidden = engine.hidden_sizes[0]
    net, path = _selector(tmp_path, draft_hidden_dim=hidden)
    planner = RecordingPlanner(path)
    assert planner.needs_hidden
    adaptive = SpecEngine(engine.target, engine.draft, tokenizer=engine.tokenizer, planner=planner)
    res = adaptive.generate(PROMPT, max_new_tokens=30, temperature=0.0, seed=0)  # no plan: the engine's planner
    assert len(planner.seen) == len(res.steps) > 0
    feats = torch.tensor(np.stack([SCHEMA.vector(f) for f, _, _ in planner.seen]))
    hid = torch.stack([h for _, h, _ in planner.seen])
    assert hid.shape == (len(res.steps), hidden)
    with torch.no_grad():
        expect = [ACTIONS[i] for i in net(feats, draft_hidden=hid).argmax(-1).tolist()]
    assert [plan for _, _, plan in planner.seen] == expect
    # Greedy decoding stays lossless whatever the selector picks.
    plain = engine.generate(PROMPT, max_new_tokens=30, temperature=0.0, plan=None, seed=0)
    assert res.token_ids == plain.token_ids


def test_static_groups_play_the_static_plan_without_features(engine, tmp_path):
    """Where training found no gain (report's static_groups) the planner plays the static plan, feature-free."""
    from adaptive_spec.selector.runtime import SelectorLoadError

    torch.manual_seed(0)
    net = SelectorNet(SCHEMA.num_scalar, len(ACTIONS), hidden_sizes=(32,)).eval()
    net.set_standardisation(torch.zeros(SCHEMA.num_scalar), torch.full((SCHEMA.num_scalar,), 0.3))
    path = tmp_path / "gated.onnx"
    training = {
        "best_static": {"T=1,top_p=1": "chain:3/block", "T=0,top_p=1": "chain:1/block"},
        "static_groups": {"T=1,top_p=1": "chain:3/block"},
    }
    export_net(net, path, actions=ACTIONS, training=training)
    planner = RecordingPlanner(str(path))
    assert not planner.needs_features_for(1.0, 1.0)
    assert planner.needs_features_for(0.0, 1.0) and planner.needs_features_for(1.0, 0.9)
    # Sampling at T=1: every step is the static plan and the engine computed no features.
    seen: list = []
    original = AdaptivePlanner.choose

    def spy(self, state):
        seen.append(state.features)
        return original(self, state)

    gated = AdaptivePlanner(str(path))
    gated.choose = spy.__get__(gated)
    res = engine.generate(PROMPT, max_new_tokens=30, temperature=1.0, plan=gated, seed=0)
    assert seen and all(f is None for f in seen)
    # cut at the budget's end (to no draft at all when one token is left)
    assert {str(s.plan.shape) for s in res.steps} <= {"chain:3", "chain:2", "chain:1", "chain:0"}
    assert gated.action_counts() == {"chain:3/block": len(res.steps)}
    # Greedy: not a static group, the network decides on real features.
    res0 = engine.generate(PROMPT, max_new_tokens=30, temperature=0.0, plan=planner, seed=0)
    assert len(planner.seen) == len(res0.steps) and all(f for f, _, _ in planner.seen)
    # A static group naming an unknown action is refused at load time.
    bad = tmp_path / "bad.onnx"
    export_net(net, bad, actions=ACTIONS, training={"static_groups": {"T=1,top_p=1": "chain:9/block"}})
    with pytest.raises(SelectorLoadError, match="static_groups"):
        AdaptivePlanner(str(bad))
