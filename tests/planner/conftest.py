"""Fixtures for the planner tests: a tiny draft/target pair standing in for the built-in one."""

from __future__ import annotations

from pathlib import Path

import pytest

import adaptive_spec.files as files
from tests.helpers.tiny import save_tiny_pair as _save


def save_tiny_pair(root: Path) -> Path:
    """Save a tiny Llama pair (V=48, 256 positions) with four prompts under ``root``."""
    return _save(root, prompts=["w5 w6 w7 w8", "w9 w3 w4", "w10 w11", "w12 w13 w14"])


@pytest.fixture(scope="module")
def module_tiny_pair(tmp_path_factory):
    """The tiny pair as the 'built-in' pair for a whole module."""
    root = save_tiny_pair(tmp_path_factory.mktemp("pair"))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(files, "default_pair_path", lambda: root)
        yield root
