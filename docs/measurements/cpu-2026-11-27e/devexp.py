import statistics as st
from adaptive_spec.engine import Plan, runner
from adaptive_spec.engine.load import load_engine
from adaptive_spec.files import default_prompts
from adaptive_spec.bench.overhead import measure_overhead
e = load_engine(None, None, "cpu", None)
prompts = default_prompts()[:4]
plans = [Plan.parse("chain:4/block"), Plan.parse("eagle:6:48:6:4:wor/rrsw")]
fast_dev, fast_dt = runner.ModelRunner.device, runner.ModelRunner.dtype
slow_dev = property(lambda self: self.model.device); slow_dt = property(lambda self: self.model.dtype)
res = {}
for r in range(4):
    for name, (d, t) in (("cached", (fast_dev, fast_dt)), ("model", (slow_dev, slow_dt))):
        runner.ModelRunner.device, runner.ModelRunner.dtype = d, t
        for row in measure_overhead(e, prompts, plans, 1.0, 64):
            res.setdefault((name, row["plan"]), []).append(row["overhead_ms_per_step"])
for k, v in sorted(res.items()):
    print(k, " ".join(f"{x:.2f}" for x in v), "median", round(st.median(v), 2))
