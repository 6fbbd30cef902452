"""Patching the drafters in tests: :mod:`adaptive_spec.engine.drafting` is a package of modules, a family each, that
import one another's functions by name, so a test that swaps one in must swap it in every module that holds it."""

from __future__ import annotations

import importlib
import pkgutil
from types import ModuleType
from typing import Any

import adaptive_spec.engine.drafting as package


def _modules() -> list[ModuleType]:
    names = [f"{package.__name__}.{m.name}" for m in pkgutil.iter_modules(package.__path__)]
    return [package, *(importlib.import_module(n) for n in names)]


def drafting_attr(name: str) -> Any:
    """The drafting package's ``name`` (a function, class or module global of one of its modules)."""
    held = {id(getattr(m, name)): getattr(m, name) for m in _modules() if hasattr(m, name)}
    if len(held) != 1:
        raise AssertionError(f"{name}: {len(held)} different objects in the drafting package (expected one)")
    return next(iter(held.values()))


def patch_drafting(monkeypatch: Any, name: str, value: Any) -> list[str]:
    """``monkeypatch.setattr`` of ``name`` in every module of the package that holds it (the one that defines it and
    those that import it), as a patch of the one module did before the split; the modules patched.
    """
    drafting_attr(name)  # one object everywhere, so that every caller saw the same one before
    patched = []
    for m in _modules():
        if hasattr(m, name):
            monkeypatch.setattr(m, name, value)
            patched.append(m.__name__)
    return patched
