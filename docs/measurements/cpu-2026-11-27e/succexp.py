"""In one process, interleaved: draws without replacement on a CPU with the validity ops every round (the old
``_successive``) against without them when the caller does not read them (the new), `bench overhead`'s measure.
Run from the repository root: python docs/measurements/cpu-2026-11-27e/succexp.py"""
import statistics as st

from adaptive_spec.bench.overhead import measure_overhead
from adaptive_spec.engine import Plan
from adaptive_spec.engine.load import load_engine
from adaptive_spec.files import default_prompts
from adaptive_spec.trees import draw

e = load_engine(None, None, "cpu", None)
prompts = default_prompts()[:4]
plans = [Plan.parse("eagle:6:48:6:4:wor/rrsw"), Plan.parse("eagle:6:48:6:4:wor/traversal")]
new = draw._successive


def old(rows, k, generator, with_valid=True):  # noqa: ARG001
    return new(rows, k, generator, True)


res = {}
for _ in range(4):
    for name, fn in (("old", old), ("new", new)):
        draw._successive = fn
        for row in measure_overhead(e, prompts, plans, 1.0, 64):
            res.setdefault((name, row["plan"]), []).append(row["overhead_ms_per_step"])
for k, v in sorted(res.items()):
    print(k, " ".join(f"{x:.2f}" for x in v), "median", round(st.median(v), 2))
