"""`adaptive-spec tune sources`: the per-step source rule chosen on measured speedup, and who plays it.

The tuned file is played by `generate(plan="auto")` for the pair it was stamped for, and by
`bench e2e --plans adaptive,best-static` for a pair that ships it.
"""

from __future__ import annotations

import json

import optuna
import pytest
import yaml

from adaptive_spec.bench.e2e import resolve_plans
from adaptive_spec.cli import main
from adaptive_spec.engine.auto_plan import choose_default_plan
from adaptive_spec.engine.fingerprint import stamp_plan_file
from adaptive_spec.engine.load import load_engine
from adaptive_spec.planner.sources import SourceRule, parse_source_rule
from adaptive_spec.tuning.sources import KNOWN_RULES, choose, suggest_rule


@pytest.fixture
def prompt_files(tiny_pair, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # configs/plans/adaptive.yaml is written here
    (tmp_path / "chat.txt").write_text("w5 w6 w7\nw9 w3\n")
    (tmp_path / "copy.txt").write_text("w5 w6 w7 w5 w6 w7 w5 w6\n")
    return tiny_pair


@pytest.mark.slow
def test_tune_sources_writes_the_measured_best_rule_and_generate_plays_it(prompt_files, tmp_path):
    storage = f"sqlite:///{tmp_path}/o.db"
    args = ["tune", "sources", "--prompts", "chat.txt", "--prompts", "copy.txt", "--temperatures", "0,1"]
    args += ["--max-new-tokens", "8", "--trials", "3", "--storage", storage, "--static", "chain:2/block,lookup:4/block"]
    assert main([*args, "--json", "out.json", "--no-progress"]) == 0
    out = tmp_path / "configs/plans/adaptive.yaml"
    data = yaml.safe_load(out.read_text())
    report = json.loads((tmp_path / "out.json").read_text())
    for key in ("0", "1"):
        entry = data["plans"][key]
        rows = report["rules"][key]["results"]
        assert len(rows) == 3 and entry["trials"] == 3 and entry["num_prompts"] == 3
        best_rule = max(rows, key=lambda r: r["speedup_vs_ar"])
        statics = report["static"]["runs"][key]["results"]
        best_static = max(statics, key=lambda r: r["speedup_vs_ar"])
        assert entry["best_static"]["plan"] == best_static["plan"]
        rule_wins = best_rule["speedup_vs_ar"] >= best_static["speedup_vs_ar"]
        assert entry["plan"] == (best_rule if rule_wins else best_static)["plan"]  # whatever measured best
        assert isinstance(parse_source_rule(best_rule["plan"]), SourceRule)
    study = optuna.load_study(study_name="sources-T1", storage=storage)
    assert [t.user_attrs["plan"] for t in study.trials[:2]] == list(KNOWN_RULES)  # the enqueued starting points

    engine = load_engine(None, None, None, None)
    rule, why = choose_default_plan(engine.fingerprints(), 1.0, [out])  # stamped for this pair: played by default
    assert str(rule) == data["plans"]["1"]["plan"] and "adaptive.yaml" in why
    rule_file = tmp_path / "rule.yaml"  # a rule that won: generate() plays it as its planner
    rule_file.write_text(
        yaml.safe_dump({"version": 1, "plans": {"1": {"plan": "source:chain:2/block+lookup:2x3/nss"}}})
    )
    stamp_plan_file(rule_file, engine.fingerprints())
    engine.tuned_plan_files = [rule_file]
    res = engine.generate("w5 w6 w7 w5 w6 w7 w5 w6", max_new_tokens=8, temperature=1.0, seed=0)
    rule = engine.default_plan(1.0)
    assert isinstance(rule, SourceRule) and str(rule) == "source:chain:2/block+lookup:2x3/nss"
    assert res.stats.new_tokens >= 1 and res.stats.steps >= 1
    plan, why = choose_default_plan({"target": "v1:other", "draft": "v1:other"}, 1.0, [out])
    assert not isinstance(plan, SourceRule) and "another model pair" in why

    plans, info = resolve_plans(["adaptive", "best-static"], [0.0, 1.0], pair_file=out)  # a pair that ships it
    assert {k: str(p) for k, p in plans["adaptive"].items()} == {k: data["plans"][k]["plan"] for k in ("0", "1")}
    assert str(plans["best-static"]["1"]) == data["plans"]["1"]["best_static"]["plan"]
    assert info["pair_file"] == str(out) and info["runtime"] is None


def test_suggested_rules_parse_and_cover_every_lookup_kind():
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    kinds, depths = set(), set()
    for _ in range(30):
        trial = study.ask()
        greedy = trial.number % 2 == 0
        rule = parse_source_rule(suggest_rule(trial, greedy))
        study.tell(trial, 1.0)
        kinds.add(rule.lookup.source if rule.lookup.shape.paths == 1 else "trie")
        depths.add(rule.model.shape.depth)
        if greedy and rule.lookup.shape.paths > 1:
            assert rule.lookup.verifier == "greedy"
    assert kinds == {"lookup", "hybrid", "trie"}
    assert depths == {0, 1, 2, 3, 4}  # 0: plain decoding where the lookup finds nothing


def test_a_rule_of_lookup_or_plain_decoding_drafts_nothing_with_the_model(tiny_pair) -> None:
    """``source:chain:0/block+...``: the lookup's tree where it finds one, else a lone root (a step of plain
    decoding, the draft never run); greedy, it decodes as plain decoding does."""
    engine = load_engine(None, None, None, None)
    rule = parse_source_rule("source:chain:0/block+lookup:3x8/greedy?min_ngram=2&min_rate=0.2&decay=0.5")
    prompt = "w5 w6 w7 w5 w6 w7 w5 w6 w7 w5 w6"
    out = engine.generate(prompt, max_new_tokens=24, temperature=0.0, plan=rule, seed=0)
    plain = engine.generate(prompt, max_new_tokens=24, temperature=0.0, plan="autoregressive", seed=0)
    assert out.token_ids == plain.token_ids
    assert max(out.stats.tree_sizes) > 1 and 1 in out.stats.tree_sizes  # looked up, and lone roots elsewhere
    assert out.stats.draft_forwards <= 1  # the prefill's at most: the model drafts nothing


def test_a_pair_file_without_a_temperature_kind_is_one_line(tmp_path):
    f = tmp_path / "adaptive.yaml"
    f.write_text(yaml.safe_dump({"version": 1, "plans": {"0": {"plan": "source:chain:2/block"}}}))
    with pytest.raises(ValueError, match="no plan for temperature 1"):
        resolve_plans(["adaptive"], [1.0], pair_file=f)
    with pytest.raises(ValueError, match="records no best static plan"):
        resolve_plans(["best-static"], [0.0], pair_file=f)
    plans, _ = resolve_plans(["adaptive"], [0.0], pair_file=f)
    assert isinstance(plans["adaptive"]["0"], SourceRule)


def test_choose_plays_the_best_static_plan_where_no_rule_beat_it():
    rules = {"0": {"results": [{"plan": "source:chain:2/block", "speedup_vs_ar": 1.2, "block_efficiency": 1.7}]}}
    rules["1"] = {"results": [{"plan": "source:chain:2/block", "speedup_vs_ar": 1.0, "block_efficiency": 1.4}]}
    statics = {
        k: {"results": [{"plan": "chain:1/block", "speedup_vs_ar": 1.1, "block_efficiency": 1.3}]} for k in rules
    }
    out = choose(rules, statics)
    assert out["0"]["plan"] == "source:chain:2/block" and "best_rule" not in out["0"]
    assert out["1"]["plan"] == "chain:1/block" and out["1"]["speedup_vs_ar"] == 1.1
    assert out["1"]["best_rule"] == {"plan": "source:chain:2/block", "speedup_vs_ar": 1.0}
    assert out["1"]["best_static"]["plan"] == "chain:1/block"


@pytest.mark.slow
def test_a_learned_gate_is_trained_tuned_beside_the_rules_and_played_from_its_plan_file(prompt_files, tmp_path):
    from adaptive_spec.planner.gate import GatedSource

    (tmp_path / "pair").mkdir(exist_ok=True)
    gate = tmp_path / "pair" / "source_gate.json"
    train = ["selector", "gate", "--prompts", "chat.txt", "--prompts", "copy.txt", "--temperatures", "0,1"]
    train += ["--model-plan", "chain:2/block", "--lookup", "lookup:4/block", "--max-new-tokens", "16"]
    assert main([*train, "--explore", "0.5", "--data", "steps.jsonl", "--out-file", str(gate), "--no-progress"]) == 0
    assert json.loads(gate.read_text())["lookup_plan"] == "lookup:4/block"
    with pytest.raises(SystemExit, match="no gate data"):
        main(["selector", "gate", "--prompts", "chat.txt", "--skip-collect", "--data", "none.jsonl", "--no-progress"])

    out = tmp_path / "pair" / "adaptive.yaml"
    args = ["tune", "sources", "--prompts", "copy.txt", "--temperatures", "0", "--max-new-tokens", "8"]
    args += ["--trials", "5", "--storage", f"sqlite:///{tmp_path}/o.db", "--static", "chain:2/block"]
    assert main([*args, "--gate", str(gate), "--out-file", str(out), "--json", "out.json", "--no-progress"]) == 0
    rows = json.loads((tmp_path / "out.json").read_text())["rules"]["0"]["results"]
    tried = [r["plan"] for r in rows]
    assert tried[0] == KNOWN_RULES[0] and all(f"?gate={gate}&margin=" in p for p in tried[2:5])  # enqueued
    data = yaml.safe_load(out.read_text())
    best = max(rows, key=lambda r: r["speedup_vs_ar"])["plan"]
    if "gate=" in data["plans"]["0"]["plan"]:  # the gate won: named relative to the plan file beside it
        assert data["plans"]["0"]["plan"] == best.replace(str(gate), gate.name)
    # a plan file naming the gate relatively is played from anywhere (the gate is found beside it)
    entry = f"source:chain:2/block+lookup:4/block?gate={gate.name}&margin=0.9"
    out.write_text(yaml.safe_dump({"version": 1, "plans": {"0": {"plan": entry}}}))
    engine = load_engine(None, None, None, None)
    stamp_plan_file(out, engine.fingerprints())
    planner, why = choose_default_plan(engine.fingerprints(), 0.0, [out])
    assert isinstance(planner, GatedSource) and planner.margin == 0.9 and "adaptive.yaml" in why
    plans, _ = resolve_plans(["adaptive"], [0.0], pair_file=out)
    assert isinstance(plans["adaptive"]["0"], GatedSource)
    prompt = "w5 w6 w7 w5 w6 w7 w5 w6"
    ar = engine.generate(prompt, max_new_tokens=8, temperature=0, plan=None)
    assert engine.generate(prompt, max_new_tokens=8, temperature=0, plan=planner).token_ids == ar.token_ids


@pytest.mark.slow
def test_two_gates_without_rules_each_tried_at_the_enqueued_margins(prompt_files, tmp_path):
    """``--gate`` twice (one without draft features) and ``--no-rules``: only gate trials, both gates tried."""
    (tmp_path / "pair").mkdir(exist_ok=True)
    gates = [tmp_path / "pair" / "gate_root.json", tmp_path / "pair" / "gate_free.json"]
    train = ["selector", "gate", "--prompts", "chat.txt", "--prompts", "copy.txt", "--temperatures", "0,1"]
    train += ["--explore", "0.5"]
    train += ["--model-plan", "chain:2/block", "--lookup", "lookup:4/block", "--max-new-tokens", "16", "--no-progress"]
    assert main([*train, "--data", "root.jsonl", "--out-file", str(gates[0])]) == 0
    assert main([*train, "--data", "free.jsonl", "--out-file", str(gates[1]), "--no-draft-features"]) == 0
    assert "draft_top1" not in json.loads(gates[1].read_text())["features"]
    with pytest.raises(SystemExit, match="collected with draft root features"):
        main([*train, "--data", "root.jsonl", "--skip-collect", "--out-file", "x.json", "--no-draft-features"])
    out = tmp_path / "pair" / "adaptive.yaml"
    args = ["tune", "sources", "--prompts", "copy.txt", "--temperatures", "0", "--max-new-tokens", "8", "--no-rules"]
    args += ["--trials", "6", "--storage", f"sqlite:///{tmp_path}/o.db", "--static", "chain:2/block"]
    args += ["--gate", str(gates[0]), "--gate", str(gates[1]), "--out-file", str(out), "--json", "out.json"]
    with pytest.raises(SystemExit, match="--no-rules leaves nothing"):
        main(["tune", "sources", "--prompts", "copy.txt", "--no-rules", "--no-progress"])
    assert main([*args, "--no-progress"]) == 0
    tried = [r["plan"] for r in json.loads((tmp_path / "out.json").read_text())["rules"]["0"]["results"]]
    assert len(tried) == 6 and all("?gate=" in p for p in tried)  # no hand-written rule
    assert sum(f"gate={gates[0]}&" in p for p in tried) == 3 and sum(f"gate={gates[1]}&" in p for p in tried) == 3
    plan = yaml.safe_load(out.read_text())["plans"]["0"]["plan"]
    assert "gate=gate_root.json&" in plan or "gate=gate_free.json&" in plan or "gate=" not in plan


def test_the_plans_a_tuning_replaces_are_tried_first(tmp_path) -> None:
    from types import SimpleNamespace

    from adaptive_spec.tuning.sources import _known_params, incumbent_trial, incumbents

    assert incumbents(tmp_path / "none.yaml") == {}
    rule = "source:chain:1/block+lookup:3x11/greedy?min_ngram=3&min_rate=0.400&decay=0.743"
    gate = "source:chain:1/block+lookup:3x8/nss?gate=source_gate.json&margin=1.250"
    f = tmp_path / "adaptive.yaml"
    f.write_text(yaml.safe_dump({"version": 1, "plans": {"0": {"plan": rule}, "1": {"plan": "chain:1/block"}}}))
    assert incumbents(f) == {"0": rule, "1": "chain:1/block"}
    assert incumbent_trial(rule) == _known_params(rule)
    assert str(parse_source_rule(suggest_rule(optuna.trial.FixedTrial(_known_params(rule)), True))) == str(
        parse_source_rule(rule)
    )  # the enqueued trial replays the rule itself
    gates = [
        SimpleNamespace(gate=SimpleNamespace(path="/elsewhere/other.json")),
        SimpleNamespace(gate=SimpleNamespace(path="/pair/source_gate.json")),
    ]
    assert incumbent_trial(rule, gates) == _known_params(rule) | {"kind": "rule"}
    assert incumbent_trial(rule, gates, rules=False) is None  # only gates searched
    assert incumbent_trial(gate, gates) == {"kind": "gate2", "margin2": 1.25}  # matched by file name
    assert incumbent_trial(gate, gates[:1]) is None and incumbent_trial("chain:1/block") is None
    f.write_text("plans: [unclosed")
    with pytest.raises(ValueError, match="is not valid YAML"):
        incumbents(f)


def test_tune_sources_measures_the_plans_it_replaces(prompt_files, tmp_path, capsys) -> None:
    out = tmp_path / "adaptive.yaml"
    rule = "source:chain:1/block+lookup:4/block?min_ngram=2&min_rate=0.250&decay=0.500"
    out.write_text(yaml.safe_dump({"version": 1, "plans": {"0": {"plan": rule}, "1": {"plan": "lookup:3/block"}}}))
    args = ["tune", "sources", "--prompts", "copy.txt", "--temperatures", "0,1", "--max-new-tokens", "6"]
    args += ["--trials", "1", "--storage", f"sqlite:///{tmp_path}/o.db", "--static", "chain:2/block"]
    assert main([*args, "--out-file", str(out), "--json", "out.json", "--no-progress"]) == 0
    assert f"the plans of {out} are tried too: T=0 {rule}, T=1 lookup:3/block" in capsys.readouterr().out
    report = json.loads((tmp_path / "out.json").read_text())
    assert [r["plan"] for r in report["rules"]["0"]["results"]] == [str(parse_source_rule(rule))]
    assert {r["plan"] for r in report["static"]["runs"]["1"]["results"]} == {"chain:2/block", "lookup:3/block"}
    out.write_text("plans: [unclosed")
    with pytest.raises(SystemExit, match="is not valid YAML"):
        main([*args, "--out-file", str(out), "--no-progress"])


def test_plans_tuned_on_a_gpu_come_first_there_and_nowhere_else(tmp_path) -> None:
    """A plan file's ``devices: {cuda: {plans}}`` (``tune sources --device cuda``) is read first on that kind of
    device, its ``plans`` (tuned on a CPU) on a CPU and for the temperatures the device's own section lacks; the
    writer puts a GPU's plans in its section and leaves the others; a tuning on the GPU tries its own plans first."""
    from adaptive_spec.planner.presets import plan_sections, write_plan_file
    from adaptive_spec.tuning.sources import incumbents

    cpu_rule = "source:chain:1/block+lookup:3x11/greedy?min_ngram=3&min_rate=0.400&decay=0.743"
    gpu_rule = "source:chain:2/block+lookup:3x16/greedy?min_ngram=2&min_rate=0.300&decay=0.500"
    f = tmp_path / "adaptive.yaml"
    write_plan_file({"0": {"plan": cpu_rule}, "1": {"plan": "chain:2/block"}}, f, "# test\n")
    write_plan_file({"0": {"plan": gpu_rule}}, f, "# test\n", device="cuda")
    data = yaml.safe_load(f.read_text())
    assert data["plans"]["0"]["plan"] == cpu_rule and data["devices"]["cuda"]["plans"]["0"]["plan"] == gpu_rule
    assert plan_sections(data, "cpu") == [data["plans"]] and plan_sections(data, None) == [data["plans"]]
    assert plan_sections(data, "cuda") == [data["devices"]["cuda"]["plans"], data["plans"]]
    assert plan_sections(data, "mps") == [data["plans"]]
    assert incumbents(f, "cuda") == {"0": gpu_rule, "1": "chain:2/block"} and incumbents(f) == {"0": cpu_rule} | {
        "1": "chain:2/block"
    }

    pair = {"target": "v1:t", "draft": "v1:d"}
    stamp_plan_file(f, pair)
    assert yaml.safe_load(f.read_text())["devices"]["cuda"]["plans"]["0"]["plan"] == gpu_rule  # the stamp keeps it
    plan, why = choose_default_plan(pair, 0.0, [f], device="cuda")
    assert str(plan) == str(parse_source_rule(gpu_rule)) and "on cuda" in why
    plan, why = choose_default_plan(pair, 0.0, [f], device="cpu")
    assert str(plan) == str(parse_source_rule(cpu_rule)) and "on cuda" not in why
    plan, why = choose_default_plan(pair, 1.0, [f], device="cuda")  # no T > 0 plan tuned on the GPU: the CPU's
    assert str(plan) == "chain:2/block" and "on cuda" not in why

    plans, info = resolve_plans(["adaptive"], [0.0, 1.0], pair_file=f, device="cuda")
    assert [str(p) for p in plans["adaptive"].values()] == [str(parse_source_rule(gpu_rule)), "chain:2/block"]
    assert info["adaptive"]["tuned_on"] == {"0": "cuda", "1": "cpu"}  # said in bench e2e's JSON
    plans, info = resolve_plans(["adaptive"], [0.0], pair_file=f, device="cpu")
    assert str(plans["adaptive"]["0"]) == str(parse_source_rule(cpu_rule)) and info["adaptive"]["tuned_on"] == {
        "0": "cpu"
    }


def test_a_device_this_machine_lacks_is_one_line(prompt_files, capsys) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(SystemExit, match=r"device cuda: this torch was built without CUDA .*use the cpu"):
        main(["tune", "sources", "--prompts", "copy.txt", "--device", "cuda", "--no-progress"])
    with pytest.raises(SystemExit, match=r"device 'gpu' is not a device"):
        main(["tune", "sources", "--prompts", "copy.txt", "--device", "gpu", "--no-progress"])
    with pytest.raises(SystemExit, match=r"device 'tpu0' is not a device"):
        main(["bench", "overhead", "--device", "tpu0", "--plans", "chain:2/block"])
    from adaptive_spec import SpecEngine

    with pytest.raises(ValueError, match=r"device cuda:1: this torch was built without CUDA"):
        SpecEngine.from_pretrained(None, None, device="cuda:1")  # before any model loads


def test_in_draft_plans_tuned_on_a_gpu_are_read_first_there(tmp_path) -> None:
    """``tune policies --device cuda`` writes the in-draft plans to the GPU's section of ``in-draft.yaml``, which
    ``bench e2e --plans in-draft`` reads first on that kind of device (and never on a CPU)."""
    from adaptive_spec.planner.presets import load_in_draft, write_in_draft

    f = tmp_path / "in-draft.yaml"
    write_in_draft({"0": {"plan": "conf-chain:4:0.7/block"}, "1": {"plan": "chain:2/block"}}, f)
    write_in_draft({"0": {"plan": "cum-chain:8:0.3/block"}}, f, device="cuda")
    assert str(load_in_draft(0.0, f)) == "conf-chain:4:0.7/block"
    assert str(load_in_draft(0.0, f, "cuda")) == "cum-chain:8:0.3/block"
    assert str(load_in_draft(1.0, f, "cuda")) == "chain:2/block"  # none tuned on the GPU at T > 0: the CPU's
    plans, _ = resolve_plans(["in-draft"], [0.0], in_draft_file=f, device="cuda")
    assert str(plans["in-draft"]["0"]) == "cum-chain:8:0.3/block"
    f.write_text(yaml.safe_dump({"version": 1, "plans": {"1": {"plan": "chain:2/block"}}}))
    with pytest.raises(LookupError, match=r"no in-draft plan for temperature 0 \(tuned: 1\)"):
        load_in_draft(0.0, f, "cuda")
