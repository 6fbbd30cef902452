"""Means per plan, base against main, of the JSON files tools/ab.sh writes.

python tools/abstat.py DIR        bench e2e files DIR/ab-{base,main}-<round>.json: tok/s, ratio to plain
                                  decoding, block efficiency, tree size (DIR abN: the files abN-{base,main}-*)
python tools/abstat.py DIR ov     bench overhead files DIR/ov-{base,main}-<round>.json: ms per step outside
                                  the forwards (another prefix than ov: the files PREFIX-{base,main}-<round>.json)
"""

import glob
import json
import sys


def mean(x):
    return sum(x) / len(x)


def load(folder, prefix):
    out = {}
    for v in ["base", "main"]:
        for path in sorted(glob.glob(f"{folder}/{prefix}-{v}-*.json")):
            with open(path) as f:
                out.setdefault(v, []).append(json.load(f))
    return out


def e2e(folder, prefix="ab"):
    agg = {}
    for v, runs in load(folder, prefix).items():
        for d in runs:
            for tkey, run in d["runs"].items():
                for r in [*run["results"], *[b for b in run.get("baselines", {}).values() if b.get("tokens_per_s")]]:
                    a = agg.setdefault((tkey, r["plan"]), {}).setdefault(
                        v, {"tps": [], "rel": [], "be": [], "tree": []}
                    )
                    a["tps"].append(r["tokens_per_s"])
                    a["rel"].append(r.get("speedup_vs_ar") or 0)
                    a["be"].append(r.get("block_efficiency") or 0)
                    a["tree"].append(r.get("mean_tree_size") or 0)
    for (t, p), d in sorted(agg.items()):
        if "base" not in d or "main" not in d:
            continue
        b, m = d["base"], d["main"]
        print(
            f"T{t} {p:32s} tok/s {mean(b['tps']):6.2f} -> {mean(m['tps']):6.2f} ({mean(m['tps']) / mean(b['tps']):.3f})"
            f"  rel-to-AR {mean(b['rel']):.3f} -> {mean(m['rel']):.3f}"
            f" ({mean(m['rel']) / max(mean(b['rel']), 1e-9):.3f})"
            f"  BE {mean(b['be']):.2f} -> {mean(m['be']):.2f}  tree {mean(b['tree']):.1f} -> {mean(m['tree']):.1f}"
        )


def overhead(folder, prefix="ov"):
    agg = {}
    for v, runs in load(folder, prefix).items():
        for d in runs:
            for r in d["rows"]:
                agg.setdefault(r["plan"], {}).setdefault(v, []).append(r["overhead_ms_per_step"])
    for p, d in agg.items():
        if "base" in d and "main" in d:
            b, m = mean(d["base"]), mean(d["main"])
            print(f"{p:36s} ms/step outside the forwards {b:6.2f} -> {m:6.2f} ({m / b:.3f})")


if __name__ == "__main__":
    folder = sys.argv[1] if len(sys.argv) > 1 else "."
    if len(sys.argv) > 2 and sys.argv[2].startswith("ab"):
        e2e(folder, sys.argv[2])
    elif len(sys.argv) > 2:
        overhead(folder, sys.argv[2])
    else:
        e2e(folder)
