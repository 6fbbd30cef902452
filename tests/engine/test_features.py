"""Root features equal a straightforward recomputation from full forward passes over the context."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from adaptive_spec.engine import SpecEngine, StepState
from adaptive_spec.engine.features import LOG_CLAMP
from adaptive_spec.formats.features import SCHEMA
from tests.helpers.tiny import perturbed, tiny_model

V = 48


@pytest.fixture(scope="module")
def models():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    target = tiny_model("llama", vocab=V, eos=None, seed=5)
    yield target, perturbed(target, scale=0.1, seed=6)
    torch.set_num_threads(threads)


class Recorder:
    """A planner that wants features and records what it saw; cycles through ``plans``."""

    needs_features = True

    def __init__(self, plans: list[str], hidden: bool = False) -> None:
        self.plans = itertools.cycle(plans)
        self.needs_hidden = hidden
        self.states: list[StepState] = []

    def choose(self, state: StepState) -> str:
        self.states.append(state)
        return next(self.plans)


class FakeLatency:
    def features(self, context_length: int) -> dict[str, float]:
        return {"draft_ms": 0.5 + context_length, "target_ms": 2.0, "target_ms_per_token": 0.25}


def processed(row: torch.Tensor, temperature: float, top_k: int) -> torch.Tensor:
    """The rows features use: plain softmax at T=0, else temperature then top-k then softmax (float64)."""
    row = row.double()
    if temperature > 0:
        row = row / temperature
        if top_k:
            row = row.masked_fill(row < row.topk(top_k).values[-1], -math.inf)
    return torch.softmax(row, dim=-1)


def full_forward(model, context: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    with torch.inference_mode():
        out = model(input_ids=torch.tensor([context]), output_hidden_states=True)
    return out.logits[0, :, :V], out.hidden_states[-1][0]  # [n, V], [n, H]


def expected_features(target, draft, context, temperature, top_k, steps_before) -> dict[str, float]:
    n = len(context)
    t_logits, _ = full_forward(target, context)
    d_logits, _ = full_forward(draft, context)
    log = lambda p: p.clamp_min(LOG_CLAMP).log()  # noqa: E731
    entropy = lambda p: float(-(p * log(p)).sum())  # noqa: E731
    root = processed(d_logits[n - 1], temperature, top_k)
    out = {"draft_root_entropy": entropy(root), "draft_root_top1": float(root.max())}
    if n >= 2:
        t = processed(t_logits[n - 2], temperature, top_k)
        d = processed(d_logits[n - 2], temperature, top_k)
        out.update(
            target_entropy=entropy(t),
            draft_entropy=entropy(d),
            target_top1=float(t.max()),
            kl_target_draft=float((t * (log(t) - log(d))).sum()),
            kl_draft_target=float((d * (log(d) - log(t))).sum()),
            l1_target_draft=float((t - d).abs().sum()),
        )
    else:
        out.update(
            dict.fromkeys(
                (
                    "target_entropy",
                    "draft_entropy",
                    "target_top1",
                    "kl_target_draft",
                    "kl_draft_target",
                    "l1_target_draft",
                ),
                0.0,
            )
        )
    taus = [s.num_accepted for s in steps_before]
    ema = 0.0
    for i, tau in enumerate(taus):
        ema = tau if i == 0 else 0.3 * tau + 0.7 * ema
    out.update(
        last_accepted=float(taus[-1]) if taus else 0.0,
        accepted_ema=ema,
        is_first_step=float(not taus),
        context_length=float(n),
        temperature=float(temperature),
        top_p=1.0,
    )
    return out


def check_run(models, plans, temperature, top_k=0, prompt=(0, 7, 3, 9), hidden=False, latency=None, tokens=24, seed=1):
    target, draft = models
    engine = SpecEngine(target, draft, latency_model=latency)
    rec = Recorder(plans, hidden=hidden)
    out = engine.generate(
        list(prompt), max_new_tokens=tokens, temperature=temperature, top_k=top_k, plan=rec, seed=seed
    )
    context = list(prompt) + out.token_ids
    assert len(rec.states) == len(out.steps) == out.stats.steps
    cases = {"expanded": 0, "leaf": 0}
    for k, state in enumerate(rec.states):
        assert tuple(state.features) == SCHEMA.names
        ctx = context[: state.context_length]
        want = expected_features(target, draft, ctx, temperature, top_k, out.steps[:k])
        if latency is not None:
            want.update(latency.features(len(ctx)))
        else:
            want.update(draft_ms=0.0, target_ms=0.0, target_ms_per_token=0.0)
        for name in SCHEMA.names:
            assert state.features[name] == pytest.approx(want[name], rel=2e-4, abs=2e-5), (k, name)
        if k:
            prev = out.steps[k - 1]
            cases["leaf" if prev.num_accepted == prev.plan.shape.depth else "expanded"] += 1
        if hidden:
            _, d_hidden = full_forward(draft, ctx)
            _, t_hidden = full_forward(target, ctx)
            assert state.draft_hidden.shape == (d_hidden.shape[1],)
            torch.testing.assert_close(state.draft_hidden, d_hidden[-1], atol=1e-4, rtol=1e-4)
            if len(ctx) >= 2:
                torch.testing.assert_close(state.target_hidden, t_hidden[-2], atol=1e-4, rtol=1e-4)
        else:
            assert state.draft_hidden is None and state.target_hidden is None
    return out, cases


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("plan", ["chain:2/token", "iid:2x2/specinfer", "wor:2x2/traversal"])
def test_features_match_full_forward_passes(models, plan: str, temperature: float) -> None:
    # Both ways of knowing the previous draft row occur: a node the draft expanded, and a leaf (a whole path
    # accepted: rare for two random walkers at T = 0, so a few seeds, each run checked in full).
    cases = {"expanded": 0, "leaf": 0}
    for seed in range(1, 5):
        _, seen = check_run(models, [plan], temperature, seed=seed)
        cases = {k: cases[k] + seen[k] for k in cases}
        if cases["expanded"] and cases["leaf"]:
            break
    assert cases["expanded"] > 0 and cases["leaf"] > 0, cases


def test_features_with_top_k_hidden_states_latency_and_depth_zero_steps(models) -> None:
    out, cases = check_run(
        models,
        ["chain:2/block", "chain:0", "delayed:1x2x1/traversal"],
        0.7,
        top_k=5,
        hidden=True,
        latency=FakeLatency(),
    )
    assert {s.plan.shape.depth for s in out.steps} >= {0, 2}
    assert cases["leaf"] > 0 and cases["expanded"] > 0


def test_one_token_prompt_has_no_previous_rows(models) -> None:
    check_run(models, ["chain:2/token"], 1.0, prompt=(4,), tokens=8)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_features_change_neither_tokens_nor_forwards(models, temperature: float) -> None:
    engine = SpecEngine(*models)
    kw = {"max_new_tokens": 30, "temperature": temperature, "seed": 2, "keep_state": True}
    plain = engine.generate([0, 7, 3], plan="iid:2x3/traversal", **kw)
    rec = Recorder(["iid:2x3/traversal"])
    with_features = engine.generate([0, 7, 3], plan=rec, **kw)
    assert with_features.token_ids == plain.token_ids
    # The first draft forward only moves before the planner's choice; a depth-0 step (the last
    # token of the budget) runs it too, as its root distribution is a feature.
    depth0 = sum(s.plan.shape.depth == 0 for s in with_features.steps)
    assert with_features.stats.draft_forwards == plain.stats.draft_forwards + depth0
    assert with_features.stats.target_forwards == plain.stats.target_forwards
    # Off by default: no tracker, no hidden states, nothing in StepState.
    assert plain.state.root is None and with_features.state.root is not None
    assert not plain.state.target.keep_hidden and not plain.state.draft.keep_hidden
    seen = []
    engine.generate([0, 7, 3], plan=lambda_planner(seen), **kw)
    assert seen and all(s.features is None and s.draft_hidden is None for s in seen)


def lambda_planner(seen: list[StepState]):
    class Plain:
        def choose(self, state: StepState) -> str:
            seen.append(state)
            return "chain:2/token"

    return Plain()


def test_engine_planner_is_the_default_plan(models) -> None:
    rec = Recorder(["chain:2/token"])
    engine = SpecEngine(*models, planner=rec)
    out = engine.generate([0, 7], max_new_tokens=6, temperature=0, seed=0)
    assert out.steps and len(rec.states) == len(out.steps)
    assert engine.generate([0, 7], max_new_tokens=6, temperature=0, plan=None).steps == []  # explicit None: AR


REPEATING = (0, 7, 3, 9, 5, 0, 7, 3, 9, 5, 0, 7)  # the context's n-grams recur: lookups find continuations


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize(
    "plans",
    [
        ["lookup:3/block", "chain:1/token"],
        ["lookup:2x3/nss", "chain:1/token"],
        ["hybrid:2:1/block"],
        ["hybrid:2:1/block", "lookup:3/block", "iid:2x2/specinfer"],
    ],
)
def test_features_after_lookup_and_hybrid_steps(models, plans: list[str], temperature: float) -> None:
    """The previous draft row after a lookup or hybrid step is the draft model's row, not the tree's one-hot one.

    The hand computation (:func:`expected_features`) runs both models over the whole context.
    """
    if temperature == 0 and any(p.endswith("/nss") for p in plans):
        plans = [p.replace("/nss", "/greedy") for p in plans]
    out, _ = check_run(models, plans, temperature, prompt=REPEATING, tokens=20)
    sources = [s.plan.source for s in out.steps]
    # The case that was wrong: a looked-up step that accepted nothing (its root's row was the lookup's).
    looked = [k for k, s in enumerate(out.steps[:-1]) if s.plan.source != "model"]
    assert looked, sources
    assert any(out.steps[k].num_accepted < out.steps[k].plan.shape.depth for k in looked), sources
