"""Run a command's ``run(args)`` from Python with typed keyword options, not an argv of strings.

A command module exposes ``add_arguments(parser)`` and ``run(args) -> int``. :func:`call_command`
builds the ``argparse.Namespace`` that ``run`` expects from the parser's defaults and the given
keyword options (named by their ``dest``: ``max_new_tokens=8``, ``out=Path(...)``), checks that
every option exists and every required one is given, and runs it in this process.
"""

from __future__ import annotations

import argparse
import importlib
from typing import Any

__all__ = ["call_command", "command_namespace"]


def command_namespace(module: str, **options: Any) -> argparse.Namespace:
    """The ``Namespace`` that ``module.run`` expects: the parser's defaults, overridden by ``options``.

    Raises:
        TypeError: an option the command does not have, or a required one left out.
    """
    parser = argparse.ArgumentParser(prog=module)
    importlib.import_module(module).add_arguments(parser)
    values: dict[str, Any] = {}
    required = []
    for action in parser._actions:
        if action.dest == argparse.SUPPRESS or isinstance(action, argparse._HelpAction):
            continue
        default = action.default
        if default == argparse.SUPPRESS:
            default = None
        if isinstance(default, str) and action.type is not None and callable(action.type):
            default = action.type(default)  # as argparse converts a string default
        values.setdefault(action.dest, default)
        if action.required:
            required.append(action.dest)
    unknown = sorted(set(options) - set(values))
    if unknown:
        raise TypeError(f"{module} has no option {', '.join(unknown)}")
    missing = [dest for dest in required if dest not in options]
    if missing:
        raise TypeError(f"{module} needs {', '.join(missing)}")
    values.update(options)
    return argparse.Namespace(**values)


def call_command(module: str, **options: Any) -> int:
    """Run ``module.run`` with :func:`command_namespace`'s arguments; return its exit status."""
    args = command_namespace(module, **options)
    return int(importlib.import_module(module).run(args) or 0)
