"""``adaptive-spec zoo build``: train the built-in draft/target pair from a seed."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING

from adaptive_spec.options import add_progress_option
from adaptive_spec.zoo.config import DEFAULT_MINUTES

if TYPE_CHECKING:
    from adaptive_spec.zoo.config import ZooConfig


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the ``zoo build`` options."""
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="output directory (default: pairs/seedN in the user data folder, $ADAPTIVE_SPEC_HOME or "
        "~/.local/share/adaptive-spec; never the package's built-in pair)",
    )
    parser.add_argument(
        "--corpus", type=Path, default=None, help="directory of .py files (default: this Python's standard library)"
    )
    parser.add_argument(
        "--minutes", type=float, default=DEFAULT_MINUTES,
        help="training budget, split target / draft by ZooConfig.target_share, 85%%/15%% (default: %(default)s)",
    )  # fmt: skip
    parser.add_argument(
        "--seed", type=int, default=0, help="fixes split, init, data order, prompts (default: %(default)s)"
    )
    parser.add_argument(
        "--config", type=Path, default=None,
        help="JSON or YAML file of ZooConfig overrides, e.g. configs/zoo/tiny.yaml (default: the built-in recipe)",
    )  # fmt: skip
    add_progress_option(parser)


def load_config(path: Path | None) -> ZooConfig:
    """A :class:`ZooConfig` from a JSON/YAML file of overrides (nested keys merge into the defaults)."""
    from adaptive_spec.zoo.config import ZooConfig

    if path is None:
        return ZooConfig()
    from adaptive_spec.files import resolve_config

    path = resolve_config(path)
    if not path.is_file():
        raise FileNotFoundError(f"no ZooConfig file {path}; pass an existing JSON or YAML file to --config")
    text = path.read_text(encoding="utf-8")
    if path.suffix in (".yaml", ".yml"):
        import yaml

        overrides = yaml.safe_load(text) or {}
    else:
        overrides = json.loads(text)
    merged = ZooConfig().to_dict()
    for key, value in overrides.items():
        if key not in merged:
            raise ValueError(f"{path}: unknown ZooConfig field {key!r}")
        if isinstance(merged[key], dict) and isinstance(value, dict):
            merged[key] = {**merged[key], **value}
        else:
            merged[key] = value
    return ZooConfig.from_dict(merged)


def run(args: argparse.Namespace) -> int:
    """Build the pair, print its figures as JSON; return the exit status."""
    from adaptive_spec.files import built_pairs_dir
    from adaptive_spec.zoo.build import build_pair

    out = args.out or built_pairs_dir() / f"seed{args.seed}"
    info = build_pair(
        out, corpus=args.corpus, minutes=args.minutes, seed=args.seed, config=load_config(args.config),
        progress=not args.no_progress,
    )  # fmt: skip
    keys = ("params", "target_val_loss", "draft_val_loss", "acceptance", "greedy_agreement", "latency_ms")
    print(json.dumps({k: info[k] for k in keys}, indent=2))
    print(f"wrote {out}; use it with --target {out / 'target'} --draft {out / 'draft'}")
    return 0
