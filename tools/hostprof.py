"""Where the host's time goes in a step: Python functions by their own time, per step, and aten ops by count.

    python tools/hostprof.py --device cuda --out DIR [--plans chain:3/block,...] [--prompts N] [--tokens N]

On a GPU a step is bound by the host when the device waits for it: the H100 of 2026-11-27 spent 2.7 ms of host
time drafting three EAGLE-head levels of `chain:3/block` (a head forward replays in about 0.2 ms) while a pass
costs 5.7. This runs each plan on a few demo prompts (after a warm-up that captures the graphs) under cProfile
(every Python function's own and cumulative time, overhead included: read shares, not absolute times) and under a
dispatch counter (aten ops per step by name: kernel launches on a GPU), and writes `hostprof.json` and
`hostprof.txt` (the top functions per plan) to DIR. `tools/gpu-check.sh --steps hostprof` runs it; its
`--device cpu` dry run passes here.
"""

from __future__ import annotations

import argparse
import collections
import cProfile
import json
import pstats
import sys
from pathlib import Path


def _ops(engine, plan, prompts, tokens, temperature):
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    counts: collections.Counter = collections.Counter()

    class Count(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if not func.is_view:
                counts[func.overloadpacket.__name__] += 1
            return func(*args, **(kwargs or {}))

    steps = 0
    with torch.inference_mode(), Count():
        for i, p in enumerate(prompts):
            steps += engine.generate(p, max_new_tokens=tokens, temperature=temperature, plan=plan, seed=i).stats.steps
    return steps, counts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--target", default="smollm2")
    parser.add_argument("--plans", default="autoregressive,chain:3/block,lookup:8/block,eagle:6:48:6:4:wor/traversal")
    parser.add_argument("--prompts", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--top", type=int, default=40)
    args = parser.parse_args(argv)

    from adaptive_spec.engine.load import load_engine
    from adaptive_spec.files import default_prompts

    engine = load_engine(args.target, None, args.device, None)
    prompts = default_prompts()[: args.prompts]
    report, text = {"device": str(engine.device), "plans": {}}, []
    for plan in args.plans.split(","):
        for p in prompts:  # warm-up: captures, first calls
            engine.generate(p, max_new_tokens=args.tokens, temperature=args.temperature, plan=plan, seed=0)
        prof, steps, tokens = cProfile.Profile(), 0, 0
        prof.enable()
        for i, p in enumerate(prompts):
            out = engine.generate(p, max_new_tokens=args.tokens, temperature=args.temperature, plan=plan, seed=i)
            steps, tokens = steps + out.stats.steps, tokens + len(out.token_ids)
        prof.disable()
        stats = pstats.Stats(prof)
        rows = []
        for (file, line, name), (_cc, calls, own, cum, _callers) in stats.stats.items():
            where = f"{file.split('site-packages/')[-1].split('adaptive_spec/')[-1]}:{line}({name})"
            rows.append(
                {
                    "function": where,
                    "calls_per_step": calls / steps,
                    "own_ms_per_step": 1e3 * own / steps,
                    "cum_ms_per_step": 1e3 * cum / steps,
                }
            )
        total = sum(r["own_ms_per_step"] for r in rows)
        ops_steps, counts = _ops(engine, plan, prompts, args.tokens, args.temperature)
        report["plans"][plan] = {
            "steps": steps,
            "tokens": tokens,
            "profiled_host_ms_per_step": total,
            "by_own_time": sorted(rows, key=lambda r: -r["own_ms_per_step"])[: args.top],
            "by_cumulative_time": sorted(rows, key=lambda r: -r["cum_ms_per_step"])[: args.top],
            "aten_ops_per_step": {k: v / ops_steps for k, v in counts.most_common()},
        }
        text.append(
            f"== {plan}: {steps} steps, {tokens} tokens, {total:.2f} ms of profiled host time a step, "
            f"{sum(counts.values()) / ops_steps:.0f} aten ops a step (views left out)"
        )
        text += [
            f"  {r['own_ms_per_step']:8.3f} own {r['cum_ms_per_step']:8.3f} cum {r['calls_per_step']:7.1f} calls  "
            f"{r['function']}"
            for r in report["plans"][plan]["by_own_time"]
        ]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "hostprof.json").write_text(json.dumps(report, indent=1))
    (args.out / "hostprof.txt").write_text("\n".join(text) + "\n")
    print("\n".join(line for line in text if line.startswith("==")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
