import statistics, sys
from adaptive_spec.engine import SpecEngine, drafting
from adaptive_spec.bench.overhead import measure_overhead
from adaptive_spec.files import default_prompts
engine = SpecEngine.from_pretrained()
prompts = default_prompts()[:4]
real = drafting.eagle_on_device
plans = sys.argv[1].split(",")
res = {}
for rnd in range(3):
    for where in ("device", "host"):
        drafting.eagle_on_device = real if where == "device" else (lambda *a: False)
        for T in (0.0, 1.0):
            for r in measure_overhead(engine, prompts, plans, T, 48):
                res.setdefault((r["plan"], T, where), []).append(r["overhead_ms_per_step"])
for k, v in sorted(res.items()):
    print(f"{k[0]:34s} T={k[1]} {k[2]:6s} overhead ms/step median {statistics.median(v):.2f} all {[round(x,2) for x in v]}")
