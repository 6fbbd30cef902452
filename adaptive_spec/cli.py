"""The ``adaptive-spec`` command line: one dispatch table over ordinary typed functions.

Each command module exposes ``add_arguments(parser)`` and ``run(args) -> int``; the table
below maps command paths to those modules, imported lazily so that ``--help`` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# command path -> (module, one-line help)
COMMANDS: dict[tuple[str, ...], tuple[str, str]] = {
    ("demo",): (
        "adaptive_spec.bench.demo",
        "run the built-in pair on its held-out prompts: table of speedups and a report with plots",
    ),
    ("generate",): (
        "adaptive_spec.commands.generate",
        "generate text with speculative decoding (a tree plan) or plain autoregressive decoding",
    ),
    ("bench", "e2e"): (
        "adaptive_spec.bench.e2e",
        "end-to-end tokens/s of plans vs autoregressive and transformers' assisted generation",
    ),
    ("collect",): (
        "adaptive_spec.records.collect",
        "run the engine over prompts (static plan or --explore) and log each step's features as Parquet shards",
    ),
    ("label",): (
        "adaptive_spec.records.label_cli",
        "label a feature log: E[tau+1] and predicted step time of every action per root; oracle-gain report",
    ),
    ("profile",): (
        "adaptive_spec.bench.profile",
        "measure the draft and target forward latency (context x tokens), verifier and bookkeeping times",
    ),
    ("bench", "latency-model"): (
        "adaptive_spec.bench.latency_fit",
        "compare the latency model's predicted step times with measured engine steps (MAPE per plan)",
    ),
    ("bench", "overhead"): (
        "adaptive_spec.bench.overhead",
        "share of each step spent outside the two models' forward passes (16-node trees by default)",
    ),
    ("bench", "verifiers"): (
        "adaptive_spec.bench.verifiers",
        "exact block efficiency vs the LP limit per verifier, or (--speed) microseconds per verification",
    ),
    ("tune", "plans"): (
        "adaptive_spec.tuning.cli_plans",
        "search the static plan (shape, sizes, verifier) per temperature with Optuna; best to configs/plans",
    ),
    ("tune", "policies"): (
        "adaptive_spec.tuning.policies",
        "choose the in-draft planner's drafting policy per temperature on measured speedup; to configs/plans",
    ),
    ("tune", "stamp"): (
        "adaptive_spec.engine.fingerprint",
        "record a model pair's fingerprints in a tuned plan file (generate() then plays it by default for that pair)",
    ),
    ("tune", "selector"): (
        "adaptive_spec.tuning.cli_selector",
        "search the selector's hyper-parameters with Optuna, pruning on val/agg_rel_tps; best to best-selector.yaml",
    ),
    ("selector-pipeline",): (
        "adaptive_spec.commands.selector_pipeline",
        "collect -> label -> train -> export -> bench the plan selector on the built-in pair (--install for the demo)",
    ),
    ("selector", "acceptance"): (
        "adaptive_spec.selector.acceptance",
        "collect node logs -> train -> export -> calibrate the acceptance model of learned-chain policies",
    ),
    ("train-selector",): (
        "adaptive_spec.selector.train",
        "train the plan selector with LightningCLI (--config configs/selector/default.yaml --data.labels DIR)",
    ),
    ("export-selector",): (
        "adaptive_spec.selector.export",
        "export a selector checkpoint to ONNX (features in, one logit per plan out; schema in the metadata)",
    ),
    ("zoo", "build"): (
        "adaptive_spec.zoo.cli",
        "train the built-in draft/target pair (Llama-style, Python stdlib source) from a seed",
    ),
    ("zoo", "prompts"): (
        "adaptive_spec.zoo.prompt_sets",
        "write prompt sets from the built-in pair's corpus split: training files (for tuning) or a second held-out set",
    ),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="adaptive-spec", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    groups: dict[str, argparse._SubParsersAction] = {}
    for path, (module, help_text) in COMMANDS.items():
        if len(path) == 1:
            p = sub.add_parser(path[0], help=help_text)
        else:
            if path[0] not in groups:
                g = sub.add_parser(path[0], help=f"{path[0]} commands")
                groups[path[0]] = g.add_subparsers(dest="subcommand", required=True)
            p = groups[path[0]].add_parser(path[1], help=help_text)
        p.set_defaults(_module=module)
        importlib.import_module(module).add_arguments(p)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``adaptive-spec`` console script."""
    args = build_parser().parse_args(argv)
    return int(importlib.import_module(args._module).run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
