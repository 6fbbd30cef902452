"""``adaptive-spec demo``: a model pair on its prompts, a table of speedups and a report folder.

``--pair smollm2`` (the default): SmolLM2-135M-Instruct (fetched on first use) with its EAGLE-style
head, on a dozen chat prompts rendered by its chat template, against transformers' assisted
generation (with the standalone draft) and prompt lookup. ``--pair builtin``: the built-in toy
pair on its held-out prompts, with the learned selector when one is installed.

The report's pieces are in :mod:`adaptive_spec.bench.demo`.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from adaptive_spec.bench.demo import DEMO_PLANS, SMOLLM2_PLANS, summary_markdown, text_report, write_plots
from adaptive_spec.options import add_limit_option, add_model_options, add_progress_option, add_temperatures_option


def _indent(text: str, prefix: str = "  > ") -> str:
    return "".join(prefix + line + "\n" for line in text.splitlines() or [""])


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the ``demo`` options."""
    parser.add_argument("--out", type=Path, default=Path("data/demo"), help="report folder (default: %(default)s)")
    parser.add_argument(
        "--pair",
        choices=("smollm2", "builtin"),
        default="smollm2",
        help="smollm2: the real instruction model and its EAGLE-style head (fetched on first use); builtin: the "
        "toy pair (default: %(default)s)",
    )
    parser.add_argument(
        "--plans",
        default=None,
        help=f"comma-separated plans (default: {SMOLLM2_PLANS} for smollm2, {DEMO_PLANS} for builtin)",
    )
    add_temperatures_option(parser, "0,1")
    parser.add_argument("--max-new-tokens", type=int, default=128, help="new tokens per prompt (default: %(default)s)")
    add_limit_option(parser, what="built-in prompts")
    parser.add_argument("--seed", type=int, default=0, help="base seed (default: %(default)s)")
    add_model_options(parser, ("device",))
    parser.add_argument("--no-hf", action="store_true", help="skip transformers' assisted generation")
    add_progress_option(parser)
    parser.add_argument(
        "--selector",
        default=None,
        help="ONNX selector for the 'adaptive' plan (default: the one installed in the user data folder, else "
        "shipped with the built-in pair, else data/selector/selector.onnx, else none)",
    )
    parser.add_argument("--no-selector", action="store_true", help="leave out the adaptive and best-static plans")


def selector_plans(args: argparse.Namespace, names: list[str], temps: list[float]) -> tuple[dict, dict, list[str]]:
    """The demo's plans: ``names`` plus ``adaptive`` and ``best-static`` when a selector is found.

    Returns:
        ``(plans, info, notes)``: what :func:`~adaptive_spec.bench.e2e.measure` takes, the
        selector's information (path, runtime, best static source) and lines for the summary.
    """
    from adaptive_spec.bench.e2e import ADAPTIVE, BEST_STATIC, IN_DRAFT, resolve_plans
    from adaptive_spec.engine.models import in_draft_file
    from adaptive_spec.selector.runtime import PIPELINE_HINT, find_selector

    notes: list[str] = []
    statics = [n for n in names if n not in (ADAPTIVE, BEST_STATIC)]
    file = in_draft_file("smollm2") if args.pair == "smollm2" else None
    if IN_DRAFT in statics:
        try:
            resolve_plans([IN_DRAFT], temps, in_draft_file=file)
        except (FileNotFoundError, LookupError) as err:
            statics.remove(IN_DRAFT)
            notes.append(f"The in-draft planner is not shown: {err}.")
    if args.no_selector:
        plans = resolve_plans(statics, temps, in_draft_file=file)[0]
        return plans, {"selector": None, "runtime": None, "best_static": None}, notes
    try:
        path = find_selector(args.selector)
    except FileNotFoundError as err:
        if args.selector is not None:
            raise SystemExit(f"demo: {err}") from None
        notes.append(f"No learned selector is installed, so the adaptive plan is not shown: {PIPELINE_HINT}.")
        return resolve_plans(statics, temps)[0], {"selector": None, "runtime": None, "best_static": None}, notes
    try:
        plans, info = resolve_plans([ADAPTIVE, BEST_STATIC, *statics], temps, selector=path)
    except (FileNotFoundError, LookupError, ValueError) as err:  # e.g. no best static plan for a temperature
        try:
            plans, info = resolve_plans([ADAPTIVE, *statics], temps, selector=path)
        except ValueError as err2:  # an unusable selector file or a bad plan string
            raise SystemExit(f"demo: {err2}") from None
        notes.append(f"best-static is not shown: {err}")
    return plans, info, notes


def _pair_inputs(args: argparse.Namespace, engine: Any, real: bool) -> tuple[list[Any], Path, Any]:
    """``(prompts, the pair's build_info.json, the draft of transformers' assisted generation or None)``."""
    from adaptive_spec.files import default_pair_path, default_prompts

    if not real:
        prompts = default_prompts(args.limit)
        return prompts, default_pair_path() / "build_info.json", None
    from adaptive_spec.engine.load import load_hf_draft
    from adaptive_spec.engine.models import shipped_drafts_dir
    from adaptive_spec.files import read_prompts

    prompts = read_prompts(shipped_drafts_dir() / "prompts.jsonl", args.limit)
    hf_draft = None if args.no_hf else load_hf_draft(engine, None, "smollm2")
    return prompts, shipped_drafts_dir() / "build_info.json", hf_draft


def _print_run(temp: str, run_: dict, text: dict, num_prompts: int, max_new_tokens: int) -> None:
    """One temperature's sample completion, table, text-quality line and identity counts."""
    from adaptive_spec.bench.e2e import print_table

    print(f"\ntemperature {temp}, {num_prompts} prompts, {max_new_tokens} new tokens each")
    print(f"sample completion (autoregressive):\n{_indent(text['prompt'])}{_indent(text['sample'], '  | ')}")
    for extra in text.get("answers", [])[1:]:
        print(f"{_indent(extra['prompt'])}{_indent(extra['answer'], '  | ')}")
    print_table([*run_["baselines"].values(), *run_["results"]])
    q = text["quality"]
    print(
        f"generated tokens in whitespace-only lines: {100 * q['whitespace_share']:.1f}%, in repeated "
        f"{q['repeat_n']}-grams: {100 * q['repeated_ngram_share']:.1f}% (either: {100 * q['either_share']:.1f}%)"
    )
    for name, (same, total) in text.get("identical", {}).items():
        print(f"{name}: {same}/{total} identical to autoregressive decoding")


def run(args: argparse.Namespace) -> int:
    """Run the demo plans on the built-in prompts, print the table, write the report folder."""
    from adaptive_spec.bench.e2e import ADAPTIVE, measure
    from adaptive_spec.engine.load import load_engine
    from adaptive_spec.selector.runtime import latency_model_for
    from adaptive_spec.temperatures import parse_temperatures

    t0 = time.perf_counter()
    try:
        temps = parse_temperatures(args.temperatures)
    except ValueError as err:
        raise SystemExit(f"demo: {err}") from None
    real = args.pair == "smollm2"
    if real:
        args.no_selector = True  # no selector is trained for this pair
    plans, info, notes = selector_plans(args, (args.plans or (SMOLLM2_PLANS if real else DEMO_PLANS)).split(","), temps)
    latency, warning = latency_model_for(info["runtime"], None) if ADAPTIVE in plans else (None, None)
    engine = load_engine("smollm2" if real else None, None, args.device, None, latency_model=latency)
    if warning:  # the selector wants latency features and no profile was found: measure one once
        from adaptive_spec.bench.profile import latency_for_selector

        engine.latency_model, note = latency_for_selector(engine, info["runtime"], progress=not args.no_progress)
        print(note)
        notes.append(f"{note[0].upper()}{note[1:]}.")
    prompts, info_path, hf_draft = _pair_inputs(args, engine, real)
    report = {
        "pair": json.loads(info_path.read_text()) if info_path.exists() else {},
        "config": {
            "num_prompts": len(prompts),
            "max_new_tokens": args.max_new_tokens,
            "seed": args.seed,
            "device": str(engine.device),
            "threads": __import__("torch").get_num_threads(),
            "selector": info["selector"],
            "best_static": info["best_static"],
            "latency_profile": getattr(engine.latency_model, "source", None),
        },
        "notes": notes,
        "runs": {},
    }
    res = measure(
        engine,
        prompts,
        plans,
        temps,
        args.max_new_tokens,
        args.seed,
        hf=not args.no_hf,
        progress=not args.no_progress,
        keep_outputs=True,
        hf_draft=hf_draft,
        lookup=real,
    )
    report["runs"] = res["runs"]
    left_out = {e["prompt"] for e in res["skipped_prompts"] + res["failed_prompts"]}
    report["text"] = text_report(
        engine.tokenizer, [p for i, p in enumerate(prompts) if i not in left_out], res["outputs"]
    )
    for temp, run_ in report["runs"].items():
        _print_run(temp, run_, report["text"][temp], len(prompts), args.max_new_tokens)
    for note in notes:
        print(note)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(report, indent=2))
    from adaptive_spec.extras import have, skipped

    plots = write_plots(report, args.out) if have("matplotlib") else []
    if not have("matplotlib"):
        skipped("matplotlib", "the report's plots")
    (args.out / "summary.md").write_text(summary_markdown(report, plots))
    print(f"\nreport: {args.out / 'summary.md'} ({time.perf_counter() - t0:.0f} s)")
    return 0
