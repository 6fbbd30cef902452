"""``adaptive-spec generate``: generate text with speculative decoding and print statistics.

``--plan`` runs one static plan every step (default ``auto``: the plan tuned for this model pair,
checked by model fingerprints, else ``chain:2/block``, as ``SpecEngine.generate``);
``--selector selector.onnx`` lets the learned selector
(:class:`~adaptive_spec.selector.runtime.AdaptivePlanner`) choose each step's plan, with the
latency features from ``--profile`` (default ``data/profile/profile.json`` if it exists, else 0).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from adaptive_spec.options import (
    add_datastore_option,
    add_draft_data_option,
    add_model_options,
    add_profile_option,
    datastore_kwargs,
)

DEFAULT_PLAN = "auto"  # the tuned plan for the loaded pair, else a default static plan (SpecEngine.default_plan)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the ``generate`` options."""
    add_model_options(parser, ("target", "draft"))
    parser.add_argument("--prompt", required=True, help="prompt text")
    parser.add_argument(
        "--plan",
        default=None,
        help="'<tree shape>/<verifier>' (shapes: chain:L, iid:KxL, delayed:TxKxB, wor:W1xW2x...), a drafting "
        "policy (e.g. eagle:5:16:4:3:wor/traversal), a lookup plan (lookup:8/block, lookup:3x8+2/nss; +mD adds the "
        "draft's greedy chain of D tokens: lookup:3x8+m3/nss; +mAxD its top A tokens at the root too: "
        "lookup:3x8+m3x3/nss) or 'ar' for plain autoregressive decoding (default: auto, the plan tuned for this model "
        "pair if a plan file was stamped for it, else chain:2/block)",
    )
    parser.add_argument(
        "--selector", default=None, help="an ONNX selector (selector export) choosing the plan of every step"
    )
    add_profile_option(parser)
    parser.add_argument("--max-new-tokens", type=int, default=64, help="number of new tokens (default: %(default)s)")
    parser.add_argument(
        "--temperature", type=float, default=None, help="0 = greedy (default: the target's generation_config, else 1)"
    )
    parser.add_argument(
        "--top-k",
        type=int,
        default=None,
        help="top-k filter, 0 = off (default: the target's generation_config, else off)",
    )
    parser.add_argument(
        "--top-p",
        type=float,
        default=None,
        help="nucleus filter, 1 = off (default: the target's generation_config, else off)",
    )
    parser.add_argument("--seed", type=int, default=None, help="random seed (default: random)")
    add_model_options(parser, ("device", "dtype"))
    add_datastore_option(parser)
    parser.add_argument("--trust-remote-code", action="store_true", help="allow custom model code from the hub")
    parser.add_argument("--stream", action="store_true", help="print text as it is generated")
    add_draft_data_option(parser)
    parser.add_argument(
        "--json", action="store_true", help="print one JSON document: the text, the plan and the statistics"
    )


def _plan(args: argparse.Namespace) -> tuple[Any, Any, str | None]:
    """``(plan or planner, latency model, warning)``: ``--selector``'s planner and its profile, else ``--plan``."""
    if args.selector is None:
        if args.profile is not None:
            raise SystemExit("generate: --profile feeds the selector's latency features; it needs --selector")
        name = args.plan or DEFAULT_PLAN
        if name.lower() in ("ar", "none", "autoregressive"):
            return None, None, None
        if name != DEFAULT_PLAN:  # a malformed plan fails before the models load
            from adaptive_spec.planner.plan import as_planner

            try:
                as_planner(name)
            except ValueError as err:
                raise SystemExit(f"generate: {err}") from None
        return name, None, None
    if args.plan is not None:
        raise SystemExit("generate: give --plan or --selector, not both")
    from adaptive_spec.selector.runtime import AdaptivePlanner, find_selector, latency_model_for

    try:
        plan = AdaptivePlanner(find_selector(args.selector))
        return plan, *latency_model_for(plan.runtime, args.profile)
    except (FileNotFoundError, ValueError) as err:  # SelectorLoadError is a ValueError
        raise SystemExit(f"generate: {err}") from None


def run(args: argparse.Namespace) -> int:
    """Load the models, generate, print the text and statistics; return the exit status."""
    import torch

    from adaptive_spec.engine import SpecEngine

    plan, latency, warning = _plan(args)
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    try:
        engine = SpecEngine.from_pretrained(
            args.target,
            args.draft,
            device=device,
            dtype=args.dtype,
            trust_remote_code=args.trust_remote_code,
            latency_model=latency,
            **datastore_kwargs(args.datastore),
        )
    except ValueError as err:  # a missing directory, an offline hub name, mismatched tokenizers
        raise SystemExit(f"generate: {err}") from None
    if args.draft_data:
        from adaptive_spec.engine.draft_data import log_draft_data

        try:
            log_draft_data(engine, args.draft_data)
        except ValueError as err:
            raise SystemExit(f"generate: {err}") from None
    if warning:  # the selector has no profile for its latency features: measure one once
        from adaptive_spec.bench.profile import latency_for_selector

        engine.latency_model, note = latency_for_selector(engine, plan.runtime)
        print(note, file=sys.stderr)
    kwargs = {
        "max_new_tokens": args.max_new_tokens,
        "temperature": args.temperature,
        "top_k": args.top_k,
        "top_p": args.top_p,
        "plan": plan,
        "seed": args.seed,
    }
    if args.stream:
        from transformers import TextStreamer

        result = engine.generate(args.prompt, streamer=TextStreamer(engine.tokenizer, skip_prompt=True), **kwargs)
    else:
        result = engine.generate(args.prompt, **kwargs)
        if not args.json:
            print(result.text)
    s = result.stats
    selector = None
    if args.selector is not None:
        selector = {
            "selector": str(args.selector),
            "latency_profile": getattr(engine.latency_model, "source", None),
            "chosen_actions": plan.action_counts(),
            "decision_latency_us": plan.latency_us(),
        }
    if args.json:
        if plan == DEFAULT_PLAN:
            plan = str(result.steps[0].plan) if result.steps else "autoregressive"
        name = "adaptive" if selector else (str(plan) if plan else "autoregressive")
        print(json.dumps({"text": result.text, "plan": name, **(selector or {}), **s.as_dict()}, indent=2))
    else:
        print(
            f"\n[{s.new_tokens} tokens, {s.tokens_per_s:.1f} tok/s, block efficiency {s.block_efficiency:.2f}, "
            f"{s.target_forwards} target / {s.draft_forwards} draft forwards, stop: {s.stop_reason}]",
            file=sys.stderr,
        )
        if selector:
            lat = selector["decision_latency_us"]
            top = ", ".join(f"{a} x{n}" for a, n in list(selector["chosen_actions"].items())[:5])
            median = f"{lat['median']:.0f} us" if lat.get("median") is not None else "-"
            print(f"[selector: {lat['n']} decisions, median {median}; chose {top}]", file=sys.stderr)
    engine.close()  # writes the draft log, if any
    return 0
