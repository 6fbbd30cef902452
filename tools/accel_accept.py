"""Tokens per step of plans on the accelerator's path, run on a CPU (``rng.accelerator_path_on_cpu``): an A/B of a
drafting change that a plain CPU run does not take (EAGLE trees with i.i.d. children, policy chains). At T = 1,
the built-in pair's prompts (or, with ``smollm2``, SmolLM2 with its head on its 12 demo prompts) x SEEDS seeds x
64 new tokens; run it in each checkout. Counts only, no timing: it may share the machine.

Usage: PYTHONPATH=CHECKOUT python tools/accel_accept.py PLAN[,PLAN...] SEEDS OUT.json [smollm2]
"""

from __future__ import annotations

import json
import sys

from adaptive_spec import files
from adaptive_spec.engine.load import load_engine
from adaptive_spec.engine.models import shipped_drafts_dir
from adaptive_spec.rng import accelerator_path_on_cpu


def main(plans: list[str], seeds: int, out: str, target: str | None = None) -> None:
    engine = load_engine(target, None, "cpu", None)
    prompts, rows = (files.read_prompts(shipped_drafts_dir(target)) if target else files.default_prompts()), []
    with accelerator_path_on_cpu():
        for plan in plans:
            tokens = steps = 0
            for s in range(seeds):
                for i, prompt in enumerate(prompts):
                    r = engine.generate(prompt, max_new_tokens=64, temperature=1.0, plan=plan, seed=1000 * s + i)
                    tokens, steps = tokens + len(r.token_ids), steps + r.stats.steps
            rows.append({"plan": plan, "tokens": tokens, "steps": steps, "tokens_per_step": tokens / steps})
            print(rows[-1], flush=True)
    with open(out, "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    if len(sys.argv) not in (4, 5):
        sys.exit(__doc__.strip().splitlines()[-1])
    main(sys.argv[1].split(","), int(sys.argv[2]), sys.argv[3], *sys.argv[4:])
