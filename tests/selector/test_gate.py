"""Training the learned source choice: labels from the committed text, collection, fit, the gate in the engine."""

from __future__ import annotations

import json

import pytest
import torch

from adaptive_spec.analysis.expected import expected_block_efficiency
from adaptive_spec.planner.gate import GATE_FEATURES, GatedSource, SourceGate, StepCosts
from adaptive_spec.selector.gate import (
    collect_gate_data,
    fit_gate,
    label_steps,
    lookup_depth,
    read_gate_data,
    write_gate,
)
from adaptive_spec.trees.lookup import lookup_trie, ngram_candidates

V = 6


def follow_depth_mean(tree, rows: torch.Tensor, node: int = 0) -> float:
    """E[depth to which a continuation sampled from the target rows follows the tree] below ``node``."""
    children = [c for c, p in enumerate(tree.parents) if p == node]
    return sum(float(rows[node, tree.tokens[c]]) * (1.0 + follow_depth_mean(tree, rows, c)) for c in children)


@pytest.mark.parametrize(
    ("candidates", "paths", "verifiers"),
    [
        ([[1, 2, 3, 4]], 1, ("block", "token", "traversal")),  # a lookup chain
        ([[1, 2, 3], [1, 4, 0], [5, 2, 2]], 3, ("nss",)),  # a trie: two candidates share their first token
    ],
)
def test_the_committed_text_labels_lookup_with_its_accepted_length(candidates, paths, verifiers) -> None:
    """The label (how deep target-sampled tokens follow the lookup) has the law of a lookup step's acceptance.

    Its mean, by enumeration over the target's rows, equals E[τ] of the verifier the lookup plan uses.
    """
    tree = lookup_trie(candidates, V, paths)
    gen = torch.Generator().manual_seed(len(candidates))
    rows = torch.rand(tree.num_nodes, V, generator=gen, dtype=torch.float64) ** 3
    rows /= rows.sum(-1, keepdim=True)
    label_mean = follow_depth_mean(tree, rows)
    for verifier in verifiers:
        be, exact = expected_block_efficiency(verifier, tree, rows)
        assert exact and abs(be - 1.0 - label_mean) < 1e-9, verifier
    if paths > 1:  # negative control: comparing with the first candidate only under-counts the trie
        chain = lookup_trie(candidates[:1], V, 1)
        first_only = follow_depth_mean(chain, rows[[0, 1, 2, 3]])  # nodes 1-3 are the first candidate's path
        assert first_only < label_mean - 1e-3


def test_lookup_depth_walks_the_trie() -> None:
    cands = [[1, 2, 3], [1, 4], [5]]
    assert lookup_depth(cands, [1, 2, 3, 9]) == 3
    assert lookup_depth(cands, [1, 4, 4]) == 2
    assert lookup_depth(cands, [5, 1]) == 1
    assert lookup_depth(cands, [2]) == 0
    assert lookup_depth([], [1, 2]) == 0


def test_label_steps_rebuilds_the_lookup_from_the_record() -> None:
    ids = [3, 5, 7, 3, 5, 7, 2, 3, 5, 7, 3]
    record = {
        "key": "0:0:0",
        "prompt": 0,
        "ids": ids,
        "steps": [
            {"x": [0.0] * 12, "p": 4, "found": 3, "source": "model", "accepted": 1, "seconds": 0.1},
            {"x": [0.0] * 12, "p": 6, "found": 3, "source": "lookup", "accepted": 0, "seconds": 0.2},
            {"x": [0.0] * 12, "p": 9, "found": 2, "source": "model", "accepted": 0, "seconds": 0.1},
            {"x": [0.0] * 12, "p": 10, "found": 2, "source": "model", "accepted": 0, "seconds": 0.1},
            {"x": [0.0] * 12, "p": 10, "found": 0, "source": "model"},  # unfinished: dropped
        ],
    }
    data = label_steps([record], "lookup:2/block")
    # at 4 ("3" -> "5 7"), the text went on "5 7": 2; at 6 ("3 5 7" -> "3 5"), it went "2 3": 0;
    # at 9 ("3 5" -> "7 2"), it went "7 3": 1; at 10 the generation ends before two more tokens: no label
    assert ngram_candidates(ids[:4], 1, 2) == [[5, 7]] and ngram_candidates(ids[:9], 1, 2) == [[7, 2]]
    assert data["lookup"][:3].tolist() == [2.0, 0.0, 1.0] and torch.isnan(torch.tensor(data["lookup"][3]))
    assert data["model"][0] == 1.0 and torch.isnan(torch.tensor(data["model"][1]))
    assert data["is_lookup"].tolist() == [0.0, 1.0, 0.0, 0.0] and data["x"].shape == (4, 12)


# Collection on the tiny pair: prompts that repeat themselves (lookup finds something) and the plans.
PROMPTS = [[5, 6, 7, 5, 6, 7, 5, 6], [9, 3, 9, 3, 9, 3, 8], [4, 11, 12, 4, 11], [20, 21, 22, 20, 21]]
COLLECT = dict(model="chain:2/block", lookup="lookup:4/block", max_new_tokens=24, explore=0.5, progress=False)


def _tiny_engine():
    from adaptive_spec.engine.load import load_engine

    return load_engine(None, None, "cpu", None)


@pytest.mark.slow
def test_collect_fit_and_play_a_gate_on_the_tiny_pair(tiny_pair, tmp_path) -> None:
    engine, prompts, kwargs, data = _tiny_engine(), PROMPTS, COLLECT, tmp_path / "steps.jsonl"
    collect_gate_data(engine, prompts, [0.0, 1.0], data, **kwargs)
    lines = data.read_text().splitlines()
    assert len(lines) == 8
    collect_gate_data(engine, prompts, [0.0, 1.0], data, **kwargs)  # resumes: nothing left to do
    assert data.read_text().splitlines() == lines
    records = read_gate_data(data)
    assert all(r["ids"][: r["prompt_length"]] == prompts[r["prompt"]] for r in records)
    labelled = label_steps(records, "lookup:4/block")
    gate, report = fit_gate(labelled, "chain:2/block", "lookup:4/block", epochs=50)
    assert report["lookup"]["labelled"] > 0 and report["model"]["labelled"] > 0
    assert report["costs"]["model_s"] > 0 and report["costs"]["lookup_s"] > 0
    path = write_gate(gate, tmp_path / "gate.json", report, {"test": True})
    assert json.loads(path.read_text())["report"]["steps"] == report["steps"]
    loaded = SourceGate.load(path)
    # The fitted costs are this host's step times, measured while collecting, so which source wins
    # would vary with the machine's load: play the gate with fixed step costs (a lookup step at half a
    # model step's cost: it runs no draft forward), where its choice is its own prediction of the
    # accepted tokens (deterministic: fixed seeds and training seed); a lookup priced out is never played.
    for lookup_s, want in ((0.5, {"model", "lookup"}), (100.0, {"model"})):
        loaded.costs = StepCosts(model_s=1.0, lookup_s=lookup_s, per_token_s=0.0, plain_s=1.0)
        planner = GatedSource(loaded)
        played = set()
        for prompt in prompts:  # lossless: at temperature 0 the text is the target's greedy text
            ar = engine.generate(prompt, max_new_tokens=16, temperature=0, plan=None)
            out = engine.generate(prompt, max_new_tokens=16, temperature=0, plan=planner)
            assert out.token_ids == ar.token_ids
            # a no-draft step reports source "model" with depth 0: count the sources that drafted something
            played |= {s.plan.source for s in out.steps if s.plan.shape.depth > 0}
        assert played == want, lookup_s


@pytest.mark.slow
def test_a_gate_without_draft_features_runs_no_draft_before_choosing(tiny_pair, tmp_path) -> None:
    """Collected and fitted with ``root_features=False``: lookup and no-draft steps run no draft forward."""
    from adaptive_spec.planner.gate import ROOT_FEATURES
    from adaptive_spec.selector.gate import data_root_features

    engine, prompts, kwargs, data = _tiny_engine(), PROMPTS, COLLECT, tmp_path / "steps.jsonl"
    collect_gate_data(engine, prompts, [0.0], data, root_features=False, **kwargs)
    records = read_gate_data(data)
    assert data_root_features(records) is False
    root_cols = [GATE_FEATURES.index(f) for f in ROOT_FEATURES]
    assert all(step["x"][c] == 0.0 for r in records for step in r["steps"] for c in root_cols)
    with pytest.raises(ValueError, match="collected without draft root features"):
        collect_gate_data(engine, prompts, [1.0], data, **kwargs)  # the other kind into the same file
    features = [f for f in GATE_FEATURES if f not in ROOT_FEATURES]
    labelled = label_steps(records, "lookup:4/block")
    gate, report = fit_gate(labelled, "chain:2/block", "lookup:4/block", epochs=50, features=features)
    assert report["features"] == features and not gate.uses_root
    path = write_gate(gate, tmp_path / "gate.json", report, {"test": True})
    loaded = SourceGate.load(path)
    assert loaded.features == tuple(features) and loaded.layers[0][0].shape[1] == len(features)
    planner = GatedSource(loaded)
    assert planner.needs_features is False
    # Always the lookup where one is found, else no draft: no step runs the draft model.
    planner.gate.costs = StepCosts(model_s=10.0, lookup_s=1e-3, per_token_s=0.0, plain_s=0.5)
    prompt = prompts[0]
    ar = engine.generate(prompt, max_new_tokens=16, temperature=0, plan=None)
    out = engine.generate(prompt, max_new_tokens=16, temperature=0, plan=planner)
    assert out.token_ids == ar.token_ids
    assert all(s.plan.source == "lookup" or s.plan.shape.depth == 0 for s in out.steps)
    assert any(s.plan.source == "lookup" for s in out.steps) and any(s.plan.shape.depth == 0 for s in out.steps)
    assert out.stats.draft_forwards == 1  # the prompt's prefill only: no step ran the draft
