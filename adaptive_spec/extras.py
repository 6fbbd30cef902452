"""The optional dependencies: which extra installs which module, and how to say one is missing.

``pip install adaptive-spec`` installs the engine alone; the training, tuning, logging and plotting
stacks are extras (see ``pyproject.toml``). :data:`EXTRA_OF` maps their top-level modules to the
extra that installs them; :func:`missing_extra_message` turns a ``ModuleNotFoundError`` into the
one line the command line prints; :func:`have` lets a command skip an optional part (plots) when
its extra is absent. Standard library only, so any module may import it.
"""

from __future__ import annotations

import importlib.util
import sys

__all__ = ["EXTRA_OF", "have", "install_hint", "missing_extra_message", "skipped"]

# Top-level module of an optional dependency -> the extra that installs it (see pyproject.toml).
EXTRA_OF: dict[str, str] = {
    "lightning": "train",
    "lightning_fabric": "train",
    "lightning_utilities": "train",
    "pytorch_lightning": "train",
    "torchmetrics": "train",
    "jsonargparse": "train",
    "onnx": "train",
    "onnxscript": "train",
    "onnx_ir": "train",
    "sklearn": "train",
    "optuna": "tune",
    "optuna_integration": "tune",
    "sqlalchemy": "tune",
    "alembic": "tune",
    "matplotlib": "report",
    "pyarrow": "log",
    "psycopg": "postgres",
    "psycopg2": "postgres",
}
PROG = "adaptive-spec"


def install_hint(extra: str) -> str:
    """``pip install 'adaptive-spec[EXTRA]'``."""
    return f"pip install '{PROG}[{extra}]'"


def missing_extra_message(err: ImportError, verb: str) -> str | None:
    """One line naming the extra to install when ``err`` is a missing optional dependency, else None."""
    name = (getattr(err, "name", None) or "").split(".")[0]
    extra = EXTRA_OF.get(name)
    if extra is None:
        return None
    return f"{PROG} {verb} needs the [{extra}] extra ({name} is not installed): {install_hint(extra)}"


def have(module: str) -> bool:
    """Whether ``module`` (an optional dependency) can be imported."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def skipped(module: str, what: str) -> None:
    """Print on stderr that ``what`` was skipped because ``module``'s extra is not installed."""
    extra = EXTRA_OF.get(module.split(".")[0], "all")
    print(f"note: {what} skipped ({module} is not installed): {install_hint(extra)}", file=sys.stderr)
