"""``adaptive-spec zoo prompts``: prompt sets drawn from the built-in pair's corpus split.

The built-in prompts (``prompts.jsonl``) are function headers from the held-out files. Two
more sets come from the same split, recomputed from ``build_info.json`` (seed and held-out
fraction), so they never mix training and held-out code:

* ``train``: headers from *training* files, for tuning thresholds and plans (never for
  reporting speed);
* ``heldout2``: a second held-out set, headers from the held-out files that are not among the
  built-in prompts, for reporting speed on prompts no choice was made on.
"""

from __future__ import annotations

import json
from pathlib import Path

SPLITS = ("train", "heldout2")


def prompt_set(split: str, count: int, seed: int = 1, pair_dir: str | Path | None = None) -> list[str]:
    """``count`` prompts of ``split`` (see the module docstring), chosen by ``seed``.

    Raises:
        ValueError: an unknown split, or a pair built from a corpus that is not this Python's stdlib.
    """
    from adaptive_spec.files import default_pair_path, read_prompts
    from adaptive_spec.zoo.build import BUILD_INFO
    from adaptive_spec.zoo.corpus import default_corpus, extract_prompts, split_corpus

    if split not in SPLITS:
        raise ValueError(f"unknown prompt split {split!r}; choose one of {', '.join(SPLITS)}")
    root = Path(pair_dir) if pair_dir is not None else default_pair_path()
    info = json.loads((root / BUILD_INFO).read_text(encoding="utf-8"))
    if info.get("corpus", "stdlib") != "stdlib":
        raise ValueError(f"{root}: built from {info['corpus']}, not the stdlib; prompt sets need that corpus")
    split_files = split_corpus(default_corpus(), info["config"]["heldout_fraction"], info["seed"])
    recorded = set(info.get("heldout_files", []))
    heldout_now = {p.relative_to(split_files.root).as_posix() for p in split_files.heldout}
    if recorded and recorded != heldout_now:
        raise ValueError(
            f"{root}: this Python's stdlib splits into other held-out files than the pair's "
            f"(built with Python {info.get('corpus_python') or info['versions']['python']})"
        )
    lo, hi = info["config"]["prompt_chars"]
    if split == "train":
        return extract_prompts(split_files.train, count, lo, hi, seed)
    builtin = set(read_prompts(root))
    pool = extract_prompts(split_files.heldout, 10 * count, lo, hi, seed, per_file=6)
    return [p for p in pool if p not in builtin][:count]
