"""The compiled variants Triton would make of the fused kernels, counted on a CPU, where they run in its interpreter.

Compiled (CUDA), Triton makes a kernel again for every new *specialisation* of a launch: its ``constexpr`` values
and ``num_warps``, each pointer's dtype and whether it is 16-byte aligned, each integer's equality to 1 and
divisibility by 16; not for arguments a kernel names in ``do_not_specialize`` (integers) or
``do_not_specialize_on_alignment`` (pointers). A compile costs about a second of a GPU run's time: a launch whose
variant is new inside a timed run costs its tok/s. :class:`Variants` records the launches of a block with these
rules, read from the kernels as Triton compiles them (a process without the interpreter, which keeps no such
settings).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import torch

#: (module, kernel) of every fused kernel the engine launches
KERNELS = (
    ("adaptive_spec.engine._triton_draft", "eagle_iid_level_kernel"),
    ("adaptive_spec.verifiers._triton", "traversal_level_kernel"),
    ("adaptive_spec.verifiers._triton", "traversal_search_kernel"),
    ("adaptive_spec.verifiers._triton", "rrs_rows_kernel"),
)

_RULES = """
import importlib, json
out = {}
for module, name in %r:
    fn = getattr(importlib.import_module(module), name)
    out[name] = {"params": [p.name for p in fn.params], "constexpr": [p.name for p in fn.params if p.is_constexpr],
                 "ints": [p.name for p in fn.params if p.do_not_specialize],
                 "aligned": [p.name for p in fn.params if p.do_not_specialize_on_alignment]}
print(json.dumps(out))
"""


def rules() -> dict[str, dict[str, list[str]]]:
    """Per kernel: its parameters, its constexpr ones and those not specialised on (``ints``, ``aligned``)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run(
        [sys.executable, "-c", _RULES % (KERNELS,)], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def specialisation(rule: dict[str, list[str]], args: tuple, kwargs: dict) -> tuple:
    """The key Triton's CUDA backend compiles a launch under (see the module's docstring)."""
    key = []
    for name, a in zip(rule["params"], args, strict=False):
        if isinstance(a, torch.Tensor):
            key.append((name, str(a.dtype), name in rule["aligned"] or a.data_ptr() % 16 == 0))
        elif isinstance(a, bool) or name in rule["constexpr"]:
            key.append((name, a))
        elif isinstance(a, int):
            key.append((name, "int" if name in rule["ints"] else ("1" if a == 1 else "16" if a % 16 == 0 else "int")))
        else:
            key.append((name, type(a).__name__))
    return (*key, *sorted(kwargs.items()))


class Variants:
    """Within the block, every launch of a fused kernel recorded as ``(kernel, specialisation)`` in :attr:`seen`
    (in order); :meth:`mark` starts a new phase (:attr:`phases`: the keys first seen in each).
    """

    def __init__(self, monkeypatch) -> None:
        import importlib

        self.rules, self.seen, self.phases = rules(), [], [set()]
        for module, name in KERNELS:
            mod = importlib.import_module(module)
            monkeypatch.setattr(mod, name, _Recorded(name, getattr(mod, name), self))

    def mark(self) -> None:
        self.phases.append(set())

    def add(self, name: str, key: tuple) -> None:
        self.seen.append((name, key))
        if not any((name, key) in p for p in self.phases):
            self.phases[-1].add((name, key))


class _Recorded:
    def __init__(self, name: str, kernel, variants: Variants) -> None:
        self.name, self.kernel, self.variants = name, kernel, variants

    def __getitem__(self, grid):
        launch = self.kernel[grid]

        def call(*args, **kwargs):
            self.variants.add(self.name, specialisation(self.variants.rules[self.name], args, kwargs))
            return launch(*args, **kwargs)

        return call
