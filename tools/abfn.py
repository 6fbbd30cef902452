"""A/B of one function in one process: a commit's version against the working tree's, alternated per generation.

    python tools/abfn.py BASE MODULE:NAME[=BASE_NAME] --plans P1,P2 [--target smollm2] [--rounds 6]
        [--max-new-tokens 64] [--temperature 1] [--json OUT.json]

Where ``tools/ab.sh`` runs two checkouts in turns (a minute apart, and this host's speed drifts by a fifth within
minutes), this loads BASE's version of one module (``git show BASE:path``) beside the working tree's and swaps the
function the engine calls, generation by generation (old then new, new then old, alternately), on the same prompts
and seeds: each pair of generations is seconds apart. Reported per plan: ms a step outside the two models'
forwards (``bench overhead``'s clock), step-weighted, and the median of the pairs' ratios new / old. Only a change
confined to that function is measured; ``=BASE_NAME`` when it had another name in BASE.
"""

from __future__ import annotations

import argparse
import importlib
import json
import statistics
import subprocess
import sys
import types
from pathlib import Path


def base_function(base: str, module: str, name: str):
    """``name`` as defined in ``module`` at commit ``base`` (the module's other globals are BASE's too)."""
    path = Path(importlib.import_module(module).__file__).resolve()
    root = Path(subprocess.check_output(["git", "rev-parse", "--show-toplevel"], text=True).strip())
    source = subprocess.check_output(["git", "show", f"{base}:{path.relative_to(root)}"], text=True)
    old = types.ModuleType(f"{module}__{base}")
    exec(compile(source, f"{base}:{path.relative_to(root)}", "exec"), old.__dict__)  # the project's own source, at BASE
    return getattr(old, name)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("base")
    ap.add_argument("function", help="MODULE:NAME[=BASE_NAME]")
    ap.add_argument("--plans", required=True)
    ap.add_argument("--target", default=None, help="a zoo target (default: the built-in pair)")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--limit", type=int, default=4, help="the first built-in prompts (bench overhead's)")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    from adaptive_spec.bench.overhead import ForwardClock
    from adaptive_spec.engine.load import load_engine
    from adaptive_spec.files import default_prompts

    module, _, names = args.function.partition(":")
    name, _, old_name = names.partition("=")
    mod = importlib.import_module(module)
    impl = {"old": base_function(args.base, module, old_name or name), "new": getattr(mod, name)}
    engine = load_engine(args.target, None, "cpu", None)
    clocks = [ForwardClock(engine.target), ForwardClock(engine.draft)]
    plans = [p.strip() for p in args.plans.split(",") if p.strip()]
    prompts = default_prompts()[: args.limit]
    for plan in plans:  # warm-up
        engine.generate(prompts[0], max_new_tokens=8, temperature=args.temperature, plan=plan, seed=0)
    runs: dict[str, dict[str, list]] = {p: {"old": [], "new": []} for p in plans}
    for rnd in range(args.rounds):
        for plan in plans:
            for i, prompt in enumerate(prompts):
                for which in ("old", "new") if (rnd + i) % 2 == 0 else ("new", "old"):
                    setattr(mod, name, impl[which])
                    before = sum(c.seconds for c in clocks)
                    r = engine.generate(
                        prompt,
                        max_new_tokens=args.max_new_tokens,
                        temperature=args.temperature,
                        plan=plan,
                        seed=i + 10 * rnd,
                    )
                    outside = r.stats.wall_time_s - (sum(c.seconds for c in clocks) - before)
                    runs[plan][which].append({"ms_per_step": 1e3 * outside / r.stats.steps, "steps": r.stats.steps})
    setattr(mod, name, impl["new"])
    rows = []
    for plan in plans:
        old, new = runs[plan]["old"], runs[plan]["new"]
        mean = {
            k: sum(g["ms_per_step"] * g["steps"] for g in v) / sum(g["steps"] for g in v) for k, v in runs[plan].items()
        }
        ratio = statistics.median(b["ms_per_step"] / a["ms_per_step"] for a, b in zip(old, new, strict=True))
        rows.append(
            {
                "plan": plan,
                "old_ms_per_step": mean["old"],
                "new_ms_per_step": mean["new"],
                "paired_median_ratio": ratio,
                "same_steps": [g["steps"] for g in old] == [g["steps"] for g in new],
                "generations": runs[plan],
            }
        )
        print(
            f"{plan:34s} ms/step outside the forwards {mean['old']:6.2f} -> {mean['new']:6.2f}"
            f"  (paired median new/old {ratio:.3f}, {len(old)} pairs)"
        )
    if args.json:
        keys = ("base", "function", "target", "rounds", "limit", "max_new_tokens", "temperature")
        config = {k: getattr(args, k) for k in keys}
        Path(args.json).write_text(json.dumps({"config": config, "rows": rows}, indent=1))
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
