"""``adaptive-spec zoo drafts NAME``: train a real target's EAGLE-style head and standalone draft.

One command reproduces the committed drafts of ``smollm2`` (:func:`adaptive_spec.zoo.drafts.build_drafts`):
self-generated conversations, a teacher-forced feature pass, the draft vocabulary, the head, the
standalone draft, and held-out agreement figures, recorded with the data, tokens, time and machine
load in ``build_info.json``. Every stage resumes where a stopped run left it.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from adaptive_spec.options import add_progress_option


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the ``zoo drafts`` options."""
    parser.add_argument("name", nargs="?", default="smollm2", help="the target's short name (default: smollm2)")
    parser.add_argument(
        "--shards",
        type=int,
        default=40,
        help="conversation shards to generate (--batch requests each; every 10th is held out) (default: %(default)s)",
    )
    parser.add_argument("--head-minutes", type=float, default=20.0, help="head training budget (default: %(default)s)")
    parser.add_argument(
        "--draft-minutes", type=float, default=12.0, help="standalone draft training budget (default: %(default)s)"
    )
    parser.add_argument("--vocab", type=int, default=8192, help="draft vocabulary size (default: %(default)s)")
    parser.add_argument(
        "--work", type=Path, default=None, help="data and checkpoints (default: distill/NAME in the user data folder)"
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="folder for eagle/, draft/ and build_info.json (default: the package's zoo/NAME, the committed copy)",
    )
    parser.add_argument("--seed", type=int, default=0, help="(default: %(default)s)")
    parser.add_argument("--device", default="cpu", help="where every stage runs: cpu or cuda (default: %(default)s)")
    parser.add_argument(
        "--minutes",
        type=float,
        default=None,
        help="total budget of the build (generation, features, training, evaluation), e.g. 8 to fit one device "
        "call; replaces --head-minutes/--draft-minutes (with --from-logs or --measure-online: per fine-tune)",
    )
    parser.add_argument(
        "--prompts",
        action="append",
        default=None,
        metavar="FILE",
        help="JSONL instruction/chat prompts whose requests make every other conversation shard (the target "
        "answers; Spec-Bench and demo prompts are dropped); repeatable; 'self-instruct' is the shipped set "
        "(427 user-oriented and seed instructions of Self-Instruct, Apache-2.0), the default; 'none' for "
        "self-written requests only",
    )
    parser.add_argument(
        "--batch",
        type=int,
        default=None,
        help="conversations per shard, generated together (default: 384 on cuda, 96 on a cpu)",
    )
    parser.add_argument(
        "--init",
        choices=("new", "shipped"),
        default="new",
        help="new drafts, or go on training the committed ones (their vocabularies kept) (default: %(default)s)",
    )
    parser.add_argument(
        "--spec-bench", type=int, default=48, help="Spec-Bench questions in the evaluation sample (default: 48)"
    )
    parser.add_argument(
        "--from-logs",
        type=Path,
        default=None,
        metavar="DIR",
        help="instead of a build: fine-tune the shipped head on a draft log (collect/generate --draft-data DIR)",
    )
    parser.add_argument(
        "--max-tokens", type=int, default=None, help="--from-logs: labelled positions to train on (default: all)"
    )
    parser.add_argument(
        "--measure-online",
        type=Path,
        default=None,
        metavar="JSON",
        help="instead of a build: log one domain, fine-tune on --tokens N of it, report depth-1 figures on "
        "held-out prompts of it and of another domain, to JSON",
    )
    parser.add_argument(
        "--tokens",
        default="10000,30000,100000",
        help="--measure-online: the Ns, comma-separated (default: %(default)s)",
    )
    parser.add_argument(
        "--online-prompts",
        type=Path,
        default=None,
        help="--measure-online: JSONL with prompt, domain and split (default: the package's online_prompts.jsonl)",
    )
    parser.add_argument("--train-domain", default="code", help="--measure-online (default: %(default)s)")
    parser.add_argument("--other-domain", default="everyday", help="--measure-online (default: %(default)s)")
    parser.add_argument(
        "--log-with",
        choices=("engine", "batched"),
        default="batched",
        help="--measure-online: log through the engine (chain:2/block) or batched generate + one teacher-forced "
        "pass, the same records (default: %(default)s)",
    )
    parser.add_argument(
        "--consistency-prompts",
        type=int,
        default=0,
        help="--measure-online: also check chain:1 acceptance against teacher-forced top-1 on this many held-out "
        "prompts per domain (default: 0)",
    )
    add_progress_option(parser)


def run(args: argparse.Namespace) -> int:
    """Build the drafts (or fine-tune from logs, or measure online distillation); print the figures."""
    if args.device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            raise SystemExit("zoo drafts: --device cuda, but torch sees no CUDA device")
    if args.measure_online is not None:
        return _measure(args)
    if args.from_logs is not None:
        return _from_logs(args)
    from adaptive_spec.zoo.drafts import build_drafts

    try:
        info = build_drafts(
            args.name,
            work=args.work,
            out=args.out,
            shards=args.shards,
            head_minutes=args.head_minutes,
            draft_minutes=args.draft_minutes,
            vocab_size=args.vocab,
            seed=args.seed,
            progress=not args.no_progress,
            device=args.device,
            minutes=args.minutes,
            prompt_files=prompt_files(args.prompts),
            spec_bench=args.spec_bench,
            init=args.init,
            batch=args.batch,
        )
    except (ValueError, FileNotFoundError) as err:
        raise SystemExit(f"zoo drafts: {err}") from None
    print(json.dumps({"held_out": info["held_out"], "user_like": info["user_like"]}, indent=2))
    return 0


def prompt_files(given: list[str] | None) -> list[Path]:
    """The prompt files of ``--prompts``: named sets resolved, the shipped set when none is given."""
    from adaptive_spec.zoo.user_prompts import PROMPT_SETS

    names = given if given is not None else ["self-instruct"]
    if names == ["none"]:
        return []
    return [PROMPT_SETS.get(n, Path(n)) for n in names]


def _measure(args: argparse.Namespace) -> int:
    from adaptive_spec.zoo.online import measure_online

    try:
        tokens = [int(x) for x in args.tokens.split(",") if x.strip()]
        if not tokens or min(tokens) < 1:
            raise ValueError(f"--tokens wants positive integers, got {args.tokens!r}")
        result = measure_online(
            args.measure_online,
            name=args.name,
            prompts=args.online_prompts,
            train_domain=args.train_domain,
            other_domain=args.other_domain,
            tokens=tokens,
            work=args.work,
            minutes=args.minutes if args.minutes is not None else 3.0,
            log_with=args.log_with,
            consistency_prompts=args.consistency_prompts,
            device=args.device,
            seed=args.seed,
            progress=not args.no_progress,
        )
    except (ValueError, FileNotFoundError) as err:
        raise SystemExit(f"zoo drafts: {err}") from None
    print(json.dumps(result["runs"], indent=2))
    return 0


def _from_logs(args: argparse.Namespace) -> int:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from adaptive_spec.engine.models import fetch_model, shipped_drafts_dir
    from adaptive_spec.files import user_data_dir
    from adaptive_spec.zoo.drafts import save_sharded, write_info
    from adaptive_spec.zoo.online import fine_tune_from_logs

    work = args.work if args.work is not None else user_data_dir() / "distill" / args.name / "from-logs"
    out = args.out if args.out is not None else work / "out"
    target = AutoModelForCausalLM.from_pretrained(fetch_model(args.name), dtype=torch.float32).to(args.device).eval()
    target.requires_grad_(False)
    head = AutoModelForCausalLM.from_pretrained(shipped_drafts_dir(args.name) / "eagle", dtype=torch.float32)
    head = head.to(args.device).bind(target)
    try:
        info = fine_tune_from_logs(
            target,
            head,
            args.from_logs,
            work,
            minutes=args.minutes if args.minutes is not None else args.head_minutes,
            max_tokens=args.max_tokens,
            tokenizer=AutoTokenizer.from_pretrained(fetch_model(args.name)),
            device=args.device,
            seed=args.seed,
            progress=not args.no_progress,
        )
    except (ValueError, FileNotFoundError) as err:
        raise SystemExit(f"zoo drafts: {err}") from None
    save_sharded(head.cpu(), out / "eagle")
    write_info(out / "build_info.json", {"target": args.name, "from_logs": info})
    print(json.dumps({k: info[k] for k in ("held_out_before", "held_out_after")}, indent=2))
    print(f"fine-tuned head -> {out / 'eagle'}")
    return 0
