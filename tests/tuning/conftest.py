"""Fixtures of the tuning tests: a tiny stand-in for the built-in pair, a label table, PostgreSQL."""

from __future__ import annotations

import pytest

import adaptive_spec.files as files
from tests.helpers.postgres import postgres_url  # noqa: F401  (a fixture)
from tests.helpers.tiny import save_tiny_pair
from tests.helpers.tuning_labels import write_synthetic_labels


@pytest.fixture
def tiny_pair(tmp_path, monkeypatch):
    """The built-in pair replaced by a tiny random Llama pair with two prompts."""
    root = save_tiny_pair(tmp_path / "pair", eos=None)
    monkeypatch.setattr(files, "default_pair_path", lambda: root)
    return root


@pytest.fixture(scope="session")
def labels_dir(tmp_path_factory):
    """A synthetic label table covering the whole plan space at temperatures 0 and 1."""
    return write_synthetic_labels(tmp_path_factory.mktemp("labels"))
