"""``adaptive-spec bench e2e``: end-to-end tokens/s of plans vs autoregressive decoding (options, printing).

The measurement is :func:`adaptive_spec.bench.e2e.measure`.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from adaptive_spec.bench.e2e import ADAPTIVE, BEST_STATIC, IN_DRAFT, measure, print_table, resolve_plans
from adaptive_spec.engine.load import load_engine
from adaptive_spec.files import write_json_atomic
from adaptive_spec.options import (
    add_datastore_option,
    add_json_option,
    add_limit_option,
    add_model_options,
    add_profile_option,
    add_progress_option,
    add_temperatures_option,
    datastore_kwargs,
    device_type,
)
from adaptive_spec.planner.presets import DEFAULT_PLANS
from adaptive_spec.temperatures import parse_temperatures


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the ``bench e2e`` options."""
    add_model_options(parser, ("target", "draft"))
    parser.add_argument(
        "--prompts",
        default=None,
        help="JSON Lines file (.gz ok) with 'prompt' or 'turns', or .txt with one prompt per line "
        "(default: built-in prompts)",
    )
    parser.add_argument(
        "--plans",
        default=",".join(DEFAULT_PLANS),
        help=f"comma-separated plans, '{IN_DRAFT}' (the tuned in-draft planner), '{ADAPTIVE}' (the per-step planner "
        f"shipped for the pair: a fetched model's tuned source rule, else the selector) or '{BEST_STATIC}' "
        "(default: %(default)s)",
    )
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default: %(default)s)")
    add_temperatures_option(parser, None, "measured in one interleaved run (overrides --temperature)")
    parser.add_argument(
        "--selector",
        default=None,
        help=f"the '{ADAPTIVE}' plan's ONNX selector (default: the one installed in the user data folder, else "
        "shipped with the built-in pair, else data/selector/selector.onnx)",
    )
    parser.add_argument(
        "--best-static-file",
        default=None,
        help=f"'{BEST_STATIC}' plans when the selector records none (default: configs/plans/best-static.yaml)",
    )
    add_profile_option(parser)
    parser.add_argument("--max-new-tokens", type=int, default=128, help="new tokens per prompt (default: %(default)s)")
    add_limit_option(parser)
    parser.add_argument("--seed", type=int, default=0, help="base seed; prompt i uses seed + i (default: %(default)s)")
    add_model_options(parser, ("device", "dtype"))
    add_datastore_option(parser)
    parser.add_argument("--no-hf", action="store_true", help="skip transformers' assisted generation")
    parser.add_argument(
        "--hf-draft",
        default=None,
        help="the draft of transformers' assisted generation (default: --draft when it is a plain causal LM; for "
        "--target smollm2, smollm2-draft)",
    )
    parser.add_argument(
        "--no-lookup", action="store_true", help="skip transformers' prompt lookup decoding (prompt_lookup_num_tokens)"
    )
    parser.add_argument(
        "--no-hf-generate",
        action="store_true",
        help="skip transformers' plain generate (the baseline of the engine's own plain decoding)",
    )
    parser.add_argument(
        "--phase-sync",
        action="store_true",
        help="on CUDA, synchronise at every phase boundary so that the phase times split the device's time "
        "(slower: it stalls the overlap of host and device; default: the phase times are host times)",
    )
    parser.add_argument(
        "--compile-forwards",
        action="store_true",
        help="on CUDA, capture torch.compile's fused code of each captured forward (compiled per row bucket "
        "on first use; see bench passes --compile)",
    )
    add_json_option(parser)
    add_progress_option(parser)


class _Latency:
    """The latency model the plans need, and whether one must be measured once the engine is loaded."""

    def __init__(self, model: Any, warning: str | None, runtime: Any) -> None:
        self.model, self.warning, self.runtime = model, warning, runtime

    def complete(self, engine: Any, progress: bool) -> None:
        """The selector wants latency features and no profile was found: measure one for this pair, once."""
        if self.warning:
            from adaptive_spec.bench.profile import latency_for_selector

            engine.latency_model, note = latency_for_selector(engine, self.runtime, progress=progress)
            print(note, file=sys.stderr)


def bench_plans(args: argparse.Namespace, temps: list[float], verb: str) -> tuple[dict, dict, _Latency]:
    """``--plans`` resolved (``adaptive``, ``best-static``, ``in-draft``, plan strings), and their latency model.

    Shared by ``bench e2e`` and ``bench spec-bench``; a bad option is one line naming ``verb``.
    """
    from adaptive_spec.engine.models import adaptive_file, in_draft_file
    from adaptive_spec.selector.runtime import latency_model_for

    try:
        plans, info = resolve_plans(
            args.plans.split(","),
            temps,
            selector=args.selector,
            best_static_file=args.best_static_file,
            in_draft_file=in_draft_file(args.target) if args.draft is None else None,
            pair_file=adaptive_file(args.target) if args.draft is None else None,
            device=device_type(getattr(args, "device", None)),
        )
        runtime = info.pop("runtime")
        latency, warning = (None, None)
        if args.profile is not None or (ADAPTIVE in plans and runtime is not None):
            latency, warning = latency_model_for(runtime if ADAPTIVE in plans else None, args.profile)
    except (FileNotFoundError, LookupError, ValueError) as err:
        raise SystemExit(f"{verb}: {err}") from None
    if not plans:
        raise SystemExit(f"{verb}: --plans names no plan")
    return plans, info, _Latency(latency, warning, runtime)


def _prompts(args: argparse.Namespace) -> list:
    """``--prompts`` (or the built-in prompts), the first ``--limit``; a bad file is one line."""
    try:
        if args.prompts is None:
            from adaptive_spec.files import default_prompts

            return default_prompts(args.limit)
        from adaptive_spec.files import read_prompts

        return read_prompts(args.prompts, args.limit)
    except (FileNotFoundError, ValueError) as err:
        raise SystemExit(f"bench e2e: {err}") from None


def _print_run(key: str, res: dict, num_prompts: int, max_new_tokens: int) -> None:
    """One temperature's table, and any failure of transformers' baselines."""
    print(f"\ntemperature {key}, {num_prompts} prompts, {max_new_tokens} new tokens each")
    print_table([*res["baselines"].values(), *res["results"]])
    for label, name in (("hf_assisted", "HF assisted generation"), ("hf_prompt_lookup", "HF prompt lookup")):
        row = res["baselines"].get(label, {})
        if row.get("error"):
            print(f"{name} failed: {row['error']}")


def run(args: argparse.Namespace) -> int:
    """Run the benchmark, print a table per temperature, optionally write JSON; return the exit status."""
    try:
        temps = parse_temperatures(args.temperatures or str(args.temperature))
    except ValueError as err:
        raise SystemExit(f"bench e2e: {err}") from None
    plans, info, latency = bench_plans(args, temps, "bench e2e")
    prompts = _prompts(args)  # first: a missing or malformed prompt file is reported before the models load
    kw = datastore_kwargs(args.datastore)
    engine = load_engine(args.target, args.draft, args.device, args.dtype, latency_model=latency.model, **kw)
    latency.complete(engine, progress=not args.no_progress)
    engine.phase_sync = args.phase_sync
    engine.compile_forwards = args.compile_forwards
    if args.compile_forwards and not engine.compiles:
        print(f"bench e2e: --compile-forwards has no effect on {engine.device} (it compiles captured CUDA forwards)")
    from adaptive_spec.engine.load import load_hf_draft

    hf_draft = None if args.no_hf else load_hf_draft(engine, args.hf_draft, args.target)
    report = measure(
        engine,
        prompts,
        plans,
        temps,
        args.max_new_tokens,
        args.seed,
        hf=not args.no_hf,
        progress=not args.no_progress,
        hf_draft=hf_draft,
        lookup=not args.no_lookup,
        hf_generate=not args.no_hf_generate,
    )
    report["config"] = {
        "target": args.target or "default pair",
        "draft": args.draft or ("default pair" if args.target is None else "paired draft"),
        "hf_draft": getattr(hf_draft, "name_or_path", None),
        "prompts": str(args.prompts or "built-in prompts"),
        "num_prompts": len(prompts),
        "temperatures": temps,
        "plans": list(plans),
        "selector": info["selector"],
        "best_static": info["best_static"],
        "adaptive": info.get("adaptive"),
        "latency_profile": getattr(engine.latency_model, "source", None),
        "max_new_tokens": args.max_new_tokens,
        "seed": args.seed,
        "device": str(engine.device),
        "dtype": str(engine.target.dtype),
        "threads": __import__("torch").get_num_threads(),
        "phase_sync": args.phase_sync,
        "compile_forwards": args.compile_forwards,
        # seconds each captured bucket took to compile, per model (compiled_while_timed_s: those inside the timed runs)
        "compile_s": engine.compile_times() if args.compile_forwards else None,
        # per model and captured bucket: the attention form its graph kept and each form's replay ms (CUDA)
        "attention_forms": engine.attention_forms(),
        # the draft's whole-chain graphs (CUDA): bucket, depth, the form kept, each form's replay ms, capture seconds
        "draft_graphs": engine.draft_graphs(),
    }
    report = {"config": report.pop("config"), **report}
    for k, res in report["runs"].items():
        _print_run(k, res, len(prompts), args.max_new_tokens)
    if report.get("compiled_while_timed_s"):
        print(
            f"bench e2e: {report['compiled_while_timed_s']:.1f} s of compiling fell inside the timed runs "
            "(a static cache grew past its compiled capacity); their tok/s include it"
        )
    if report.get("kernels_compiled_while_timed"):
        print(
            f"bench e2e: {report['kernels_compiled_while_timed']} fused kernel variants compiled inside the timed "
            "runs (about a second each on a GPU); their tok/s include it"
        )
    if args.json:
        write_json_atomic(report, args.json)
        print(f"wrote {args.json}")
    return 0
