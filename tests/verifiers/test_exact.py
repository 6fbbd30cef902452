"""Exact losslessness: the completed output law equals the target law (docs/algorithms.md §9)."""

from __future__ import annotations

import pytest

from adaptive_spec.analysis.exact import completed_tv, output_law
from adaptive_spec.verifiers import REGISTRY
from tests.helpers.verifier_cases import cases_for, instance_for, lossless_pairs

TV_TOL = 1e-9


@pytest.mark.parametrize(("name", "law"), lossless_pairs(), ids=lambda x: getattr(x, "value", x))
def test_completed_output_law_equals_target(name, law):
    fn = REGISTRY[name].fn
    worst = 0.0
    cases = cases_for(law)
    assert len(cases) >= 51
    for base, shape in cases:
        inst = instance_for(name, base)
        law_out = output_law(fn, shape, inst.draft_fn, inst.target_fn)
        tv, mass = completed_tv(law_out, inst.target_fn, inst.vocab, shape.depth + 1)
        assert abs(mass - 1.0) < 1e-12, (inst.name, str(shape), mass)
        assert tv < TV_TOL, (inst.name, str(shape), tv)
        worst = max(worst, tv)
    assert worst < TV_TOL
