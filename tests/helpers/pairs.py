"""The tiny pair as the built-in pair (a fixture for the demo and the pipeline tests)."""

from __future__ import annotations

import pytest

import adaptive_spec.files as files
from tests.helpers.tiny import save_tiny_pair


@pytest.fixture
def tiny_pair(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no data/selector, data/profile or configs/plans from the checkout
    root = save_tiny_pair(tmp_path / "pair", eos=1)
    monkeypatch.setattr(files, "default_pair_path", lambda: root)
    return root
