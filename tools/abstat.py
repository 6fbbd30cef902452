"""Mean tok/s per plan, base against main, of bench e2e JSON files DIR/ab-{base,main}-{1,2}.json.

    python tools/abstat.py DIR   (a docs/measurements folder: its ab.sh wrote them)
"""

import json, sys
base = sys.argv[1] if len(sys.argv) > 1 else "."
agg = {}
for v in ["base", "main"]:
    for k in [1, 2]:
        try:
            d = json.load(open(f"{base}/ab-{v}-{k}.json"))
        except FileNotFoundError:
            continue
        for tkey, run in d["runs"].items():
            for r in run["results"]:
                a = agg.setdefault((tkey, r["plan"]), {}).setdefault(v, {"tps": [], "rel": [], "be": [], "tree": []})
                a["tps"].append(r["tokens_per_s"]); a["rel"].append(r.get("speedup_vs_ar") or 0)
                a["be"].append(r.get("block_efficiency") or 0); a["tree"].append(r.get("mean_tree_size") or 0)
for (t, p), d in sorted(agg.items()):
    if "base" not in d or "main" not in d:
        continue
    b, m = d["base"], d["main"]
    mean = lambda x: sum(x) / len(x)
    print(f"T{t} {p:32s} tok/s {mean(b['tps']):6.2f} -> {mean(m['tps']):6.2f} ({mean(m['tps'])/mean(b['tps']):.3f})  rel-to-AR {mean(b['rel']):.3f} -> {mean(m['rel']):.3f} ({mean(m['rel'])/max(mean(b['rel']),1e-9):.3f})  BE {mean(b['be']):.2f} -> {mean(m['be']):.2f}  tree {mean(b['tree']):.1f} -> {mean(m['tree']):.1f}")
