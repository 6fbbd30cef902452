"""``adaptive-spec selector pipeline``: collect -> label -> train -> export -> bench, on one pair.

Stages (each one an ordinary command, called in this process with typed options through
:func:`~adaptive_spec.cli.call.call_command`, in this order):

1. ``profile``: the latency profile of this machine (skipped if ``--profile`` exists, unless
   ``--reprofile``); its estimates are features and its step-time predictions are in the labels.
2. training prompts: function headers with their docstring's first line, drawn from the Python
   standard library's files *other than* the built-in pair's held-out files, so the selector never
   trains on the benchmark prompts (the built-in prompts are the held-out test set);
3. ``collect``: the engine runs the training prompts at each temperature with an exploring planner
   (epsilon-greedy around a default plan) and logs every step's root features; then, into a second
   log, ``--greedy-prompts`` more prompts at temperature 0 only. Greedy labels are exact (greedy
   trees are deterministic) and the features predict them, while at T > 0 the labels are dominated
   by the draw of the trees and the features barely predict the acceptance (validation then keeps
   the best static plan there, see ``selector train --gain_quantile``): extra data pays off at T = 0;
4. ``label``: E[τ+1] and predicted step time of every action at every k-th logged root, in both logs;
5. ``selector train`` (LightningCLI, ``configs/selector/default.yaml`` unless ``--config``), with the
   validation split by prompt, once per ``--train-seeds`` seed; the run with the best validation
   tokens/s (the network with its static fallback, as a ratio of sums) is kept;
6. ``selector export``: ONNX with the feature standardisation inside, checked against torch;
7. ``selector acceptance``: the acceptance model of the in-draft ``learned-chain`` policies
   (node logs with soft labels -> Lightning -> ONNX -> calibration), in ``OUT/acceptance``;
8. ``bench e2e``: ``adaptive`` vs ``best-static`` and the reference plans on the built-in held-out
   prompts at each temperature, in one interleaved run.

The latency profile goes beside the selector as ``selector.profile.json``, so that it runs with
the latency features it was trained with. With ``--install`` the exported selector (with its
profile) and the acceptance model are copied into the user data
folder (``$ADAPTIVE_SPEC_HOME/default``, default ``~/.local/share/adaptive-spec/default``; see
:func:`adaptive_spec.files.installed_models_dir`), where ``make demo``, ``generate`` and
``bench e2e`` look first. Nothing is written into the installed package.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from adaptive_spec.options import add_temperatures_option
from adaptive_spec.planner.latency import default_profile_path
from adaptive_spec.planner.presets import COLLECT_PLAN

DEFAULT_OUT = Path("data/selector")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the ``selector pipeline`` options."""
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="working folder (default: %(default)s)")
    parser.add_argument("--num-prompts", type=int, default=96, help="training prompts (default: %(default)s)")
    parser.add_argument(
        "--prompts",
        type=Path,
        default=None,
        help="training prompts file (JSONL or .txt) instead of prompts drawn from the standard library",
    )
    add_temperatures_option(parser, "0,0.7,1.0")
    parser.add_argument("--max-new-tokens", type=int, default=128, help="per generation (default: %(default)s)")
    parser.add_argument("--explore", default="epsilon:0.5", help="collect's exploring planner (default: %(default)s)")
    parser.add_argument("--plan", default=COLLECT_PLAN, help="plan exploited by epsilon-greedy (default: %(default)s)")
    parser.add_argument(
        "--greedy-prompts",
        type=int,
        default=160,
        help="extra training prompts collected at temperature 0 only, into OUT/log_t0, drawn from the standard "
        "library (0: none; default: %(default)s); with --prompts, only --greedy-prompts-file gives them",
    )
    parser.add_argument(
        "--greedy-prompts-file",
        type=Path,
        default=None,
        help="the extra greedy prompts from this file (JSONL or .txt) instead",
    )
    parser.add_argument("--greedy-every", type=int, default=8, help="label every k-th greedy root (default: 8)")
    parser.add_argument("--greedy-max-contexts", type=int, default=800, help="greedy roots labelled at most (800)")
    parser.add_argument("--every", type=int, default=12, help="label every k-th root (default: %(default)s)")
    parser.add_argument("--samples", type=int, default=4, help="trees per root and family (default: %(default)s)")
    parser.add_argument("--max-contexts", type=int, default=1000, help="label at most this many roots (default: 1000)")
    parser.add_argument(
        "--config",
        type=Path,
        default=None,
        help="LightningCLI config of the selector (default: configs/selector/default.yaml of "
        "the working directory, else the package's copy)",
    )
    parser.add_argument("--epochs", type=int, default=None, help="override trainer.max_epochs")
    parser.add_argument(
        "--train-seeds",
        default="0,1,2",
        help="train one selector per seed (weight init and batch order) and keep the one with the best validation "
        "tokens/s; the data's seed is --seed (default: %(default)s)",
    )
    parser.add_argument(
        "--profile",
        type=Path,
        default=default_profile_path(),
        help="latency profile; measured first if missing (default: %(default)s)",
    )
    parser.add_argument("--reprofile", action="store_true", help="measure the latency profile even if it exists")
    parser.add_argument(
        "--bench-plans",
        default="adaptive,best-static,chain:4/block,chain:6/traversal",
        help="plans of the final benchmark (default: %(default)s)",
    )
    parser.add_argument("--bench-tokens", type=int, default=128, help="new tokens per prompt in the benchmark")
    parser.add_argument(
        "--skip", default="", help="comma-separated stages to skip: collect,label,train,acceptance,bench"
    )
    parser.add_argument(
        "--install",
        action="store_true",
        help="copy the selector and acceptance model into the user data folder, where make demo, generate and "
        "bench e2e look first ($ADAPTIVE_SPEC_HOME/default, default ~/.local/share/adaptive-spec/default)",
    )
    parser.add_argument("--seed", type=int, default=0, help="seeds the prompts, exploration and labels")
    parser.add_argument(
        "--actions",
        type=Path,
        default=None,
        help="action-space YAML for collect and label (default: the built-in grid, planner/default_actions.yaml)",
    )


def training_prompts(count: int, seed: int) -> list[str]:
    """Prompts from standard-library files that are not among the built-in pair's held-out files."""
    from adaptive_spec.files import default_pair_path
    from adaptive_spec.zoo.corpus import default_corpus, extract_prompts, list_sources

    info = json.loads((default_pair_path() / "build_info.json").read_text())
    root = default_corpus()
    heldout = set(info.get("heldout_files", []))
    files = [p for p in list_sources(root) if p.relative_to(root).as_posix() not in heldout]
    lo, hi = info.get("config", {}).get("prompt_chars", (100, 300))
    prompts = extract_prompts(files, count, lo, hi, seed + 1)
    if len(prompts) < count:
        raise ValueError(f"found only {len(prompts)} training prompts in {root}; lower --num-prompts")
    return prompts


def _seeds(text: str) -> list[int]:
    try:
        seeds = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise SystemExit(f"--train-seeds must be comma-separated integers, got {text!r}") from None
    if not seeds:
        raise SystemExit("--train-seeds names no seed")
    return seeds


def greedy_prompts(count: int, seed: int, exclude: list[str]) -> list[str]:
    """``count`` more training prompts (drawn with ``seed + 6``), none of them in ``exclude``."""
    skip = set(exclude)
    pool = [p for p in training_prompts(count + len(skip) + 40, seed + 6) if p not in skip]
    if len(pool) < count:
        raise ValueError(f"found only {len(pool)} extra greedy prompts; lower --greedy-prompts")
    return pool[:count]


def default_config() -> Path:
    """``configs/selector/default.yaml`` of the working directory, else the copy shipped in the package."""
    from adaptive_spec.files import config_path

    path = config_path("selector/default.yaml")
    if not path.is_file():
        raise FileNotFoundError(f"no configs/selector/default.yaml in {Path.cwd()} or in the package; pass --config")
    return path


def _stage(verb: str, module: str, **options: Any) -> None:
    """Run one command in this process with typed options (see :func:`~adaptive_spec.cli.call.call_command`)."""
    from adaptive_spec.cli.call import call_command

    shown = " ".join(f"{k}={' '.join(v) if k == 'cli_args' else v}" for k, v in options.items())
    print(f"\n== {verb}: {shown}", flush=True)
    code = call_command(module, **options)
    if code:
        raise SystemExit(f"stage `adaptive-spec {verb}` failed with exit status {code}")


def _copy_profile(profile: Path, selector: Path) -> None:
    """Put the latency profile beside the selector (``selector.profile.json``), where the runtime looks first."""
    from adaptive_spec.files import atomic_write
    from adaptive_spec.selector.runtime import selector_profile_path

    if profile.is_file():
        atomic_write(selector_profile_path(selector), profile.read_bytes())


def _profile(path: Path) -> None:
    """Measure the latency profile into ``path``: ``profile`` writes ``OUT/profile.json`` (and its plot)."""
    name = default_profile_path().name
    if path.name == name:
        _stage("profile", "adaptive_spec.cli.profile", out=path.parent)
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=path.parent) as tmp:  # another file name: measure, then move it there
        _stage("profile", "adaptive_spec.cli.profile", out=Path(tmp))
        measured = Path(tmp) / name
        for src, dst in ((measured, path), (measured.with_suffix(".png"), path.with_suffix(".png"))):
            if src.exists():
                shutil.move(src, dst)


@dataclass
class _Files:
    """Where the pipeline's stages write and read, under ``--out``."""

    out: Path
    log_dir: Path
    greedy_dir: Path
    prompts: Path
    greedy_prompts: Path
    onnx: Path
    runs: Path
    greedy: bool  # a second, greedy-only log (temperature 0)

    @classmethod
    def under(cls, out: Path, args: argparse.Namespace) -> _Files:
        greedy = args.greedy_prompts_file is not None or (args.greedy_prompts > 0 and args.prompts is None)
        return cls(
            out,
            out / "log",
            out / "log_t0",
            out / "train_prompts.jsonl",
            out / "train_prompts_t0.jsonl",
            out / "selector.onnx",
            out / "runs",
            greedy,
        )


def run(args: argparse.Namespace) -> int:
    """Run the stages; print where each result is."""
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    skip = {s.strip() for s in args.skip.split(",") if s.strip()}
    files = _Files.under(out, args)
    timings: dict[str, float] = {}

    @contextlib.contextmanager
    def timed(name: str) -> Iterator[None]:
        t0 = time.perf_counter()
        yield
        timings[name] = round(time.perf_counter() - t0, 1)

    with timed("profile"):
        if args.reprofile or not args.profile.exists():
            _profile(args.profile)
    stages = (("collect", _collect), ("label", _label), ("train", _train), ("acceptance", _acceptance))
    for name, stage in stages:
        if name not in skip:
            with timed(name):
                stage(args, files)
    if args.install:
        _install(args, files)
    if "bench" not in skip:
        with timed("bench"):
            _stage(
                "bench e2e",
                "adaptive_spec.cli.bench_e2e",
                plans=args.bench_plans,
                temperatures=args.temperatures,
                selector=str(files.onnx),
                profile=str(args.profile),
                max_new_tokens=args.bench_tokens,
                json=str(out / "bench_e2e.json"),
            )
    print(f"\nstage seconds: {json.dumps(timings)}")
    print(f"selector: {files.onnx}\nlabels: {files.log_dir / 'label_report' / 'report.md'}")
    return 0


def _collect(args: argparse.Namespace, files: _Files) -> None:
    """Feature logs of the training prompts (and the greedy-only log), written afresh."""
    actions = None if args.actions is None else str(args.actions)
    if args.prompts is not None:
        from adaptive_spec.files import read_prompts

        files.prompts = args.prompts
        prompts = read_prompts(files.prompts)
    else:
        prompts = training_prompts(args.num_prompts, args.seed)
        files.prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts))
    for d in (files.log_dir, files.greedy_dir):
        if d.exists():
            shutil.rmtree(d)  # a fresh log: features must come from this pair and profile
    _stage(
        "collect",
        "adaptive_spec.cli.collect",
        out=str(files.log_dir),
        prompts=str(files.prompts),
        explore=args.explore,
        plan=args.plan,
        temperatures=args.temperatures,
        actions=actions,
        max_new_tokens=args.max_new_tokens,
        seed=args.seed,
        profile=str(args.profile),
    )
    if not files.greedy:
        return
    if args.greedy_prompts_file is not None:
        files.greedy_prompts = args.greedy_prompts_file
    else:
        extra = greedy_prompts(args.greedy_prompts, args.seed, prompts)
        files.greedy_prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in extra))
    _stage(
        "collect",
        "adaptive_spec.cli.collect",
        out=str(files.greedy_dir),
        prompts=str(files.greedy_prompts),
        explore=args.explore,
        plan=args.plan,
        temperatures="0",
        max_new_tokens=args.max_new_tokens,
        seed=args.seed + 6,
        profile=str(args.profile),
        actions=actions,
    )


def _label(args: argparse.Namespace, files: _Files) -> None:
    """Label both logs."""
    _stage(
        "label",
        "adaptive_spec.cli.label",
        log_dir=files.log_dir,
        every=args.every,
        samples=args.samples,
        profile=args.profile,
        seed=args.seed,
        max_contexts=args.max_contexts or None,
        actions=args.actions,
    )
    if files.greedy:
        _stage(
            "label",
            "adaptive_spec.cli.label",
            log_dir=files.greedy_dir,
            every=args.greedy_every,
            samples=args.samples,
            max_contexts=args.greedy_max_contexts,
            profile=args.profile,
            seed=args.seed + 6,
            actions=args.actions,
        )


def _train(args: argparse.Namespace, files: _Files) -> None:
    """Train one selector per seed, keep the best on validation, export it beside its profile."""
    config = args.config or default_config()
    label_files = [str(files.log_dir / "labels.parquet")]
    if files.greedy and (files.greedy_dir / "labels.parquet").exists():
        label_files.append(str(files.greedy_dir / "labels.parquet"))
    candidates: list[tuple[float, int, Path]] = []
    for seed in _seeds(args.train_seeds):
        # LightningCLI parses its own arguments: the one stage that takes an argv
        argv = [
            "--config",
            str(config),
            "--data.labels",
            json.dumps(label_files),
            "--trainer.default_root_dir",
            str(files.runs),
            "--seed_everything",
            str(seed),
        ]
        if args.epochs:
            argv += ["--trainer.max_epochs", str(args.epochs)]
        _stage("selector train", "adaptive_spec.cli.selector_train", cli_args=argv)
        version = max(files.runs.glob("version_*"), key=lambda p: int(p.name.split("_")[1]))
        ckpts = sorted((version / "checkpoints").glob("best-*.ckpt"))
        if not ckpts:
            raise SystemExit(f"no best checkpoint in {version / 'checkpoints'}")
        report = json.loads((version / "report" / "report.json").read_text())
        candidates.append((float(report["scores"]["adaptive"]["agg_rel_tps"]), seed, ckpts[-1]))
    _, seed, ckpt = max(candidates, key=lambda c: (c[0], -c[1]))
    if len(candidates) > 1:
        shown = ", ".join(f"seed {s}: {v:.4f}" for v, s, _ in candidates)
        print(f"validation tokens/s vs best static (adaptive, ratio of sums): {shown}; keeping seed {seed}")
    _stage("selector export", "adaptive_spec.cli.selector_export", checkpoint=ckpt, out=files.out)  # selector.onnx
    _copy_profile(args.profile, files.onnx)  # the selector runs with the profile its labels were made with


def _acceptance(args: argparse.Namespace, files: _Files) -> None:
    """The in-draft acceptance model of learned-chain plans (deployed with --install)."""
    extra = {"epochs": args.epochs} if args.epochs else {}
    _stage(
        "selector acceptance",
        "adaptive_spec.cli.selector_acceptance",
        out=files.out / "acceptance",
        temperatures=args.temperatures,
        prompts=files.prompts,
        num_prompts=args.num_prompts,
        max_new_tokens=args.max_new_tokens,
        seed=args.seed,
        no_progress=True,
        install=args.install,
        **extra,
    )


def _install(args: argparse.Namespace, files: _Files) -> None:
    """Copy the selector and its profile into the user data folder, never into the installed package."""
    from adaptive_spec.selector.runtime import default_selector_paths

    dest = default_selector_paths()[0]
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(files.onnx, dest)
    print(f"installed {files.onnx} -> {dest}")
    _copy_profile(args.profile, dest)
