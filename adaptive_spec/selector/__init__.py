"""The learned plan selector: model, training, ONNX export and runtime.

Its feature schema is :mod:`adaptive_spec.formats.features`. Everything here is imported on use:
:class:`AdaptivePlanner` / :class:`SelectorRuntime` (onnxruntime, no torch
training code) from :mod:`~adaptive_spec.selector.runtime`; the network in
:mod:`~adaptive_spec.selector.model`; Lightning training in :mod:`~adaptive_spec.selector.lit`
and :mod:`~adaptive_spec.selector.train`; ONNX export in :mod:`~adaptive_spec.selector.export`.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "AdaptivePlanner": "adaptive_spec.selector.runtime",
    "SelectorRuntime": "adaptive_spec.selector.runtime",
    "SelectorLoadError": "adaptive_spec.selector.runtime",
    "SelectorNet": "adaptive_spec.selector.model",
}

__all__ = ["AdaptivePlanner", "SelectorLoadError", "SelectorNet", "SelectorRuntime"]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
