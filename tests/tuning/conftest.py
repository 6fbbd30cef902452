"""Fixtures of the tuning tests: a tiny stand-in for the built-in pair, a label table, PostgreSQL."""

from __future__ import annotations

import json

import pytest

import adaptive_spec.zoo as zoo
from tests.engine._tiny import perturbed, tiny_model, tiny_tokenizer
from tests.tuning._labels import write_synthetic_labels
from tests.tuning._postgres import postgres_url  # noqa: F401  (a fixture)


@pytest.fixture
def tiny_pair(tmp_path, monkeypatch):
    """The built-in pair replaced by a tiny random Llama pair with two prompts."""
    root = tmp_path / "pair"
    tok = tiny_tokenizer(48)
    target = tiny_model("llama", vocab=48, eos=None, seed=3)
    draft = perturbed(target, scale=0.2, seed=4)
    for name, model in (("target", target), ("draft", draft)):
        model.save_pretrained(root / name)
        tok.save_pretrained(root / name)
    (root / "prompts.jsonl").write_text("\n".join(json.dumps({"prompt": p}) for p in ["w5 w6 w7", "w9 w3"]))
    (root / "build_info.json").write_text(json.dumps({"seed": 0, "note": "tiny test pair"}))
    monkeypatch.setattr(zoo, "default_pair_path", lambda: root)
    return root


@pytest.fixture(scope="session")
def labels_dir(tmp_path_factory):
    """A synthetic label table covering the whole plan space at temperatures 0 and 1."""
    return write_synthetic_labels(tmp_path_factory.mktemp("labels"))
