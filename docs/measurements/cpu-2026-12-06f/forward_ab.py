"""SmolLM2's target forward, ms by rows: the weight forms chosen before this change (a version-1 weight-order cache:
the stock order and column-major) against now (the packed copy too), interleaved in one process
(`adaptive_spec.bench.profile.measure.measure_forwards`, context 128). Alone on the machine, from the repository root:

    OLD_HOME=DIR TOKENS=1,2,4 python docs/measurements/cpu-2026-12-06f/forward_ab.py REPEATS OUT.json

OLD_HOME: a user data folder holding the version-1 `weight-order.json` this host wrote before the change and a link
`models` to the real folder's models (default /tmp/s30/home_v1). The current choice comes from the real folder.
"""
import json, os, sys
import torch
from adaptive_spec.engine import SpecEngine
from adaptive_spec.engine.layout import linear_orders
from adaptive_spec.bench.profile.measure import measure_forwards
real = os.environ.get("ADAPTIVE_SPEC_HOME")
os.environ["ADAPTIVE_SPEC_HOME"] = os.environ.get("OLD_HOME", "/tmp/s30/home_v1")
import adaptive_spec.engine.weight_order as wo
wo.CACHE_VERSION = 1  # read the old cache's stock/column choices (its entries have no packed form)
old = SpecEngine.from_pretrained("smollm2")
wo.CACHE_VERSION = 2
if real is None: del os.environ["ADAPTIVE_SPEC_HOME"]
else: os.environ["ADAPTIVE_SPEC_HOME"] = real
new = SpecEngine.from_pretrained("smollm2")
print("old", linear_orders(old.target), "new", linear_orders(new.target))
tokens = [int(t) for t in os.environ.get("TOKENS", "1,2,3,4,5,8,9,16,17,32").split(",")]
out = measure_forwards(old.target, old.draft, contexts=[128], tokens=tokens, warmup=2, repeats=int(sys.argv[1]) if len(sys.argv) > 1 else 10,
                       also={"packed": new.target}, progress=False)
rows = [{"rows": n, "before_ms": out["target_ms"][0][i], "now_ms": out["packed_ms"][0][i]} for i, n in enumerate(tokens)]
for r in rows:
    print(r["rows"], "before %.1f now %.1f ratio %.2f" % (r["before_ms"], r["now_ms"], r["now_ms"] / r["before_ms"]))
json.dump({"context": 128, "cpu": wo.cpu_name(), "threads": torch.get_num_threads(), "rows": rows, "raw": out}, open(sys.argv[2] if len(sys.argv) > 2 else "/tmp/s30/fwd_ab.json", "w"), indent=1)
