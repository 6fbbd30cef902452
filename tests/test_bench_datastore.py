"""``bench datastore``: lookup plans replayed on greedy answers take the engine's own steps; datastore samples."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from adaptive_spec.bench.datastore import datastore_curve, greedy_answers, plot_curve, replay_lookup
from adaptive_spec.engine import SpecEngine
from adaptive_spec.trees.datastore import Datastore
from tests.helpers.tiny import perturbed, tiny_model

PROMPTS = [[3, 5, 2, 3, 5, 2, 3, 5], [1, 4, 1, 4], [6, 2, 6], [7]]


@pytest.fixture(scope="module")
def engine():
    target = tiny_model("llama", vocab=8, hidden=16, eos=None, init_range=0.5, seed=11, layers=1)
    # a corpus of the target's greedy text after other prompts, and noise
    texts = [target.generate(torch.tensor([p]), max_new_tokens=30, do_sample=False)[0].tolist() for p in ([1], [6, 6])]
    texts += [[5, 2, 7, 7, 1], [2, 3, 5, 5], [4, 4, 4, 2, 1], [0, 1, 2, 3, 4, 5, 6, 7]]
    return SpecEngine(target, perturbed(target, 0.3, 12), datastore=Datastore.from_texts(texts, 8))


@pytest.mark.parametrize("plan", ["lookup:1x4+2/nss", "lookup:0x4+2/greedy", "lookup:3x4/nss", "lookup:4/block"])
def test_replayed_steps_are_the_engines(engine, plan) -> None:
    """Every step the replay counts, the engine takes at T = 0: the same steps and tokens, budget cuts included."""
    res = datastore_curve(engine, PROMPTS, [plan], [0.5, 1], max_new_tokens=37, progress=False)
    whole = next(r for r in res["rows"] if r["fraction"] in (None, 1))
    steps = tokens = 0
    for p in PROMPTS:
        out = engine.generate(p, max_new_tokens=37, temperature=0, plan=plan)
        steps, tokens = steps + len(out.steps), tokens + len(out.token_ids)
    assert (whole["steps"], whole["tokens"]) == (steps, tokens) == (whole["steps"], 37 * len(PROMPTS))
    assert whole["block_efficiency"] > 1.2  # looked-up tokens were accepted
    if "+" in plan:  # the corpus changes the steps: the equality above reads the engine's datastore
        other = replay_lookup(plan, greedy_answers(engine, PROMPTS, 37, progress=False), Datastore([0, 7], 8), 8)
        assert other["steps"] > whole["steps"]
        half = next(r for r in res["rows"] if r["fraction"] == 0.5)
        assert len(half["block_efficiency_samples"]) == 3 and half["datastore_tokens"] < whole["datastore_tokens"]


def test_the_curve_and_its_plot(engine, tmp_path) -> None:
    pytest.importorskip("matplotlib")
    res = datastore_curve(
        engine, PROMPTS, ["lookup:2x4/nss", "lookup:1x4+1/nss"], [0.25, 1], max_new_tokens=16, samples=2, progress=False
    )
    assert [(r["plan"], r["fraction"]) for r in res["rows"]] == [
        ("lookup:2x4/nss", None),
        ("lookup:1x4+1/nss", 0.25),
        ("lookup:1x4+1/nss", 1),
    ]
    assert res["answer_tokens"] == 16 * len(PROMPTS) and res["datastore"]["texts"] == 6
    plot_curve(res, tmp_path / "curve.png")
    assert (tmp_path / "curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bad_input(engine) -> None:
    for plan in ("chain:3/block", "lookup:1x4+1+m2/nss"):  # a model's path cannot be replayed without the model
        with pytest.raises(ValueError, match="replays lookup plans without a draft model's path"):
            datastore_curve(engine, PROMPTS, [plan], progress=False)
    with pytest.raises(ValueError, match=r"fractions of the datastore are in \(0, 1\]"):
        datastore_curve(engine, PROMPTS, ["lookup:1x4+1/nss"], [0, 1], progress=False)
    with pytest.raises(ValueError, match="samples must be at least 1"):
        datastore_curve(engine, PROMPTS, ["lookup:1x4+1/nss"], samples=0, progress=False)
    bare = SpecEngine(engine.target, engine.draft)
    with pytest.raises(ValueError, match="the engine has no datastore: give --datastore FILE"):
        datastore_curve(bare, PROMPTS, ["lookup:1x4+1/nss"], progress=False)
    with pytest.raises(ValueError, match="drafts from a datastore and none was given"):
        replay_lookup("lookup:1x4+1/nss", [{"prompt": [1], "answer": [2]}], None, 8)


def test_datastore_samples() -> None:
    texts = [[i % 8, i // 8, (i + 3) % 8] for i in range(20)]  # distinct texts
    store = Datastore.from_texts(texts, 8, max_ngram=3, info={"what": "test"})
    assert store.texts() == texts and store.sample(1) is store
    half = store.sample(0.5, seed=4)
    assert len(half.texts()) == 10 and all(t in texts for t in half.texts())
    assert half.texts() == sorted(half.texts(), key=texts.index)  # their order kept
    assert half.texts() == store.sample(0.5, seed=4).texts() != store.sample(0.5, seed=5).texts()
    assert half.max_ngram == 3 and half.info["what"] == "test" and half.info["sampled"]["texts"] == 10
    assert len(store.sample(0.001).texts()) == 1  # at least one text
    with pytest.raises(ValueError, match=r"a fraction of its texts is in \(0, 1\], got 1.5"):
        store.sample(1.5)


def test_cli_errors_before_loading_models() -> None:
    def run(*args):
        cmd = [sys.executable, "-m", "adaptive_spec", "bench", "datastore", *args, "--no-progress"]
        return subprocess.run(cmd, capture_output=True, text=True)

    for plan in ("chain:3/block", "lookup:3x8+m3/nss"):
        res = run("--plans", plan)
        assert res.returncode != 0 and "--plans takes lookup plans" in res.stderr and "Traceback" not in res.stderr
    res = run("--fractions", "0.5,2")
    assert res.returncode != 0 and "fractions of the datastore are in (0, 1]" in res.stderr
    res = run("--prompts", "nowhere.jsonl")
    assert res.returncode != 0 and "nowhere.jsonl" in res.stderr and "Traceback" not in res.stderr
