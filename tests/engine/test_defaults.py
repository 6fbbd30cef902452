"""What generate() does when told little: the default plan (fingerprinted tuned files), the model's
generation_config, device_map loading, offline hub names, and transformers' custom_generate."""

from __future__ import annotations

import copy
import logging
import os
import time
from pathlib import Path

import pytest
import torch
import yaml
from transformers import GenerationConfig

from adaptive_spec import SpecEngine
from adaptive_spec.engine.auto_plan import DEFAULT_PLAN, choose_default_plan
from adaptive_spec.engine.fingerprint import model_fingerprint, plan_file_matches, stamp_plan_file
from adaptive_spec.planner import Plan
from tests.helpers.tiny import perturbed, tiny_model, tiny_tokenizer

V = 48
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def models():
    target = tiny_model("llama", vocab=V, eos=None)
    return target, perturbed(target, scale=0.3)


@pytest.fixture(scope="module")
def pair_dir(tmp_path_factory, models):
    """The tiny pair saved as model directories, the target with a tokenizer."""
    root = tmp_path_factory.mktemp("pair")
    for role, model in zip(("target", "draft"), models, strict=True):
        model.save_pretrained(root / role)
        tiny_tokenizer(V).save_pretrained(root / role)
    return root


def _engine(models, **kw):
    target, draft = (copy.deepcopy(m) for m in models)
    return SpecEngine(target, draft, tokenizer=tiny_tokenizer(V), **kw)


# ----------------------------------------------------------------------------- fingerprints
def test_fingerprint_ignores_dtype_and_device_but_not_weights_or_vocab(models):
    target, draft = models
    tok = tiny_tokenizer(V)
    fp = model_fingerprint(target, tok)
    assert fp.startswith("v1:") and fp == model_fingerprint(copy.deepcopy(target), tiny_tokenizer(V))
    assert model_fingerprint(copy.deepcopy(target).to(torch.bfloat16), tok) == fp
    assert model_fingerprint(draft, tok) != fp
    assert model_fingerprint(perturbed(target, scale=1e-2), tok) != fp
    assert model_fingerprint(target, tiny_tokenizer(V - 4)) != fp
    assert model_fingerprint(target) != fp


def test_the_shipped_in_draft_file_is_stamped_for_the_built_in_pair():
    """configs/plans/in-draft.yaml was tuned on the built-in pair; best-static.yaml on an older pair."""
    engine = SpecEngine.from_pretrained()
    half = SpecEngine.from_pretrained(dtype="bfloat16")
    assert half.fingerprints() == engine.fingerprints()  # the checkpoint, whatever the load dtype
    in_draft_file = os.path.join(REPO, "adaptive_spec", "configs", "plans", "in-draft.yaml")
    in_draft = yaml.safe_load(Path(in_draft_file).read_text())
    best_static = yaml.safe_load(Path(REPO, "adaptive_spec/configs/plans/best-static.yaml").read_text())
    assert plan_file_matches(in_draft, engine.fingerprints())
    assert not plan_file_matches(best_static, engine.fingerprints())
    from adaptive_spec.planner.presets import load_in_draft

    for t in (0.0, 0.7, 1.0):
        assert engine.default_plan(t) == load_in_draft(t, in_draft_file)


# ----------------------------------------------------------------------------- the default plan
def _plan_file(path, plans, fingerprints=None):
    path.write_text(yaml.safe_dump({"version": 1, "plans": {k: {"plan": v} for k, v in plans.items()}}))
    if fingerprints is not None:
        stamp_plan_file(path, fingerprints)
    return path


def test_generate_speculates_by_default_with_the_default_static_plan(models, caplog):
    engine = _engine(models)
    engine.tuned_plan_files = []
    with caplog.at_level(logging.INFO, logger="adaptive_spec.engine"):
        out = engine.generate([0, 5], max_new_tokens=12, temperature=0)
    assert out.steps and out.stats.draft_forwards > 0
    assert str(out.steps[0].plan) == DEFAULT_PLAN  # (the last step is cut to the budget)
    assert f"plan {DEFAULT_PLAN}" in caplog.text and "default static plan" in caplog.text
    ar = engine.generate([0, 5], max_new_tokens=12, temperature=0, plan="autoregressive")
    assert ar.steps == [] and ar.token_ids == out.token_ids  # lossless: the same greedy tokens


def test_a_plan_file_is_played_only_for_the_pair_it_was_stamped_for(models, tmp_path, caplog):
    engine = _engine(models)
    plans = {"0": "chain:3/block", "0.7": "conf-chain:4:0.3/block", "1": "iid:2x2/traversal"}
    mine = _plan_file(tmp_path / "mine.yaml", plans, engine.fingerprints())
    other = _plan_file(tmp_path / "other.yaml", {"0": "chain:5/block"}, {"target": "v1:0", "draft": "v1:0"})
    unstamped = _plan_file(tmp_path / "unstamped.yaml", {"0": "chain:6/block"})
    fps = engine.fingerprints()
    assert choose_default_plan(fps, 0.0, [other, unstamped])[0] == Plan.parse(DEFAULT_PLAN)
    assert "another model pair" in choose_default_plan(fps, 0.0, [other])[1]
    assert choose_default_plan(fps, 0.0, [other, mine])[0] == Plan.parse("chain:3/block")
    assert choose_default_plan(fps, 0.8, [mine])[0] == Plan.parse("conf-chain:4:0.3/block")  # nearest temperature
    assert choose_default_plan(fps, 1.3, [mine])[0] == Plan.parse("iid:2x2/traversal")
    engine.tuned_plan_files = [other, mine]
    with caplog.at_level(logging.INFO, logger="adaptive_spec.engine"):
        out = engine.generate([0, 5], max_new_tokens=12, temperature=1.0, seed=0)
    assert out.steps[0].plan == Plan.parse("iid:2x2/traversal")
    assert "mine.yaml was tuned for this model pair" in caplog.text
    assert engine.generate([0, 5], max_new_tokens=12, temperature=1.0, seed=0).token_ids == out.token_ids


def test_a_greedy_only_plan_is_not_played_when_sampling(models, tmp_path):
    engine = _engine(models)
    f = _plan_file(tmp_path / "g.yaml", {"0.5": "chain:4/greedy", "0": "chain:4/greedy"}, engine.fingerprints())
    plan, why = choose_default_plan(engine.fingerprints(), 1.0, [f])
    assert plan == Plan.parse(DEFAULT_PLAN) and "greedy-only" in why
    assert choose_default_plan(engine.fingerprints(), 0.0, [f])[0] == Plan.parse("chain:4/greedy")


def test_the_engine_planner_still_wins_and_autoregressive_is_explicit(models):
    engine = _engine(models, planner="chain:4/block")
    out = engine.generate([0, 5], max_new_tokens=10, temperature=0)
    assert str(out.steps[0].plan) == "chain:4/block"
    assert engine.generate([0, 5], max_new_tokens=5, plan="autoregressive").steps == []


# ----------------------------------------------------------------------------- generation_config
@pytest.fixture()
def configured(models):
    engine = _engine(models)
    engine.tuned_plan_files = []
    return engine


def test_the_targets_generation_config_gives_the_defaults(configured):
    engine = configured
    engine.target.generation_config = GenerationConfig(
        do_sample=True, temperature=0.7, top_k=10, top_p=0.9, max_new_tokens=7, eos_token_id=[V - 1]
    )
    for seed in range(3):
        a = engine.generate([0, 5], seed=seed)
        b = engine.generate([0, 5], max_new_tokens=7, temperature=0.7, top_k=10, top_p=0.9, seed=seed, stop=[V - 1])
        assert a.token_ids == b.token_ids and len(a.token_ids) <= 7
    # Explicit arguments win over the model's config.
    greedy = engine.generate([0, 5], temperature=0, max_new_tokens=4)
    ar = engine.generate([0, 5], temperature=0, max_new_tokens=4, plan="autoregressive")
    assert greedy.token_ids == ar.token_ids and len(greedy.token_ids) == 4
    # A generation_config argument wins field by field; the fields it leaves unset come from the model's.
    arg = engine.generate([0, 5], generation_config=GenerationConfig(do_sample=False))
    assert arg.token_ids == engine.generate([0, 5], temperature=0, max_new_tokens=7, stop=[V - 1]).token_ids


def test_eos_ids_from_the_generation_config_int_or_list(configured):
    engine = configured
    first = engine.generate([0, 5], temperature=0, max_new_tokens=6, plan="autoregressive").token_ids
    engine.target.generation_config = GenerationConfig(eos_token_id=[V - 2, first[1]], do_sample=False)
    out = engine.generate([0, 5], max_new_tokens=6)
    assert out.token_ids == first[:2] and out.stats.stop_reason == "eos"
    engine.target.generation_config = GenerationConfig(eos_token_id=first[0], do_sample=False)
    assert engine.generate([0, 5], max_new_tokens=6).token_ids == first[:1]
    # The argument's eos replaces the model's, as in transformers.
    out = engine.generate([0, 5], max_new_tokens=6, generation_config=GenerationConfig(eos_token_id=V - 2))
    assert out.token_ids == first[:6] or V - 2 in out.token_ids


def test_max_length_counts_the_prompt_and_max_new_tokens_wins(configured):
    engine = configured
    engine.target.generation_config = GenerationConfig(max_length=9, do_sample=False)
    assert len(engine.generate([0, 5, 6], plan="autoregressive").token_ids) == 6
    assert len(engine.generate([0, 5, 6], max_new_tokens=3).token_ids) == 3
    engine.target.generation_config = GenerationConfig(max_length=9, max_new_tokens=4, do_sample=False)
    assert len(engine.generate([0, 5, 6]).token_ids) == 4
    engine.target.generation_config = GenerationConfig(do_sample=False)
    with pytest.raises(ValueError, match=r"max_length=2 .* leaves no room"):
        engine.generate([0, 5, 6], generation_config=GenerationConfig(max_length=2, max_new_tokens=None))


def test_row_wise_config_settings_apply_and_the_others_are_refused_or_warned(configured):
    from transformers import MinPLogitsWarper

    engine = configured
    cfg = GenerationConfig(do_sample=True, min_p=0.2, max_new_tokens=8)
    a = engine.generate([0, 5], generation_config=cfg, seed=3)
    b = engine.generate([0, 5], max_new_tokens=8, temperature=1.0, seed=3, logits_processor=[MinPLogitsWarper(0.2)])
    assert a.token_ids == b.token_ids
    with pytest.raises(ValueError, match=r"generation_config sets repetition_penalty=1.2: not supported"):
        engine.generate([0, 5], generation_config=GenerationConfig(repetition_penalty=1.2))
    engine.target.generation_config = GenerationConfig(no_repeat_ngram_size=3, do_sample=False, max_new_tokens=3)
    with pytest.warns(UserWarning, match="target's generation_config sets no_repeat_ngram_size=3: ignored"):
        assert len(engine.generate([0, 5]).token_ids) == 3


def test_a_tiny_llama_saved_with_its_generation_config(pair_dir, tmp_path):
    """from_pretrained reads the target's generation_config.json: its settings are the call's defaults."""
    import shutil

    root = tmp_path / "pair"
    shutil.copytree(pair_dir, root)
    GenerationConfig(do_sample=False, max_new_tokens=5, eos_token_id=[V - 1, V - 2]).save_pretrained(root / "target")
    engine = SpecEngine.from_pretrained(str(root / "target"), str(root / "draft"))
    engine.tuned_plan_files = []
    out = engine.generate("w5 w6")
    ref = engine.generate("w5 w6", temperature=0, max_new_tokens=5, stop=[V - 1, V - 2], plan="autoregressive")
    assert out.token_ids == ref.token_ids and len(out.token_ids) <= 5 and out.steps


# ----------------------------------------------------------------------------- loading
def test_device_map_loads_through_accelerate_and_decodes_the_same(pair_dir, tmp_path):
    """device_map="auto" (one CPU here), and a map that offloads a layer to disk: accelerate's hooks run it."""
    pytest.importorskip("accelerate")
    t, d = str(pair_dir / "target"), str(pair_dir / "draft")
    plain = SpecEngine.from_pretrained(t, d)
    mapped = SpecEngine.from_pretrained(t, d, device_map="auto")
    assert mapped.target.device.type == "cpu" and mapped.draft.device == mapped.target.device
    split = {
        "model.embed_tokens": "cpu",
        "model.layers.0": "cpu",
        "model.layers.1": "disk",
        "model.norm": "cpu",
        "model.rotary_emb": "cpu",
        "lm_head": "cpu",
    }
    by_module = SpecEngine.from_pretrained(t, d, device_map=split, offload_folder=tmp_path / "offload")
    assert by_module.target.hf_device_map == split  # dispatched by accelerate, layer 1 read from disk
    assert by_module.target.model.layers[1].self_attn.q_proj.weight.device.type == "meta"
    for engine in (plain, mapped, by_module):
        engine.tuned_plan_files = []
    for plan in ("autoregressive", "chain:3/block", "iid:2x2/traversal"):
        ref = plain.generate("w5 w6", max_new_tokens=12, temperature=0, plan=plan).token_ids
        assert mapped.generate("w5 w6", max_new_tokens=12, temperature=0, plan=plan).token_ids == ref
        assert by_module.generate("w5 w6", max_new_tokens=12, temperature=0, plan=plan).token_ids == ref
    with pytest.raises(ValueError, match=r"device= .* or device_map="):
        SpecEngine.from_pretrained(str(pair_dir / "target"), str(pair_dir / "draft"), device="cpu", device_map="auto")


def test_an_uncached_hub_name_fails_at_once_offline(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    start = time.perf_counter()
    with pytest.raises(
        ValueError,
        match=r"target model 'nosuch-org/nosuch-model' is not a local directory nor in "
        r"the Hugging Face cache, and the hub is offline",
    ):
        SpecEngine.from_pretrained("nosuch-org/nosuch-model", "nosuch-org/nosuch-draft")
    assert time.perf_counter() - start < 30  # a generous guard: no retries, no downloads


# ----------------------------------------------------------------------------- transformers' custom_generate
def test_custom_generate_runs_the_engine_from_model_generate(models):
    import adaptive_spec

    target, draft = (copy.deepcopy(m) for m in models)
    ids = torch.tensor([[0, 5, 6]])
    mask = torch.ones_like(ids)
    ref = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=10)
    out = target.generate(
        ids,
        attention_mask=mask,
        do_sample=False,
        max_new_tokens=10,
        assistant_model=draft,
        custom_generate=adaptive_spec.custom_generate_dir(),
        trust_remote_code=True,
        plan="chain:3/block",
    )
    assert out.shape == ref.shape and torch.equal(out, ref)
    # transformers' own defaults apply (greedy unless do_sample=True, max_length 20) and the default plan runs.
    out = target.generate(
        ids,
        attention_mask=mask,
        assistant_model=draft,
        custom_generate=adaptive_spec.custom_generate_dir(),
        trust_remote_code=True,
    )
    assert torch.equal(out, target.generate(ids, attention_mask=mask))
    from adaptive_spec.hf import speculative_generate

    torch.manual_seed(0)
    a = speculative_generate(target, ids, assistant_model=draft, do_sample=True, max_new_tokens=6)
    torch.manual_seed(0)
    b = speculative_generate(target, ids, assistant_model=draft, do_sample=True, max_new_tokens=6)
    assert torch.equal(a, b) and a.shape == (1, 9)  # torch.manual_seed makes sampling reproducible
    with pytest.raises(ValueError, match="needs assistant_model"):
        speculative_generate(target, ids, max_new_tokens=3)
    with pytest.raises(ValueError, match="batches are not supported yet"):
        speculative_generate(target, torch.tensor([[0, 5], [0, 6]]), assistant_model=draft)
    with pytest.raises(ValueError, match="trust_remote_code"):
        target.generate(
            ids, attention_mask=mask, assistant_model=draft, custom_generate=adaptive_spec.custom_generate_dir()
        )


def test_cli_generate_plays_the_default_plan_and_fails_offline_in_one_line(pair_dir, monkeypatch, capsys):
    import json

    from adaptive_spec.cli import main

    args = ["generate", "--target", str(pair_dir / "target"), "--draft", str(pair_dir / "draft"), "--prompt", "w3"]
    assert main([*args, "--max-new-tokens", "6", "--temperature", "0", "--json", "--device", "cpu"]) == 0
    stats = json.loads(capsys.readouterr().out)  # one JSON document, the text included
    assert isinstance(stats["text"], str)
    assert stats["plan"] == DEFAULT_PLAN and stats["draft_forwards"] > 0  # the tiny pair matches no tuned file
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(SystemExit, match=r"^generate: target model 'nosuch-org/x' is not a local directory"):
        main(["generate", "--target", "nosuch-org/x", "--draft", "nosuch-org/y", "--prompt", "w3"])


def test_tune_stamp_writes_the_pairs_fingerprints_and_keeps_the_plans(tmp_path, capsys):
    from adaptive_spec.cli import main

    f = tmp_path / "in-draft.yaml"
    f.write_text("# header kept\n" + yaml.safe_dump({"version": 1, "plans": {"0": {"plan": "chain:3/block"}}}))
    assert main(["tune", "stamp", str(f)]) == 0
    data = yaml.safe_load(f.read_text())
    engine = SpecEngine.from_pretrained()
    assert plan_file_matches(data, engine.fingerprints()) and data["plans"] == {"0": {"plan": "chain:3/block"}}
    assert f.read_text().startswith("# header kept\n") and engine.fingerprints()["target"] in capsys.readouterr().out
    with pytest.raises(SystemExit, match="no such file"):
        main(["tune", "stamp", str(tmp_path / "missing.yaml")])
