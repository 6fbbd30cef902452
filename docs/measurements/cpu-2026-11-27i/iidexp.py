"""In one process, alternating: EAGLE trees with i.i.d. children grown by the device drafter or the host drafter on
this CPU; ms per step outside the forwards (run from the repository root: python docs/measurements/.../iidexp.py
PLANS ROUNDS)."""
import sys, statistics
from adaptive_spec.engine import Plan, drafting
from adaptive_spec.engine.load import load_engine
from adaptive_spec.files import default_prompts
from adaptive_spec.bench.overhead import ForwardClock
plans = [Plan.parse(p) for p in sys.argv[1].split(",")]
rounds = int(sys.argv[2])
engine = load_engine(None, None, "cpu", None)
prompts = default_prompts()[:4]
# On a CPU the engine grows EAGLE trees with i.i.d. children on the host; "device" forces its device drafter there
# (the drafting module's accelerator_path answers True), the verifiers keep their CPU paths in both.
real = drafting.accelerator_path
res = {}
for r in range(rounds):
    for where in ("device", "host"):
        drafting.accelerator_path = (lambda d: True) if where == "device" else real
        for p in plans:
            if r == 0: engine.generate(prompts[0], max_new_tokens=8, temperature=1.0, plan=p, seed=0)
            clocks = {"t": ForwardClock(engine.target), "d": ForwardClock(engine.draft)}
            steps, wall, toks = 0, 0.0, []
            for i, pr in enumerate(prompts):
                out = engine.generate(pr, max_new_tokens=64, temperature=1.0, plan=p, seed=i)
                steps += out.stats.steps; wall += out.stats.wall_time_s; toks.append(out.token_ids)
            fw = clocks["t"].seconds + clocks["d"].seconds
            for c in clocks.values(): c.close()
            ov = (wall - fw) / steps * 1e3
            res.setdefault((str(p), where), []).append(ov)
            print(r, where, p, f"ov {ov:.2f} ms/step, steps {steps}, wall/step {wall/steps*1e3:.2f}", hash(str(toks)), flush=True)
for k, v in res.items():
    print(k, "median %.2f" % statistics.median(v), ["%.2f" % x for x in v])
