"""``adaptive-spec bench overhead``: the share of each step spent outside the two models' forwards.

The measurement is :func:`adaptive_spec.bench.overhead.measure_overhead`; with ``--syncs`` (or
``--ops``) the host synchronisations and aten ops per step instead
(:func:`adaptive_spec.bench.overhead.count_host_syncs`).
"""

from __future__ import annotations

import argparse
import json

from adaptive_spec.bench.overhead import (
    GOALS,
    PLAN_PRESETS,
    SIXTEEN_NODE_PLANS,
    SYNC_KINDS,
    count_host_syncs,
    measure_overhead,
)
from adaptive_spec.options import (
    add_datastore_option,
    add_json_option,
    add_limit_option,
    add_model_options,
    datastore_kwargs,
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the ``bench overhead`` options."""
    add_model_options(parser, ("target", "draft"))
    parser.add_argument(
        "--plans",
        default=SIXTEEN_NODE_PLANS,
        help="comma-separated plans ('autoregressive': plain decoding, a step per token), or a preset: 'families' "
        "(one plan per family: static, policy-grown, lookup, hybrid) or 'sixteen' (16-node trees, the default: "
        "%(default)s)",
    )
    parser.add_argument("--temperature", type=float, default=1.0, help="(default: %(default)s)")
    parser.add_argument("--max-new-tokens", type=int, default=128, help="(default: %(default)s)")
    add_limit_option(parser, 8, "built-in prompts")
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="rounds of every plan, interleaved; ms/step is the median round's, min and max beside it (hosts drift: "
        "5 or more for a figure to quote; default: %(default)s)",
    )
    add_model_options(parser, ("device",))
    add_datastore_option(parser)
    add_json_option(parser, "the rows")
    parser.add_argument(
        "--stand-in-graphs",
        action="store_true",
        help="on a CPU: run the accelerator's captured path, each graph replayed as the aten ops it recorded, "
        "and leave every forward, replay and capture out of the time (the host's work a step where a replay is one "
        "launch; with --syncs: count on that path)",
    )
    parser.add_argument(
        "--syncs",
        "--ops",
        dest="syncs",
        action="store_true",
        help="count host synchronisations (by kind and where) and aten ops outside the forwards per step, "
        "instead of timing the overhead",
    )


def plan_list(text: str) -> list[str]:
    """The plan strings of ``--plans``: presets (:data:`PLAN_PRESETS`) expanded, in order."""
    out: list[str] = []
    for item in (p.strip() for p in text.split(",")):
        if item:
            out.extend(plan_list(PLAN_PRESETS[item]) if item in PLAN_PRESETS else [item])
    return out


def _fmt(x: float | None, width: int, digits: int = 1) -> str:
    return f"{'-':>{width}}" if x is None else f"{x:{width}.{digits}f}"


def print_counts(rows: list[dict]) -> None:
    """The ``--syncs`` table: syncs per step by where, aten ops outside the forwards, each plan's kinds and sites."""
    print(
        f"{'plan':<32} {'syncs':>6} {'most':>4} {'engine':>6} {'runner':>6} {'hf':>5} {'ops':>6} {'levels':>6} "
        f"{'ops/lvl':>7} {'target':>6} {'ver+com':>7} {'in fwd':>7}"
    )
    for r in rows:
        w = r["syncs_per_step_by_where"]
        in_fwd = sum(r["model_ops_per_step_by_where"].values())
        print(
            f"{r['plan']:<32} {_fmt(r['syncs_per_step'], 6)} {_fmt(r.get('most_syncs_in_a_step'), 4, 0)} "
            f"{_fmt(w.get('engine'), 6)} {_fmt(w.get('runner'), 6)} "
            f"{_fmt(w.get('transformers'), 5)} {_fmt(r['ops_per_step'], 6, 0)} {_fmt(r['draft_levels_per_step'], 6)} "
            f"{_fmt(r['draft_ops_per_level'], 7, 0)} {_fmt(r['target_ops_per_step'], 6, 0)} "
            f"{_fmt(r['verify_commit_ops_per_step'], 7, 0)} {_fmt(in_fwd, 7, 0)}"
        )
    print(
        "per step: syncs (all kinds, h2d included; most: in the step with the most), outside the forwards (engine), "
        "inside them in this package's "
        "runners/EAGLE head (runner) and in transformers (hf); aten ops outside the forwards, draft levels "
        "(draft forwards), draft ops per level, ops of the target's block outside its forward (target), "
        "verification + commit + the rest (ver+com), ops inside the forwards (in fwd). "
        f"Goals: syncs <= {GOALS['syncs_per_step']} (in every step), none in the forwards, ops/lvl <= "
        f"{GOALS['draft_ops_per_level']}, ver+com <= {GOALS['verify_commit_ops_per_step']}."
    )
    for r in rows:
        kinds = ", ".join(
            f"{k} {r['syncs_per_step_by_kind'][k]:.2f}" for k in SYNC_KINDS if k in r["syncs_per_step_by_kind"]
        )
        print(f"\n{r['plan']}: {kinds or 'no syncs'}")
        for s in r["sync_sites"][:6]:
            print(f"  {s['per_step']:6.2f}  {s['where']:<12} {s['kind']:<17} {s['site']}")


def run(args: argparse.Namespace) -> int:
    """Measure each plan's share of step time outside the forwards (or count its syncs and ops), print a table."""
    if args.repeat < 1:
        raise ValueError(f"--repeat must be >= 1, got {args.repeat}")
    if args.stand_in_graphs:
        if args.device not in (None, "cpu"):
            raise ValueError(f"--stand-in-graphs runs the captured path on a CPU; drop --device {args.device}")
        from adaptive_spec.bench.stand_in import stand_in_graphs

        with stand_in_graphs():
            return _run(args)
    return _run(args)


def _run(args: argparse.Namespace) -> int:
    from adaptive_spec.engine import Plan
    from adaptive_spec.engine.load import load_engine
    from adaptive_spec.files import default_prompts
    from adaptive_spec.planner.plan import AUTOREGRESSIVE

    plans = [p if p == AUTOREGRESSIVE else Plan.parse(p) for p in plan_list(args.plans)]  # before the models load
    engine = load_engine(args.target, args.draft, args.device, None, **datastore_kwargs(args.datastore))
    prompts = default_prompts(args.limit)
    for plan in plans:  # every plan checked before the first is measured
        engine.check_planner(plan, args.temperature == 0)
    if args.syncs:
        rows = count_host_syncs(engine, prompts, plans, args.temperature, args.max_new_tokens)
        print_counts(rows)
    else:
        rows = measure_overhead(
            engine, prompts, plans, args.temperature, args.max_new_tokens, args.repeat, args.stand_in_graphs
        )
        print(
            f"{'plan':<28} {'overhead':>9} {'ms/step':>8} {'min-max':>11} {'target fwd':>11} {'draft fwd':>10} "
            f"{'steps':>6}"
        )
        for r in rows:
            spread = f"{min(r['rounds_ms_per_step']):.2f}-{max(r['rounds_ms_per_step']):.2f}"
            print(
                f"{r['plan']:<28} {100 * r['overhead_fraction']:8.1f}% {r['overhead_ms_per_step']:8.2f} {spread:>11} "
                f"{r['target_forward_s']:10.2f}s {r['draft_forward_s']:9.2f}s {r['steps']:>6}"
            )
        if args.repeat > 1:
            print(f"ms/step outside the forwards: the median of {args.repeat} interleaved rounds; the rest summed")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"rows": rows}, indent=2))
        print(f"wrote {args.json}")
    return 0
