"""``bench e2e``'s warm-up compiles every variant of the fused kernels that its timed runs launch.

On a GPU, Triton compiles a kernel again for each new specialisation of a launch (about a second each), and an
H200 run lost most of a plan's tok/s to compiles inside its timed runs (``eagle:6:48:6:4/specinfer`` 0.16× plain
decoding with them, 0.89× without): the draft kernel was specialised on a level's depth, frontier sizes and offsets,
some 20 variants a plan. Counted here with Triton's rules (:mod:`tests.helpers.triton_variants`) on the CPU's
interpreter: after the bench's warm-up (a few tokens per plan and temperature), generations of other prompts, seeds
and lengths launch no variant it did not.
"""

from __future__ import annotations

import collections

import pytest

from adaptive_spec.bench.e2e import _warm_up
from adaptive_spec.engine import SpecEngine
from adaptive_spec.rng import accelerator_path_on_cpu
from adaptive_spec.verifiers import kernels
from tests.helpers.tiny import tiny_model
from tests.helpers.triton_variants import Variants

pytest.importorskip("triton.backends.nvidia")
from tests.verifiers.test_kernels import kernels_on

PLANS = ("eagle:5:16:3:3/specinfer", "eagle:4:12:3:2:wor/traversal", "iid:2x3/traversal", "eagle:6:24:4:4/traversal")


@pytest.mark.slow
def test_no_kernel_variant_is_new_after_the_benchs_warm_up(monkeypatch) -> None:
    from tests.engine.test_eagle import make_head

    kernels_on(monkeypatch)
    target = tiny_model("llama", vocab=48, hidden=32, seed=3, eos=None)
    engine = SpecEngine(target, make_head(target, 40, range(8, 48)))
    variants = Variants(monkeypatch)
    temps, keys = [0.0, 1.0], ["0", "1"]
    table = {p: dict.fromkeys(keys, p) for p in PLANS}
    prompts = [[5, 6, 7, 9], [11, 3, 3, 8, 20, 21]]
    with accelerator_path_on_cpu():
        _warm_up(engine, list(enumerate(prompts)), temps, keys, table, max_new_tokens=16)
        variants.mark()
        for seed, prompt in enumerate(prompts):
            for t in temps:
                for plan in PLANS:
                    engine.generate(prompt, max_new_tokens=16, temperature=t, plan=plan, seed=seed)
    assert kernels.FUSED[0], "a kernel failed: the torch code ran"
    kinds = {name for name, _ in variants.seen}
    assert kinds == {"eagle_iid_level_kernel", "traversal_level_kernel", "traversal_search_kernel", "rrs_rows_kernel"}
    warm, timed = variants.phases
    assert not timed, collections.Counter(name for name, _ in timed)  # new variants, by kernel
    # every draft level of both i.i.d. plans (top-k and width 3 and 3, 4 and 4: the same blocks), the trees cut short
    # at a request's end included, runs one variant (not one per level shape)
    assert sum(name == "eagle_iid_level_kernel" for name, _ in warm) == 1, len(warm)


def test_the_bench_counts_the_compiled_kernel_variants(monkeypatch) -> None:
    """``bench e2e`` reports the variants compiled inside its timed runs: Triton's per-device kernel caches summed
    over the kernels; none where the kernels are not compiled (Triton's interpreter keeps no cache)."""
    import sys
    import types

    from adaptive_spec.bench.e2e import fused_kernels_compiled

    interpreted = types.ModuleType("adaptive_spec.verifiers._triton")
    interpreted.kernel = types.SimpleNamespace(fn=None)  # an InterpretedFunction has no device_caches
    monkeypatch.setitem(sys.modules, "adaptive_spec.verifiers._triton", interpreted)
    monkeypatch.delitem(sys.modules, "adaptive_spec.engine._triton_draft", raising=False)
    assert fused_kernels_compiled() is None
    compiled = types.ModuleType("adaptive_spec.engine._triton_draft")
    compiled.a = types.SimpleNamespace(device_caches={0: ({"k1": 1, "k2": 2}, {}, None, None, None)})
    compiled.b = types.SimpleNamespace(device_caches={0: ({"k3": 3}, {}, None, None, None), 1: ({}, {})})
    monkeypatch.setitem(sys.modules, "adaptive_spec.engine._triton_draft", compiled)
    assert fused_kernels_compiled() == 3
