"""The acceptance model at run time: an ONNX network run with onnxruntime, behind ``learned-chain``.

The model predicts, for each drafted node, from draft-side features only
(:data:`~adaptive_spec.trees.policy.ACCEPTANCE_FEATURES`), two probabilities: that the verifier
accepts the node given its parent was accepted, and that a child drawn from the node's row
would be accepted. :class:`~adaptive_spec.trees.policy.LearnedChain` turns them into a
stop/continue decision per draft level. The model is trained by
``adaptive-spec selector acceptance`` (:mod:`adaptive_spec.selector.acceptance`) and found
next to the built-in pair (``acceptance.onnx``) or in ``data/acceptance/``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from operator import mul
from pathlib import Path
from typing import Any

import numpy as np

from adaptive_spec.trees.policy import ACCEPTANCE_FEATURES

__all__ = ["ACCEPTANCE_FILE", "FORMAT", "AcceptanceModel", "LazyAcceptanceModel", "find_acceptance_model"]

ACCEPTANCE_FILE = "acceptance.onnx"
FORMAT = "adaptive-spec-acceptance-v1"
HINT = "train one with `adaptive-spec selector acceptance --out data/acceptance`"


class AcceptanceModel:
    """An exported acceptance model: ``model(features) -> probabilities`` (float32 [n, F] -> [n, 2]).

    The ``.onnx`` file is the artifact. It is loaded with onnxruntime, which serves as the
    reference. Inside generation the network is evaluated by default without it, from the layer
    weights stored in the same file's metadata (``backend="numpy"``: numpy for batches, plain
    Python for the one row a chain decides per level), after a parity check against
    onnxruntime on a probe batch at load. The reason is cost: a decision is made once per draft
    level, and right after the model forwards an onnxruntime call runs on cold caches and costs
    a sizeable part of a small draft's forward, against a budget of 5%. ``bench e2e`` reports the
    measured decision cost per level.

    Args:
        path: the ``.onnx`` file written by ``adaptive-spec selector acceptance``.
        threads: onnxruntime intra-op threads (1: the call is tiny; more threads only add overhead).
        backend: ``"numpy"`` (default) or ``"onnxruntime"``.

    Raises:
        FileNotFoundError: no file at ``path``.
        ValueError: the file is not an acceptance model of this version (one line, with the fix).
    """

    def __init__(self, path: str | Path, *, threads: int = 1, backend: str = "numpy") -> None:
        if backend not in ("numpy", "onnxruntime"):
            raise ValueError(f"backend must be 'numpy' or 'onnxruntime', got {backend!r}")
        self.backend = backend

        self.path = Path(path)
        if not self.path.is_file():
            raise FileNotFoundError(f"no acceptance model at {self.path}; {HINT}")
        try:
            self.session = cpu_session(self.path, threads)
        except Exception as err:  # onnxruntime's own exception types
            raise ValueError(f"{self.path} is not a readable ONNX model ({type(err).__name__}); {HINT}") from err
        meta = dict(self.session.get_modelmeta().custom_metadata_map)
        if meta.get("adaptive_spec.format") != FORMAT:
            raise ValueError(f"{self.path} is not an acceptance model of format {FORMAT!r}; {HINT}")
        names = json.loads(meta.get("adaptive_spec.feature_names", "[]"))
        if list(names) != list(ACCEPTANCE_FEATURES):
            raise ValueError(f"{self.path}: features {names} differ from {list(ACCEPTANCE_FEATURES)}; {HINT}")
        self.training: dict[str, Any] = json.loads(meta.get("adaptive_spec.training", "{}"))
        self._input = self.session.get_inputs()[0].name
        try:
            w = json.loads(meta["adaptive_spec.weights"])
            self._mean = np.asarray(w["mean"], dtype=np.float32)
            self._inv_std = (1.0 / np.asarray(w["std"], dtype=np.float32)).astype(np.float32)
            self._layers = [
                (np.asarray(W, dtype=np.float32).T.copy(), np.asarray(b, dtype=np.float32)) for W, b in w["layers"]
            ]
            # The same network as Python floats, for single rows (a chain decides one node per
            # level), with the standardisation folded into the first layer.
            layers = [([list(r) for r in W], list(b)) for W, b in w["layers"]]
            inv = [1.0 / x for x in w["std"]]
            W0, b0 = layers[0]
            shift = [m * s for m, s in zip(w["mean"], inv, strict=True)]
            b0 = [c - sum(map(mul, r, shift)) for r, c in zip(W0, b0, strict=True)]
            W0 = [[wi * s for wi, s in zip(r, inv, strict=True)] for r in W0]
            self._py_layers = [(list(map(tuple, W0)), b0)] + [(list(map(tuple, W)), b) for W, b in layers[1:]]
        except (KeyError, ValueError, TypeError) as err:
            raise ValueError(f"{self.path}: missing or malformed layer weights in the metadata; {HINT}") from err
        self._on_device: dict[str, list] = {}
        probe = np.random.default_rng(0).normal(size=(64, len(ACCEPTANCE_FEATURES))).astype(np.float32) * 3
        reference = self.run_onnx(probe)
        if reference.shape != (64, 2) or not np.isfinite(reference).all():
            raise ValueError(f"{self.path}: the network gives {reference.shape} or non-finite outputs; {HINT}")
        diff = float(np.abs(self.run_numpy(probe) - reference).max())
        diff = max(diff, float(np.abs(np.array(self.run_rows(probe.tolist())) - reference).max()))
        if diff > 1e-4:
            raise ValueError(f"{self.path}: the metadata weights differ from the ONNX graph (by {diff:.2g}); {HINT}")

    def run_onnx(self, features: np.ndarray) -> np.ndarray:
        """Probabilities [n, 2] from onnxruntime (the reference)."""
        return self.session.run(None, {self._input: features})[0]

    def run_numpy(self, features: np.ndarray) -> np.ndarray:
        """Probabilities [n, 2] from the same network in numpy (ReLU MLP, sigmoid outputs)."""
        h = (features - self._mean) * self._inv_std
        last = len(self._layers) - 1
        for i, (W, b) in enumerate(self._layers):
            h = h @ W + b
            if i < last:
                np.maximum(h, 0.0, out=h)
        return 1.0 / (1.0 + np.exp(-h))

    def run_rows(self, rows: Sequence[Sequence[float]]) -> list[tuple[float, float]]:
        """The same network in plain Python, row by row (fastest for one or two rows)."""
        out = []
        last = len(self._py_layers) - 1
        for h in rows:
            for i, (W, b) in enumerate(self._py_layers):
                h = [sum(map(mul, w, h)) + c for w, c in zip(W, b, strict=True)]
                if i < last:
                    h = [v if v > 0.0 else 0.0 for v in h]
            out.append(tuple(1.0 / (1.0 + math.exp(-v)) for v in h))
        return out

    def device_layers(self, device: Any) -> list[tuple[Any, Any]]:
        """The network's layers as float64 tensors ``(W [out, in], b [out])`` on ``device``, the standardisation
        folded into the first (the arithmetic of :meth:`run_rows`, for a policy decided on the device), made once.
        """
        import torch

        key = str(device)
        if key not in self._on_device:  # every layer's values in one copy
            flat = [v for W, b in self._py_layers for v in (*(x for r in W for x in r), *b)]
            parts = torch.tensor(flat, dtype=torch.float64, device=device).split(
                [n for W, b in self._py_layers for n in (len(W) * len(W[0]), len(b))]
            )
            self._on_device[key] = [
                (parts[2 * i].view(len(W), len(W[0])), parts[2 * i + 1]) for i, (W, _) in enumerate(self._py_layers)
            ]
        return self._on_device[key]

    def __call__(self, features: np.ndarray | Sequence[Sequence[float]]) -> np.ndarray | list[tuple[float, float]]:
        """Probabilities (accept given parent accepted, child accepted given node accepted) per row.

        An ndarray [n, F] gives an ndarray [n, 2]; a list of rows (as the drafting policy passes
        them) gives a list of pairs, computed in plain Python for up to 4 rows with the numpy
        backend.
        """
        if isinstance(features, np.ndarray):
            return self.run_numpy(features) if self.backend == "numpy" else self.run_onnx(features)
        if self.backend == "numpy" and len(features) <= 4:
            return self.run_rows(features)
        x = np.asarray(features, dtype=np.float32).reshape(len(features), len(ACCEPTANCE_FEATURES))
        return (self.run_numpy(x) if self.backend == "numpy" else self.run_onnx(x)).tolist()

    def __repr__(self) -> str:
        return f"AcceptanceModel({str(self.path)!r})"


def cpu_session(path: str | Path, threads: int = 1) -> Any:
    """An onnxruntime CPU session for a small network: sequential, ``threads`` intra-op threads, errors only."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.log_severity_level = 3  # errors only; load failures are re-raised by the callers
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


_LOADED: dict[Path, AcceptanceModel] = {}


class LazyAcceptanceModel:
    """The installed acceptance model, loaded at its first call (so that plan texts parse without it).

    Loaded models are shared per file, so that only the first generation pays for loading.
    """

    def __init__(self, path: str | Path | None = None) -> None:
        self.path = path
        self._model: AcceptanceModel | None = None

    def load(self) -> AcceptanceModel:
        """The model (loaded now if needed)."""
        if self._model is None:
            file = find_acceptance_model(self.path).resolve()
            if file not in _LOADED:
                _LOADED[file] = AcceptanceModel(file)
            self._model = _LOADED[file]
        return self._model

    def __call__(self, features: Any) -> Any:
        return (self._model or self.load())(features)

    def device_layers(self, device: Any) -> list[tuple[Any, Any]]:
        """:meth:`AcceptanceModel.device_layers` of the model (loaded now if needed)."""
        return (self._model or self.load()).device_layers(device)


def default_acceptance_paths() -> list[Path]:
    """Where the acceptance model is looked for, in order.

    The one installed in the user data folder (``selector acceptance --install``;
    :func:`adaptive_spec.files.installed_models_dir`), then the copy shipped next to the built-in
    pair in the package, then ``data/acceptance/`` of the working directory. The first entry is
    where ``--install`` writes.
    """
    from adaptive_spec.files import default_pair_path, installed_models_dir

    return [
        installed_models_dir() / ACCEPTANCE_FILE,
        default_pair_path() / ACCEPTANCE_FILE,
        Path("data") / "acceptance" / ACCEPTANCE_FILE,
    ]


def find_acceptance_model(path: str | Path | None = None) -> Path:
    """``path`` if given, else the first of :func:`default_acceptance_paths` that exists."""
    if path is not None:
        if not Path(path).is_file():
            raise FileNotFoundError(f"no acceptance model at {path}; {HINT}")
        return Path(path)
    tried = default_acceptance_paths()
    for candidate in tried:
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(f"no acceptance model found (looked at {', '.join(map(str, tried))}); {HINT}")
