"""The learned source choice's planner side: its features, the gate file and the decision."""

from __future__ import annotations

import json

import numpy as np
import pytest

from adaptive_spec.planner.gate import (
    GATE_FEATURES,
    GATE_VERSION,
    ROOT_FEATURES,
    GatedSource,
    GateFeatures,
    SourceGate,
)
from adaptive_spec.planner.plan import Plan, StepResult, StepState
from adaptive_spec.planner.sources import SourceRule, parse_source_rule
from adaptive_spec.trees.lookup import lookup_match

F = len(GATE_FEATURES)


def gate_data(lookup_logit: float, model_logit: float, **costs) -> dict:
    """A gate whose predictions are constant: sigmoid(logit) times each plan's depth."""
    return {
        "version": GATE_VERSION,
        "features": list(GATE_FEATURES),
        "model_plan": "chain:2/block",
        "lookup_plan": "lookup:8/block",
        "mean": [0.0] * F,
        "scale": [1.0] * F,
        "layers": [[np.zeros((4, F)).tolist(), [0.0] * 4], [np.zeros((2, 4)).tolist(), [lookup_logit, model_logit]]],
        "costs": {"model_s": 0.05, "lookup_s": 0.05, "per_token_s": 0.0, "plain_s": 1.0} | costs,
    }


def state(step: int, lookup: list[int], **kw) -> StepState:
    return StepState(step=step, context_length=10, generated=step, remaining=50, temperature=0.0, lookup=lookup, **kw)


def test_lookup_match_reports_matches_and_match_length() -> None:
    # "3 4 5" occurs twice before the end; the most recent (at 7) agrees only over the trigram
    found = lookup_match([1, 2, 3, 4, 5, 9, 2, 3, 4, 5, 7, 8, 3, 4, 5], 8)
    assert (found.tokens, found.ngram, found.matches, found.match_length) == ([7, 8, 3, 4, 5], 3, 2, 3)
    # here the one earlier occurrence agrees three tokens further back ("5 1 2" before "3 4 5")
    found = lookup_match([5, 1, 2, 3, 4, 5, 9, 5, 1, 2, 3, 4, 5], 8)
    assert (found.ngram, found.matches, found.match_length) == (3, 1, 6)
    assert lookup_match([1, 2], 8).ngram == 0


def test_shadow_rate_follows_the_committed_tokens() -> None:
    f = GateFeatures(depth=4)
    x = f.vector(state(0, [7, 8, 9, 10, 11]))
    assert f.proposal == [7, 8, 9, 10]  # cut to the plan's depth
    assert x[GATE_FEATURES.index("lookup_found")] == 1.0
    # a model step committed 7, 8, 2: two of the three comparable tokens agreed
    f.observe(StepResult(Plan.parse("chain:2/block"), 3, 2, (7, 8, 2), False))
    assert f.shadow_rate == pytest.approx(0.5 * 1.0 + 0.5 * 2 / 3)
    assert f.shadow_last == pytest.approx(2 / 4)
    assert f.model_rate == pytest.approx(0.5 * 0.5 + 0.5 * 1.0)
    x = f.vector(state(1, []))
    assert x[GATE_FEATURES.index("shadow_rate")] == pytest.approx(f.shadow_rate)
    f.observe(StepResult(Plan.parse("chain:2/block"), 3, 0, (4,), False))  # nothing was proposed: unchanged
    assert f.shadow_last == pytest.approx(2 / 4)
    f.vector(state(0, []))  # a new generation
    assert (f.shadow_rate, f.shadow_last) == (1.0, 0.0)


def test_gate_plays_the_source_with_more_tokens_per_second() -> None:
    sure_lookup = GatedSource(SourceGate(gate_data(5.0, -5.0)))  # ~8 looked-up tokens vs ~0 from the model
    assert str(sure_lookup.choose(state(0, [1, 2, 3]))) == "lookup:3/block"  # cut to the tokens found
    assert str(sure_lookup.choose(state(1, []))) == "chain:2/block"  # nothing found: the model
    sure_model = GatedSource(SourceGate(gate_data(-5.0, 5.0)))
    assert str(sure_model.choose(state(0, [1, 2, 3]))) == "chain:2/block"
    # equal predictions (4 vs 1 tokens), but lookup steps cost 5x: the model wins; then a margin tips it
    slow_lookup = SourceGate(gate_data(0.0, 0.0, lookup_s=0.25))
    assert str(GatedSource(slow_lookup).choose(state(0, [1, 2, 3, 4, 5, 6, 7, 8]))) == "chain:2/block"
    assert str(GatedSource(slow_lookup, margin=0.3).choose(state(0, [1] * 8))) == "lookup:8/block"
    # a weak draft on hardware where a plain step is much cheaper: no draft at all (one target token)
    weak = GatedSource(SourceGate(gate_data(-5.0, -5.0, plain_s=0.03)))
    assert str(weak.choose(state(0, [1, 2]))) == "chain:0/block"
    assert str(GatedSource(SourceGate(gate_data(5.0, -5.0, plain_s=0.03))).choose(state(0, [1, 2]))) == "lookup:2/block"


def test_a_gate_reads_only_its_features() -> None:
    """A gate trained without the draft's root features ignores them and asks for no draft forward."""
    keep = [f for f in GATE_FEATURES if f not in ROOT_FEATURES]
    data = gate_data(0.0, 0.0) | {"features": keep, "mean": [0.0] * len(keep), "scale": [1.0] * len(keep)}
    w = np.zeros((4, len(keep)))
    w[0, keep.index("shadow_rate")] = 1.0
    data["layers"] = [[w.tolist(), [0.0] * 4], [[[1.0, 0, 0, 0], [0.0] * 4], [0.0, 0.0]]]
    gate = SourceGate(data)
    assert not gate.uses_root and GatedSource(gate).needs_features is False
    assert GatedSource(SourceGate(gate_data(0.0, 0.0))).needs_features is True
    x = np.zeros(F, dtype=np.float32)
    x[GATE_FEATURES.index("shadow_rate")] = 2.0
    y = x.copy()
    y[[GATE_FEATURES.index(f) for f in ROOT_FEATURES]] = 9.0  # root features change nothing
    assert np.allclose(gate.predict(x), gate.predict(y))
    assert gate.predict(x)[0] == pytest.approx(8 / (1 + np.exp(-2.0)))
    for bad in (["draft_top1", "lookup_ngram"], ["nope"], []):  # out of order, unknown, none
        with pytest.raises(ValueError, match="retrain it"):
            SourceGate(gate_data(0.0, 0.0) | {"features": bad})


def test_gate_file_round_trip_and_errors(tmp_path) -> None:
    path = tmp_path / "gate.json"
    path.write_text(json.dumps(gate_data(1.0, 0.0)))
    planner = parse_source_rule(f"source:chain:2/block+lookup:8/block?gate={path.name}&margin=1.5", base_dir=tmp_path)
    assert isinstance(planner, GatedSource) and planner.margin == 1.5
    assert str(planner).endswith(f"?gate={path}&margin=1.5")
    assert isinstance(parse_source_rule("source:chain:2/block"), SourceRule)
    with pytest.raises(ValueError, match="trained for source:chain:2/block"):
        parse_source_rule(f"source:chain:3/block+lookup:8/block?gate={path}")
    with pytest.raises(ValueError, match="gate=FILE and margin=M only"):
        parse_source_rule(f"source:chain:2/block?gate={path}&min_rate=0.2")
    with pytest.raises(ValueError, match="no source gate file"):
        SourceGate.load(tmp_path / "missing.json")
    path.write_text("{not json")
    with pytest.raises(ValueError, match="is not a source gate file"):
        SourceGate.load(path)
    path.write_text(json.dumps(gate_data(1.0, 0.0) | {"version": 99}))
    with pytest.raises(ValueError, match="retrain it with `adaptive-spec selector gate`"):
        SourceGate.load(path)
    with pytest.raises(ValueError, match="margin must be a positive number"):
        GatedSource(SourceGate(gate_data(1.0, 0.0)), margin=0)


def test_the_shipped_pair_file_names_a_gate_that_loads() -> None:
    """Every plan of SmolLM2's adaptive.yaml parses, a gate among them found beside the file."""
    from pathlib import Path

    import yaml

    from adaptive_spec.engine.auto_plan import parse_plan_or_rule

    pair_file = Path(__file__).resolve().parents[2] / "adaptive_spec" / "zoo" / "smollm2" / "adaptive.yaml"
    plans = yaml.safe_load(pair_file.read_text())["plans"]
    for entry in plans.values():
        plan = parse_plan_or_rule(entry["plan"], base_dir=pair_file.parent)
        if isinstance(plan, GatedSource):
            assert plan.gate.path == pair_file.parent / "source_gate.json"
            assert plan.gate.costs.plain_s > 0 and plan.gate.layers[0][0].shape[1] == len(plan.gate.features)
