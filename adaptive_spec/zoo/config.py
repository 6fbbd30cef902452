"""Configuration of the built-in model pair: one dataclass per concern, defaults defined once.

The defaults are the recipe that produced the committed pair in ``adaptive_spec/zoo/default``
on a 2-core CPU; see ``build_info.json`` there for the figures they reached.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class ModelSpec:
    """Shape of one Llama-style causal LM (tied input/output embeddings)."""

    hidden_size: int
    num_layers: int
    num_heads: int
    intermediate_size: int
    # The context window: 2048 positions, so that typical chat and summarisation prompts fit.
    # Longer than the training windows (``TrainSpec.seq_len``); RoPE extrapolates past them,
    # with some loss of quality.
    max_positions: int = 2048

    def __post_init__(self) -> None:
        if min(self.hidden_size, self.num_layers, self.num_heads, self.intermediate_size) < 1:
            raise ValueError(f"all sizes must be positive: {self}")
        if self.hidden_size % self.num_heads:
            raise ValueError(f"hidden_size {self.hidden_size} is not divisible by num_heads {self.num_heads}")


@dataclass(frozen=True)
class TrainSpec:
    """Optimisation settings of one training stage (next-token CE for the target, KL for the draft)."""

    lr: float
    batch_size: int
    seq_len: int = 256  # tokens per training window; ~1 KB of Python source at vocab 2048
    weight_decay: float = 0.1
    warmup_steps: int = 50
    min_lr_ratio: float = 0.1  # cosine decay floor, as a fraction of ``lr``
    grad_clip: float = 1.0
    val_every_steps: int = 100
    # Stop after this many optimizer steps even if time remains: a budget in steps, unlike
    # one in minutes, gives the same weights on any machine (set ``--minutes`` generously so
    # that the time budget never binds first).
    max_steps: int | None = None
    # Lightning precision: "bf16-mixed" autocasts the matmuls to bfloat16, about 2.2x faster
    # than "32-true" on CPUs with AMX/AVX512-BF16 (measured on this project's Xeon); the weights
    # and the optimiser state stay float32.
    precision: str = "bf16-mixed"

    def __post_init__(self) -> None:
        if self.lr <= 0 or self.batch_size < 1 or self.seq_len < 2:
            raise ValueError(f"invalid training settings: {self}")
        if not 0 <= self.min_lr_ratio <= 1:
            raise ValueError(f"min_lr_ratio must lie in [0, 1], got {self.min_lr_ratio}")
        if self.max_steps is not None and self.max_steps < 1:
            raise ValueError(f"max_steps must be positive or None, got {self.max_steps}")
        if self.precision not in ("32-true", "bf16-mixed", "16-mixed"):
            raise ValueError(f"precision must be 32-true, bf16-mixed or 16-mixed, got {self.precision!r}")


@dataclass(frozen=True)
class ZooConfig:
    """Everything that determines a built pair, besides the corpus, the seed and the time budget."""

    vocab_size: int = 2048  # byte-level BPE; small enough that the draft's LM head stays cheap
    # ~22M parameters (44 MB in float16; the committed pair must stay under 50 MB). Deep and
    # narrow on purpose: a one-token forward on a small CPU is mostly per-layer overhead, so 12
    # layers of 384 cost several times the draft's forward, where 6 layers of 512 (the same
    # parameters and training cost per token) come too close to it. build_info.json records the
    # latencies measured at build time.
    target: ModelSpec = field(default_factory=lambda: ModelSpec(384, 12, 6, 1024))
    # ~0.5M parameters, one layer: its forward is nearly all framework overhead, so width buys
    # acceptance almost for free; one layer keeps it clearly worse than the target.
    draft: ModelSpec = field(default_factory=lambda: ModelSpec(128, 1, 4, 384))
    # Step budgets, so that a rebuild with the same seed gives the same weights on any machine:
    # 3,000 target steps of 8 x 512 tokens (12.3M tokens, ~3.2 epochs of the stdlib) and 1,200
    # distillation steps for the draft (build_info.json records how long they took).
    target_train: TrainSpec = field(
        default_factory=lambda: TrainSpec(
            lr=1.5e-3, batch_size=8, seq_len=512, warmup_steps=100, val_every_steps=250, max_steps=3000
        )
    )
    draft_train: TrainSpec = field(
        default_factory=lambda: TrainSpec(
            lr=3e-3, batch_size=8, seq_len=512, warmup_steps=50, val_every_steps=200, max_steps=1200
        )
    )
    # Fraction of the time budget given to the target when a time budget binds; the rest distils
    # the draft, which converges much sooner (its steps cost one target forward and a tiny backward).
    target_share: float = 0.85
    heldout_fraction: float = 0.05  # files held out for validation and the built-in prompts
    val_windows: int = 64  # held-out windows of ``seq_len`` tokens for validation losses during training
    eval_windows: int = 64  # held-out windows for the final figures (acceptance, agreement, losses)
    num_prompts: int = 20
    prompt_chars: tuple[int, int] = (100, 300)
    latency_context: int = 128
    latency_repeats: int = 200  # interleaved target/draft steps; the median resists load from other processes
    threads: int = 2  # torch.set_num_threads during the build; these machines have 2 cores
    save_dtype: str = "float16"

    def __post_init__(self) -> None:
        if self.vocab_size < 260:  # 256 bytes + special tokens + a few merges
            raise ValueError(f"vocab_size must be at least 260, got {self.vocab_size}")
        if not 0 < self.target_share < 1:
            raise ValueError(f"target_share must lie in (0, 1), got {self.target_share}")
        if not 0 < self.heldout_fraction < 1:
            raise ValueError(f"heldout_fraction must lie in (0, 1), got {self.heldout_fraction}")
        if self.save_dtype not in ("float16", "bfloat16", "float32"):
            raise ValueError(f"save_dtype must be float16, bfloat16 or float32, got {self.save_dtype}")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ZooConfig:
        """Inverse of :meth:`to_dict`; nested specs may be given as dicts, unknown keys are refused."""
        kw = dict(data)
        for name, spec in (
            ("target", ModelSpec),
            ("draft", ModelSpec),
            ("target_train", TrainSpec),
            ("draft_train", TrainSpec),
        ):
            if isinstance(kw.get(name), dict):
                kw[name] = spec(**kw[name])
        if "prompt_chars" in kw:
            kw["prompt_chars"] = tuple(kw["prompt_chars"])
        return cls(**kw)


# Time budget of ``adaptive-spec zoo build`` in minutes (tokenizer and evaluation come on top).
# Generous on purpose: the default recipe's step budgets (``TrainSpec.max_steps``) bind first on
# the project's machines, so the weights do not depend on the machine's speed.
DEFAULT_MINUTES = 120.0

# Special token: separates files in the training stream; also BOS and padding.
EOS_TOKEN = "<|endoftext|>"


def load_config(path: Path | None) -> ZooConfig:
    """A :class:`ZooConfig` from a JSON/YAML file of overrides (nested keys merge into the defaults)."""
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
