"""The latency model on synthetic profiles: exact interpolation, step predictions, features, errors."""

from __future__ import annotations

import copy
import json

import pytest

from adaptive_spec.formats.features import SCHEMA
from adaptive_spec.planner import LatencyModel, StepTimePrediction, default_profile_path
from adaptive_spec.planner.latency import interp1
from tests.helpers.profiles import CONTEXTS, draft_f, synthetic_profile, target_f


def test_interp1_is_exact_inside_and_clamped_outside():
    xs, ys = [1, 3, 7], [10.0, 14.0, 6.0]
    assert [interp1(xs, ys, x) for x in xs] == ys
    assert interp1(xs, ys, 2) == pytest.approx(12.0)
    assert interp1(xs, ys, 5) == pytest.approx(10.0)
    assert interp1(xs, ys, -4) == 10.0  # below: the edge value
    assert interp1(xs, ys, 100) == 6.0  # above, falling last segment: slope clamped to 0
    assert interp1([1, 3], [1.0, 2.0], 7) == pytest.approx(4.0)  # above, rising: linear extension
    assert interp1([4], [2.5], 99) == 2.5


@pytest.mark.parametrize(("c", "t"), [(0, 1), (50, 1.5), (100, 8), (220, 20), (300, 32), (77, 5)])
def test_bilinear_interpolation_reproduces_a_bilinear_profile(c, t):
    model = LatencyModel.from_profile(synthetic_profile())
    assert model.draft_forward_ms(c, t) == pytest.approx(draft_f(c, t))
    assert model.target_forward_ms(c, t) == pytest.approx(target_f(c, t))


def test_extrapolation_beyond_the_grid():
    model = LatencyModel.from_profile(synthetic_profile())
    # Past the largest context and token count: linear extension of the edge segments (rising here).
    assert model.target_forward_ms(600, 64) == pytest.approx(target_f(600, 64))
    # Below the smallest token count there is nothing to clamp (tokens >= 1); below context 0 neither.
    assert model.target_forward_ms(-5, 1) == pytest.approx(target_f(0, 1))


def test_predict_adds_draft_levels_target_block_verifier_and_bookkeeping():
    model = LatencyModel.from_profile(synthetic_profile())
    ctx = 120
    pred = model.predict("delayed:1x3x2/traversal", ctx)  # levels 1, 3, 3; N = 8; depth 3
    draft = draft_f(ctx - 1, 1) + draft_f(ctx, 1) + draft_f(ctx + 1, 3)
    target = target_f(ctx - 1, 1 + 7)
    verify = 0.3 + (8 - 3) * (3.0 / 30)  # the delayed curve falls back to the iid one
    other = 1.0 + 0.25 * 3 + 0.01 * 8
    assert isinstance(pred, StepTimePrediction)
    assert pred.draft_s == pytest.approx(draft / 1e3)
    assert pred.target_s == pytest.approx(target / 1e3)
    assert pred.verify_s == pytest.approx(verify / 1e3)
    assert pred.overhead_s == pytest.approx((verify + other) / 1e3)
    assert pred.total_s == pytest.approx(pred.draft_s + pred.target_s + pred.overhead_s)
    # Temperature 0: the engine verifies with greedy; a first step pays first_step_ms.
    greedy = model.predict("delayed:1x3x2/traversal", ctx, temperature=0.0)
    assert greedy.verify_s == pytest.approx(0.01 / 1e3)
    first = model.predict("delayed:1x3x2/traversal", ctx, first_step=True)
    assert first.total_s - pred.total_s == pytest.approx(7.0 / 1e3)
    # Two pending tokens: a longer first draft forward and target block at a shorter cache.
    two = model.predict("chain:2/traversal", ctx, pending=2)
    assert two.target_s == pytest.approx(target_f(ctx - 2, 2 + 2) / 1e3)
    assert two.draft_s == pytest.approx((draft_f(ctx - 2, 2) + draft_f(ctx, 1)) / 1e3)
    # A verifier the profile lacks costs nothing; a depth-0 plan runs no draft forward.
    assert model.predict("iid:2x2/gbv", ctx).verify_s == 0.0
    assert model.predict("chain:0/token", ctx).draft_s == 0.0
    small, large = model.predict_many(["chain:1/token", "iid:4x8/traversal"], ctx)
    assert small == model.predict("chain:1/token", ctx).total_s < large


def test_features_match_the_schema_names():
    model = LatencyModel.from_profile(synthetic_profile())
    feats = model.features(100)
    assert set(feats) == {"draft_ms", "target_ms", "target_ms_per_token"} <= set(SCHEMA.names)
    assert feats["draft_ms"] == pytest.approx(draft_f(100, 1))
    assert feats["target_ms"] == pytest.approx(target_f(100, 1))
    assert feats["target_ms_per_token"] == pytest.approx((target_f(100, 32) - target_f(100, 1)) / 31)


def test_load_reads_the_default_path_or_explains_how_to_make_one(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError, match="adaptive-spec profile"):
        LatencyModel.load()
    default_profile_path().parent.mkdir(parents=True)
    default_profile_path().write_text(json.dumps(synthetic_profile()))
    assert LatencyModel.load().contexts == CONTEXTS
    other = tmp_path / "p.json"
    other.write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        LatencyModel.load(other)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        LatencyModel.load(tmp_path / "missing.json")


def broken(**changes) -> dict:
    p = copy.deepcopy(synthetic_profile())
    for key, value in changes.items():
        p[key] = value
    return p


@pytest.mark.parametrize(
    ("profile", "message"),
    [
        (broken(format="something"), "not a latency profile"),
        (broken(version=99), "re-run `adaptive-spec profile`"),
        (broken(contexts=[100, 0, 300]), "strictly increasing"),
        (broken(tokens=[0, 1, 2, 3]), "integers >= 1"),
        (broken(draft_ms=[[1.0, 2.0]]), "must be a 3 x 4 list"),
        (broken(target_ms=[[1.0, 2.0, 3.0, float("nan")]] * 3), "negative, NaN or infinite"),
        (broken(verify_ms={"traversal": {"iid": {"nodes": [3, 2], "ms": [1, 2]}}}), "increasing 'nodes'"),
        (broken(verify_ms={"traversal": {"tree": {"nodes": [3], "ms": [1]}}}), "unknown law"),
        (broken(overhead={"const_ms": -1}), "overhead.const_ms must be a non-negative"),
        ([], "is a JSON object"),
    ],
)
def test_malformed_profiles_are_refused(profile, message):
    with pytest.raises(ValueError, match=message):
        LatencyModel.from_profile(profile)
