"""What this session's checks cost, on this CPU, alone (writes probe.json beside this file).

1. ``PerSizeLinear.forward``, the layer of the session's start (``BASE``'s ``engine/layout.py``, read with ``git
   show``) against today's, interleaved in one process, at one row (the column-major copy) and four (the packed copy):
   the forward now takes None from a copy (a weight without a version counter) and reads ``self.weight`` once.
2. ``graphs.weights_key`` (run once a request a model, by ``SpecEngine._lend``) for SmolLM2-135M and its EAGLE head.

Usage: ``.venv/bin/python docs/measurements/cpu-2026-12-06h/probe.py`` from the repository root.
"""

from __future__ import annotations

import importlib.util
import json
import statistics
import subprocess
import sys
import tempfile
import timeit
from pathlib import Path

import torch

BASE = "b38697d"
HERE = Path(__file__).parent


def _old_layout():
    text = subprocess.run(["git", "show", f"{BASE}:adaptive_spec/engine/layout.py"], capture_output=True, text=True)
    path = Path(tempfile.mkdtemp()) / "layout_base.py"
    path.write_text(text.stdout)
    spec = importlib.util.spec_from_file_location("layout_base", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["layout_base"] = module
    spec.loader.exec_module(module)
    return module


def linear_forward(rows: int, rounds: int = 8) -> dict:
    from adaptive_spec.engine import layout as new

    layers = {}
    for name, module in (("base", _old_layout()), ("main", new)):
        lin = torch.nn.Linear(576, 576)
        assert module.per_size_linears(lin.weight, [lin], ("row", "column"), "packed")
        layers[name] = lin
    x = torch.randn(rows, 576)
    us: dict[str, list[float]] = {name: [] for name in layers}
    with torch.inference_mode():
        for r in range(rounds):
            order = list(layers) if r % 2 == 0 else list(reversed(layers))
            for name in order:
                f = layers[name]
                us[name].append(min(timeit.repeat(lambda f=f: f(x), number=2000, repeat=5)) / 2000 * 1e6)
    med = {name: statistics.median(v) for name, v in us.items()}
    form = "column-major copy" if rows == 1 else "packed copy"
    return {"shape": f"576x576, {rows} row(s), {form}", "us_per_call": us, "median_us": med,
            "main_over_base": med["main"] / med["base"]}  # fmt: skip


def weights_key_cost() -> dict:
    from adaptive_spec.engine import SpecEngine
    from adaptive_spec.engine.graphs import weights_key

    engine = SpecEngine.from_pretrained("smollm2")
    out = {}
    for role, model in (("target", engine.target), ("draft", engine.draft)):
        ms = [timeit.timeit(lambda m=model: weights_key(m), number=1) * 1e3 for _ in range(50)]
        out[role] = {"tensors": len(weights_key(model)), "median_ms": statistics.median(ms), "min_ms": min(ms)}
    return out


if __name__ == "__main__":
    torch.manual_seed(0)
    result = {"torch_threads": torch.get_num_threads(), "linear_forward": [linear_forward(1), linear_forward(4)],
              "weights_key": weights_key_cost()}  # fmt: skip
    (HERE / "probe.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))
