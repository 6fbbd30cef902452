"""Fixtures for the planner tests: a tiny draft/target pair standing in for the built-in one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import adaptive_spec.zoo as zoo
from tests.engine._tiny import perturbed, tiny_model, tiny_tokenizer


def save_tiny_pair(root: Path) -> Path:
    """Save a tiny Llama pair (V=48, 256 positions) with four prompts under ``root``."""
    tok = tiny_tokenizer(48)
    target = tiny_model("llama", vocab=48, eos=None, seed=3)
    draft = perturbed(target, scale=0.2, seed=4)
    for name, model in (("target", target), ("draft", draft)):
        model.save_pretrained(root / name)
        tok.save_pretrained(root / name)
    prompts = ["w5 w6 w7 w8", "w9 w3 w4", "w10 w11", "w12 w13 w14"]
    (root / "prompts.jsonl").write_text("\n".join(json.dumps({"prompt": p}) for p in prompts))
    (root / "build_info.json").write_text(json.dumps({"seed": 0, "note": "tiny test pair"}))
    return root


@pytest.fixture(scope="module")
def module_tiny_pair(tmp_path_factory):
    """The tiny pair as the 'built-in' pair for a whole module."""
    root = save_tiny_pair(tmp_path_factory.mktemp("pair"))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(zoo, "default_pair_path", lambda: root)
        yield root
