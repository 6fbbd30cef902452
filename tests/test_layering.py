"""The package layering: every module imports only packages below its own, and the engine never
pulls in the training or tuning stack.

A small AST walk over ``adaptive_spec`` that sees every import, lazy ones inside functions and
``TYPE_CHECKING`` blocks included. Contracts (formats, schemas, plan files, I/O helpers) sit at the
bottom, so the packages that produce or consume them can sit above.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "adaptive_spec"

# Bottom to top. A module may import its own package and any package of a lower layer; packages
# of one layer are independent of each other.
LAYERS: list[tuple[str, ...]] = [
    ("files", "temperatures", "rng", "options", "extras"),  # stdlib only: files, temperatures, RNG, options, extras
    ("formats",),  # feature schema, feature log, label table
    ("trees",),
    ("verifiers",),
    ("analysis",),  # offline: exact enumeration, expected block efficiency, LP limit
    ("planner",),  # plans, action space, latency model, default and tuned plans
    ("engine",),
    ("zoo", "hf"),  # the built-in pair and its training; transformers' custom_generate entry
    ("records", "selector"),  # collect/label; the learned selector
    ("bench",),
    ("tuning",),
    ("cli",),  # the command line: one module per verb, above every library package
    ("__main__",),
]
# Known upward imports, each with the change that removes it; a test fails once one is gone, so
# the entry goes with it.
ALLOWED: dict[tuple[str, str], str] = {}
# The root ``adaptive_spec/__init__.py`` is the public facade: it re-exports names from several
# layers, all lazily, and is imported by nobody inside the package.
FACADE = "adaptive_spec"

ENGINE_NEVER_IMPORTS = ("lightning", "optuna", "sklearn")


def _module_name(path: Path, pkg: Path) -> str:
    parts = path.relative_to(pkg.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules(pkg: Path) -> dict[str, Path]:
    return {_module_name(p, pkg): p for p in sorted(pkg.rglob("*.py"))}


def _imports(path: Path, module: str, known: set[str]) -> Iterator[tuple[str, int]]:
    """Every module ``path`` imports, as absolute names with line numbers (relative imports resolved)."""
    is_package = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".") if is_package else module.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                target = ".".join([*base, *([node.module] if node.module else [])])
            else:
                target = node.module or ""
            for alias in node.names:  # ``from adaptive_spec.x import y`` may import module ``y``
                sub = f"{target}.{alias.name}"
                yield (sub if sub in known else target), node.lineno


def _package_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else FACADE


def _layer(package: str) -> int:
    for i, names in enumerate(LAYERS):
        if package in names:
            return i
    return len(LAYERS)  # the facade, or a package missing from LAYERS (reported by its own test)


def layering_violations(pkg: Path = PKG, allowed: frozenset[tuple[str, str]] = frozenset(ALLOWED)) -> list[str]:
    """``"module:line imports target (layer a -> layer b)"`` for every import that is not downward."""
    modules = _modules(pkg)
    known = set(modules)
    out = []
    for module, path in modules.items():
        src = _package_of(module)
        for target, line in _imports(path, module, known):
            if not (target == FACADE or target.startswith(FACADE + ".")):
                continue
            dst = _package_of(target)
            if src == FACADE or dst == src or (module, target) in allowed:
                continue
            if dst == FACADE or _layer(dst) >= _layer(src):
                where = f"{src}, layer {_layer(src)} -> {dst}, layer {_layer(dst)}"
                out.append(f"{module}:{line} imports {target} ({where})")
    return out


def external_imports_reachable_from(roots: list[str], pkg: Path = PKG) -> dict[str, set[str]]:
    """Top-level third-party/stdlib names imported by ``roots`` and every package module they reach.

    Reaching a module also runs its parent packages' ``__init__``; lazy imports count as reached.
    Returns ``{external top-level name: {importing modules}}``.
    """
    modules = _modules(pkg)
    known = set(modules)
    seen: set[str] = set()
    todo = list(roots)
    external: dict[str, set[str]] = {}
    while todo:
        module = todo.pop()
        if module in seen or module not in modules:
            continue
        seen.add(module)
        parts = module.split(".")
        todo += [".".join(parts[:i]) for i in range(1, len(parts))]  # parent packages run first
        for target, _ in _imports(modules[module], module, known):
            if target == FACADE or target.startswith(FACADE + "."):
                # the nearest known module (``from adaptive_spec.x import name`` names a module's attribute)
                while target not in known and "." in target:
                    target = target.rsplit(".", 1)[0]
                todo.append(target)
            else:
                external.setdefault(target.split(".")[0], set()).add(module)
    return external


def test_every_package_has_a_layer():
    packages = {_package_of(m) for m in _modules(PKG)} - {FACADE}
    assert packages <= {p for names in LAYERS for p in names}, sorted(packages - {p for n in LAYERS for p in n})


def test_no_module_imports_a_package_above_it():
    assert layering_violations() == []


def test_every_allowed_upward_import_still_exists():
    found = layering_violations(allowed=frozenset())
    for module, target in ALLOWED:
        assert any(v.startswith(f"{module}:") and f" imports {target} " in v for v in found), (module, target)


def test_the_engine_never_imports_the_training_or_tuning_stack():
    roots = [m for m in _modules(PKG) if m == "adaptive_spec.engine" or m.startswith("adaptive_spec.engine.")]
    external = external_imports_reachable_from(roots)
    assert "torch" in external and "transformers" in external  # the walk does reach the engine's imports
    bad = {name: sorted(external[name]) for name in ENGINE_NEVER_IMPORTS if name in external}
    assert not bad, bad


def _copy_package(tmp_path: Path) -> Path:
    import shutil

    dest = tmp_path / "adaptive_spec"
    shutil.copytree(PKG, dest, ignore=shutil.ignore_patterns("__pycache__", "default"))
    return dest


@pytest.mark.parametrize(
    ("module", "line"),
    [
        ("engine/engine.py", "from adaptive_spec.selector.runtime import AdaptivePlanner\n"),  # top level
        ("formats/features.py", "def f():\n    from adaptive_spec import planner\n    return planner\n"),  # lazy
        ("records/label.py", "def f():\n    from ..selector import runtime\n    return runtime\n"),  # sibling, relative
    ],
)
def test_the_check_catches_an_upward_import(tmp_path, module, line):
    pkg = _copy_package(tmp_path)
    path = pkg / module
    path.write_text(path.read_text(encoding="utf-8") + "\n\n" + line, encoding="utf-8")
    found = layering_violations(pkg)
    assert len(found) == 1 and found[0].startswith(_module_name(path, pkg)), found


def test_the_check_catches_lightning_reached_from_the_engine(tmp_path):
    pkg = _copy_package(tmp_path)
    path = pkg / "planner" / "latency.py"  # reached by the engine through the planner
    path.write_text(path.read_text(encoding="utf-8") + "\n\ndef f():\n    import lightning\n", encoding="utf-8")
    roots = [m for m in _modules(pkg) if m.startswith("adaptive_spec.engine")]
    assert "lightning" in external_imports_reachable_from(roots, pkg)


def test_importing_the_engine_loads_none_of_them():
    import subprocess
    import sys

    code = (
        "import importlib, pkgutil, sys, adaptive_spec.engine as e\n"
        "for m in pkgutil.iter_modules(e.__path__):\n"
        "    importlib.import_module(f'adaptive_spec.engine.{m.name}')\n"
        f"print([m for m in {ENGINE_NEVER_IMPORTS!r} if m in sys.modules])\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=PKG.parent)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.strip().splitlines()[-1] == "[]"
