"""The learned plan selector: feature schema, model, training, ONNX export and runtime.

Importing this package loads only the feature schema (the engine imports it). The rest is
imported on use: :class:`AdaptivePlanner` / :class:`SelectorRuntime` (onnxruntime, no torch
training code) from :mod:`~adaptive_spec.selector.runtime`; the network in
:mod:`~adaptive_spec.selector.model`; Lightning training in :mod:`~adaptive_spec.selector.lit`
and :mod:`~adaptive_spec.selector.train`; ONNX export in :mod:`~adaptive_spec.selector.export`.
"""

from __future__ import annotations

import importlib
from typing import Any

from adaptive_spec.selector.features import SCHEMA, FeatureSchema

_LAZY = {
    "AdaptivePlanner": "adaptive_spec.selector.runtime",
    "SelectorRuntime": "adaptive_spec.selector.runtime",
    "SelectorLoadError": "adaptive_spec.selector.runtime",
    "SelectorNet": "adaptive_spec.selector.model",
}

__all__ = ["SCHEMA", "AdaptivePlanner", "FeatureSchema", "SelectorLoadError", "SelectorNet", "SelectorRuntime"]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
