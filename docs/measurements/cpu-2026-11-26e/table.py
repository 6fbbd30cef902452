import json, sys
d = json.load(open(sys.argv[1]))
rows = d["rows"] if isinstance(d, dict) else d
for r in rows:
    k = r["syncs_per_step_by_kind"]
    inf = sum(v for w, v in r["syncs_per_step_by_where"].items() if w != "engine")
    s = r["syncs_per_step"]
    sb = f"**{s:.1f}**" if s <= 2.0 + 1e-9 else f"{s:.1f}"
    opl = r["draft_ops_per_level"]
    print(f"| `{r['plan']}` | {r['steps']} | {sb} | {k.get('item',0):.1f} | {k.get('bool',0):.1f} | {k.get('tolist',0):.1f} | "
          f"{k.get('h2d',0):.1f} | {inf:.1f} | {r['ops_per_step']:.0f} | {r['draft_levels_per_step']:.1f} | "
          f"{'–' if not opl else f'{opl:.0f}'} | {r['target_ops_per_step']:.0f} | {r['verify_commit_ops_per_step']:.0f} |")
