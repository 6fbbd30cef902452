"""Configuration of the built-in model pair: one dataclass per concern, defaults defined once.

The defaults are the recipe that produced the committed pair in ``adaptive_spec/zoo/default``
on a 2-core CPU; see ``build_info.json`` there for the figures they reached.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class ModelSpec:
    """Shape of one Llama-style causal LM (tied input/output embeddings)."""

    hidden_size: int
    num_layers: int
    num_heads: int
    intermediate_size: int
    # Longer than the training windows so the engine can run past them (RoPE extrapolates,
    # with some loss of quality beyond ``TrainSpec.seq_len``).
    max_positions: int = 1024

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
    # one in minutes, gives the same weights on any machine.
    max_steps: int | None = None

    def __post_init__(self) -> None:
        if self.lr <= 0 or self.batch_size < 1 or self.seq_len < 2:
            raise ValueError(f"invalid training settings: {self}")
        if not 0 <= self.min_lr_ratio <= 1:
            raise ValueError(f"min_lr_ratio must lie in [0, 1], got {self.min_lr_ratio}")


@dataclass(frozen=True)
class ZooConfig:
    """Everything that determines a built pair, besides the corpus, the seed and the time budget."""

    vocab_size: int = 2048  # byte-level BPE; small enough that the draft's LM head stays cheap
    # ~21.5M parameters (43 MB in float16). The draft's one-token forward costs ~0.85 ms of
    # transformers overhead on a 2-core CPU, whatever its size, so the target needs >= ~10 ms:
    # an 11M target (384 x 6 layers, ~6.6 ms) was only 6-8x slower.
    target: ModelSpec = field(default_factory=lambda: ModelSpec(512, 6, 8, 1536))
    # ~0.32M parameters, one layer: its forward costs the same ~0.8 ms of framework overhead as
    # any tiny model, so width buys acceptance for free. Narrower than the 128-wide draft first
    # tried, which imitated an 11M target trained for under an hour so well (KL 0.12) that the
    # target was not clearly better than it (val loss 3.81 vs 3.90).
    draft: ModelSpec = field(default_factory=lambda: ModelSpec(96, 1, 4, 288))
    # Small batches (2048 tokens): on a shared 2-core CPU a step of the target takes seconds, and
    # an hour buys only a few hundred steps, so more updates beat less gradient noise.
    target_train: TrainSpec = field(default_factory=lambda: TrainSpec(lr=2e-3, batch_size=8, warmup_steps=30))
    draft_train: TrainSpec = field(default_factory=lambda: TrainSpec(lr=3e-3, batch_size=8, warmup_steps=30))
    # Fraction of the time budget spent on the target; the rest distils the draft, which converges
    # much sooner (its steps cost one target forward and a tiny backward).
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
        for name, spec in (("target", ModelSpec), ("draft", ModelSpec), ("target_train", TrainSpec),
                           ("draft_train", TrainSpec)):  # fmt: skip
            if isinstance(kw.get(name), dict):
                kw[name] = spec(**kw[name])
        if "prompt_chars" in kw:
            kw["prompt_chars"] = tuple(kw["prompt_chars"])
        return cls(**kw)


# Training budget of ``adaptive-spec zoo build`` in minutes (tokenizer and evaluation come on top).
DEFAULT_MINUTES = 60.0

# Special token: separates files in the training stream; also BOS and padding.
EOS_TOKEN = "<|endoftext|>"
