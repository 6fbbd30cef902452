"""``adaptive-spec bench passes``: one target pass and one draft level per row count, eager and captured.

The measurement is :func:`adaptive_spec.bench.passes.measure_passes`.
"""

from __future__ import annotations

import argparse
import json


def _sizes(text: str) -> list[int]:
    try:
        sizes = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated row counts, got {text!r}") from None
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"row counts must be >= 1, got {text!r}")
    return sizes


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the ``bench passes`` options."""
    from adaptive_spec.options import add_json_option, add_model_options, add_progress_option

    add_model_options(parser)
    parser.add_argument("--rows", type=_sizes, default="1,2,4,8,16,32,64", help="target rows (default: %(default)s)")
    parser.add_argument("--draft-rows", type=_sizes, default="1,2,4,8,16", help="draft rows (default: %(default)s)")
    parser.add_argument(
        "--context", type=int, default=256, help="committed rows before the pass (default: %(default)s)"
    )
    parser.add_argument(
        "--capacity",
        type=int,
        default=None,
        help="rows the static caches hold, rounded up to 256 (default: context + 256); a captured pass attends "
        "over all of them",
    )
    parser.add_argument("--repeats", type=int, default=20, help="timed repetitions per size (default: %(default)s)")
    parser.add_argument(
        "--compile",
        action="store_true",
        help="on CUDA, also time the forwards captured from torch.compile's fused code (compiled per bucket)",
    )
    parser.add_argument(
        "--layers-too",
        action="store_true",
        help="also time the decoder layers' own modules (the engine runs them in fewer kernels: engine.decoder), "
        "interleaved",
    )
    parser.add_argument(
        "--chains",
        type=_sizes,
        default=None,
        help="also time whole chain drafts of these depths with the draft (e.g. 1,2,3,4,6): level by level against one "
        "replay of the chain's captured graph (CUDA), interleaved",
    )
    parser.add_argument(
        "--chain-temperature",
        type=float,
        default=0.0,
        help="the chains' temperature: 0, argmax draws (default), or > 0, inverse-CDF draws",
    )
    add_json_option(parser, "the rows")
    add_progress_option(parser)


def run(args: argparse.Namespace) -> int:
    """Time the passes, print a table, write JSON."""
    from adaptive_spec.bench.passes import measure_chains, measure_passes
    from adaptive_spec.engine.load import load_engine

    if args.context < 1 or args.repeats < 1:
        raise ValueError("--context and --repeats must be >= 1")
    if args.chain_temperature < 0:
        raise ValueError("--chain-temperature must be >= 0 (0: argmax draws)")
    if args.capacity is not None and args.capacity < args.context + 128:
        raise ValueError(f"--capacity must hold the context and a pass: at least {args.context + 128} rows")
    engine = load_engine(args.target, args.draft, args.device, args.dtype)
    if args.compile and engine.device.type != "cuda":
        print(f"bench passes: --compile has no effect on {engine.device} (it compiles captured CUDA forwards)")
    rows = measure_passes(
        engine,
        args.rows,
        args.draft_rows,
        args.context,
        args.repeats,
        not args.no_progress,
        compiled=args.compile,
        capacity=args.capacity,
        layers=args.layers_too,
    )
    caps = sorted({r["capacity"] for r in rows if r["capacity"] is not None})
    if caps:
        print(f"static caches of {'/'.join(map(str, caps))} rows, {args.context} of them committed")
    more = f" {'compiled ms':>12} {'its replay':>11} {'compile s':>10}" if args.compile else ""
    layer_cols = [k for k in ("layers_eager_ms", "layers_graph_ms") if rows and k in rows[0]]
    more += "".join(f" {k[:-3].replace('_', ' ') + ' ms':>18}" for k in layer_cols)
    # each attention form's replay of the bucket (engine.decoder.attend), where a bucket was captured in several
    forms = sorted({f for r in rows for f in (r.get("attention_replay_ms") or {})})
    forms = forms if len(forms) > 1 else []
    more += "".join(f" {f + ' replay':>14}" for f in forms) + (f" {'kept':>7}" if forms else "")
    print(
        f"{'model':<7} {'rows':>5} {'eager ms':>9} {'graph ms':>9} {'speedup':>8} {'bucket':>7} {'replay ms':>10}{more}"
    )
    for r in rows:
        graph = "-" if r["graph_ms"] is None else f"{r['graph_ms']:9.2f}"
        speedup = "-" if r["speedup"] is None else f"{r['speedup']:7.2f}x"
        bucket = "-" if r["bucket"] is None else str(r["bucket"])
        replay = "-" if r["replay_ms"] is None else f"{r['replay_ms']:10.2f}"
        line = f"{r['model']:<7} {r['rows']:>5} {r['eager_ms']:9.2f} {graph:>9} {speedup:>8} {bucket:>7} {replay:>10}"
        if args.compile:
            line += "".join(
                f" {'-':>{w}}" if r[k] is None else f" {r[k]:{w}.2f}"
                for k, w in (("compiled_ms", 12), ("compiled_replay_ms", 11), ("compile_s", 10))
            )
        line += "".join(f" {'-':>18}" if r[k] is None else f" {r[k]:18.2f}" for k in layer_cols)
        by_form = r.get("attention_replay_ms") or {}
        line += "".join(f" {'-':>14}" if f not in by_form else f" {by_form[f]:14.2f}" for f in forms)
        line += f" {r.get('attention') or '-':>7}" if forms else ""
        print(line)
    chains = None
    if args.chains:
        chains = measure_chains(
            engine, args.chains, args.context, args.repeats, args.chain_temperature, not args.no_progress
        )
        print(f"whole chain drafts (T = {args.chain_temperature:g}), each from one pending token to a device sync:")
        head = f"{'depth':>5} {'levels ms':>10} {'chain ms':>9} {'speedup':>8} {'ms/level':>9} {'replay ms':>10}"
        print(f"{head} {'kept':>7}")
        for c in chains:
            cells = [
                ("chain_ms", 9, ".2f"),
                ("speedup", 8, ".2f"),
                ("per_level_ms", 9, ".3f"),
                ("chain_replay_ms", 10, ".3f"),
            ]
            line = f"{c['depth']:>5} {c['levels_ms']:10.2f}"
            line += "".join(f" {'-':>{w}}" if c[k] is None else f" {c[k]:{w}{f}}" for k, w, f in cells)
            print(line + f" {c['attention'] or '-':>7}")
        failed = {c["draft_failed"] for c in chains} - {None}
        if failed:
            print(f"bench passes: a chain capture failed ({failed.pop()}); chains ran level by level")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        report = {"device": str(engine.device), "capacity": rows[0]["capacity"] if rows else None, "rows": rows}
        if chains is not None:
            report["chains"] = chains
        args.json.write_text(json.dumps(report, indent=2))
        print(f"wrote {args.json}")
    return 0
