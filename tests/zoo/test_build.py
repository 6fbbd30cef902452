"""A seconds-long build of a tiny pair on a synthetic corpus: files, loading, determinism of the data side."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from adaptive_spec.cli import build_parser
from adaptive_spec.files import read_prompts
from adaptive_spec.zoo import build_pair, load_pair
from adaptive_spec.zoo.config import ZooConfig, load_config
from adaptive_spec.zoo.corpus import extract_prompts, list_sources, split_corpus, train_tokenizer

REPO = Path(__file__).resolve().parents[2]
TINY_YAML = REPO / "adaptive_spec" / "configs" / "zoo" / "tiny.yaml"


def _write_corpus(root: Path, n_files: int = 8) -> Path:
    """``n_files`` small modules of functions with docstrings, plus files that must be skipped."""
    root.mkdir()
    for i in range(n_files):
        body = "".join(
            textwrap.dedent(f'''
            def function_{i}_{j}(value, scale={j}):
                """Return value number {j} of module {i}, multiplied by the given scale factor."""
                total = 0
                for k in range(value):
                    total += k * scale
                return total
            ''')
            for j in range(6)
        )
        (root / f"mod_{i}.py").write_text(f'"""Module {i}."""\n' + body)
    (root / "test").mkdir()
    (root / "test" / "test_skipped.py").write_text("assert False\n")
    (root / "site-packages").mkdir()
    (root / "site-packages" / "skipped.py").write_text("x = 1\n")
    return root


@pytest.fixture(scope="module")
def tiny_build(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("zoo")
    corpus = _write_corpus(tmp / "corpus")
    out = tmp / "pair"
    info = build_pair(out, corpus=corpus, minutes=0.5, seed=3, config=load_config(TINY_YAML), progress=False)
    return out, info, corpus


def test_tiny_build_writes_a_loadable_pair(tiny_build):
    out, info, _ = tiny_build
    for name in ("target", "draft"):
        assert (out / name / "model.safetensors").is_file()
        assert (out / name / "tokenizer.json").is_file()
    target = AutoModelForCausalLM.from_pretrained(out / "target", local_files_only=True)
    draft = AutoModelForCausalLM.from_pretrained(out / "draft", local_files_only=True)
    tokenizer = AutoTokenizer.from_pretrained(out / "draft", local_files_only=True)
    assert target.config.model_type == draft.config.model_type == "llama"
    assert target.config.vocab_size == draft.config.vocab_size == len(tokenizer) == info["vocab_size"]
    assert target.dtype == torch.float16  # saved as ZooConfig.save_dtype
    text = "def f(x):\n    return x  # é\n"
    assert tokenizer.decode(tokenizer(text)["input_ids"]) == text  # byte-level, nothing prepended
    assert (out / "target" / "tokenizer.json").read_text() == (out / "draft" / "tokenizer.json").read_text()

    loaded_target, loaded_draft, loaded_tok = load_pair(out)
    assert loaded_target.dtype == torch.float32 and not loaded_target.training
    ids = loaded_tok("def function_0_1(", return_tensors="pt")["input_ids"]
    for model in (loaded_target, loaded_draft):
        generated = model.generate(ids, max_new_tokens=4, do_sample=False)
        assert generated.shape == (1, ids.shape[1] + 4)


def test_tiny_build_info_and_prompts(tiny_build):
    out, info, corpus = tiny_build
    on_disk = json.loads((out / "build_info.json").read_text())
    assert on_disk == json.loads(json.dumps(info))
    assert on_disk["seed"] == 3 and on_disk["corpus_files"] == {"train": 6, "heldout": 2}
    assert on_disk["training"]["target"]["steps"] == 8  # max_steps of tiny.yaml, well within 0.5 minutes
    assert 0 < on_disk["acceptance"] <= 1 and 0 <= on_disk["greedy_agreement"] <= 1
    assert on_disk["latency_ms"]["ratio"] > 0 and on_disk["params"]["target"] > on_disk["params"]["draft"]
    assert ZooConfig.from_dict(on_disk["config"]) == load_config(TINY_YAML)  # the resolved config round-trips
    prompts = read_prompts(out)
    assert 1 <= len(prompts) <= 4
    heldout = {(corpus / p).read_text() for p in on_disk["heldout_files"]}
    for prompt in prompts:  # every prompt comes from a held-out file
        assert prompt.startswith("def ") and any(prompt.splitlines()[0] in src for src in heldout)


def test_split_tokenizer_and_prompts_are_seeded(tmp_path):
    corpus = _write_corpus(tmp_path / "corpus")
    assert [p.name for p in list_sources(corpus)] == [f"mod_{i}.py" for i in range(8)]
    a, b, c = (split_corpus(corpus, 0.25, seed) for seed in (0, 0, 1))
    assert a == b and a.heldout != c.heldout and not set(a.train) & set(a.heldout)
    texts = [p.read_text() for p in a.train]
    assert train_tokenizer(texts, 300).get_vocab() == train_tokenizer(texts, 300).get_vocab()
    assert extract_prompts(a.heldout, 3, 20, 300, seed=5) == extract_prompts(a.heldout, 3, 20, 300, seed=5)


def test_cli_table_has_zoo_build():
    args = build_parser().parse_args(["zoo", "build", "--minutes", "2", "--seed", "4", "--out", "x"])
    assert (args.minutes, args.seed, args.out) == (2.0, 4, Path("x"))


def test_config_overrides_are_checked(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"vocab_sise": 300}))
    with pytest.raises(ValueError, match="vocab_sise"):
        load_config(bad)
    with pytest.raises(ValueError, match="target_share"):
        ZooConfig(target_share=1.5)
