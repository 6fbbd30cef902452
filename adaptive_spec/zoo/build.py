"""Build the built-in draft/target pair from a corpus of Python source, reproducibly from a seed.

Stages (each in one place): split the corpus by file (``data.split_corpus``), train a
byte-level BPE tokenizer on the training files, train the target by next-token
cross-entropy (``lit_module.LMModule``), distil the draft from the saved target
(``lit_module.DistillModule``), then evaluate the saved pair on held-out text
(``evaluate.evaluate_pair``) and write ``build_info.json`` and ``prompts.jsonl``.

Output layout::

    out_dir/
      target/          config.json, generation_config.json, model.safetensors, tokenizer files
      draft/           the same for the draft (same tokenizer)
      prompts.jsonl    {"prompt": ...} per line, from held-out files
      build_info.json  seed, budget, resolved config, figures, dates

With a time budget the number of optimisation steps depends on the machine's speed; set
``TrainSpec.max_steps`` (and a generous budget) for weights that are identical everywhere.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import platform
import shutil
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightning as L  # noqa: N812 (Lightning's own convention)
import torch
import transformers
from lightning.pytorch.callbacks import TQDMProgressBar
from transformers import AutoTokenizer, PreTrainedModel, PreTrainedTokenizerFast

from adaptive_spec.engine.pretrained import load_causal_lm
from adaptive_spec.files import PROMPTS
from adaptive_spec.zoo.config import DEFAULT_MINUTES, ZooConfig
from adaptive_spec.zoo.corpus import (
    TokenWindows,
    default_corpus,
    encode_stream,
    extract_prompts,
    heldout_windows,
    read_source,
    split_corpus,
    train_tokenizer,
)
from adaptive_spec.zoo.evaluate import evaluate_pair
from adaptive_spec.zoo.lit_module import DistillModule, LMModule, _BudgetedModule
from adaptive_spec.zoo.model import make_llama, num_params

log = logging.getLogger(__name__)

BUILD_INFO = "build_info.json"


def _fit(
    module: _BudgetedModule, train_tokens: torch.Tensor, val: torch.Tensor, budget_s: float, seed: int, progress: bool
) -> dict:
    """Train ``module`` on random windows of ``train_tokens`` until the budget (time or steps) is spent."""
    spec = module.train_spec
    loader = torch.utils.data.DataLoader(
        TokenWindows(train_tokens, spec.seq_len),
        batch_size=spec.batch_size,
        shuffle=True,
        drop_last=True,
        generator=torch.Generator().manual_seed(seed),
    )
    val_loader = torch.utils.data.DataLoader(val, batch_size=spec.batch_size)
    with tempfile.TemporaryDirectory() as root:
        trainer = L.Trainer(
            accelerator="auto",
            devices=1,
            precision=spec.precision,
            max_time=dt.timedelta(seconds=budget_s),
            max_steps=spec.max_steps or -1,
            max_epochs=-1,
            val_check_interval=spec.val_every_steps,
            check_val_every_n_epoch=None,  # validate every ``val_every_steps`` steps, across epochs
            num_sanity_val_steps=0,
            gradient_clip_val=spec.grad_clip,
            enable_checkpointing=False,
            enable_model_summary=False,
            logger=False,
            enable_progress_bar=progress,
            callbacks=[TQDMProgressBar(refresh_rate=1)] if progress else [],
            default_root_dir=root,
        )
        t0 = time.monotonic()
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*does not have many workers.*")
            trainer.fit(module, loader, val_loader)
            train_s = time.monotonic() - t0
            final = trainer.validate(module, val_loader, verbose=False)[0]
    return {
        "steps": module.global_step,
        "train_seconds": round(train_s, 1),
        "tokens_seen": module.global_step * spec.batch_size * spec.seq_len,
        "final_val": {k: round(float(v), 4) for k, v in final.items()},
        "history": [{k: round(v, 4) for k, v in h.items()} for h in module.history],
    }


def _load_average() -> list[float] | None:
    """The machine's 1/5/15-minute load averages, or None where the OS does not tell."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (AttributeError, OSError):
        return None


def _trained_on() -> str:
    """Where the build trained: the accelerator's name, or the CPU's with its core count."""
    if torch.cuda.is_available():
        return f"cuda: {torch.cuda.get_device_name(0)}"
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"cpu: {cpu}, {os.cpu_count()} cores, {torch.get_num_threads()} threads"


def _save(model: PreTrainedModel, tokenizer: PreTrainedTokenizerFast, path: Path, dtype: str) -> None:
    if path.exists():
        shutil.rmtree(path)
    model = model.to(getattr(torch, dtype))
    model.config.use_cache = True
    model.save_pretrained(path, safe_serialization=True)
    tokenizer.save_pretrained(path)


def _load(path: Path) -> PreTrainedModel:
    """A saved model in float32 (the CPU compute dtype), as the evaluation and distillation see it."""
    return load_causal_lm(path, path.name, dtype=torch.float32, local_files_only=True).eval()


@dataclass
class _Data:
    """The corpus split by file, the tokenizer trained on the training files only, tokens and prompts."""

    split: Any
    tokenizer: Any
    train_tokens: torch.Tensor  # [N_train]
    heldout_tokens: torch.Tensor  # [N_heldout]
    prompts: list[str]
    seed: int

    @classmethod
    def prepare(cls, corpus_root: Path, config: ZooConfig, seed: int) -> _Data:
        split = split_corpus(corpus_root, config.heldout_fraction, seed)
        train_texts = [read_source(p) for p in split.train]
        heldout_texts = [read_source(p) for p in split.heldout]
        tokenizer = train_tokenizer(train_texts, config.vocab_size)
        lo, hi = config.prompt_chars
        return cls(
            split,
            tokenizer,
            encode_stream(tokenizer, train_texts),
            encode_stream(tokenizer, heldout_texts),
            extract_prompts(split.heldout, config.num_prompts, lo, hi, seed),
            seed,
        )

    def windows(self, train: Any, count: int, salt: int) -> torch.Tensor:
        """``count`` windows of held-out tokens, at most ``train.seq_len`` long (seeded by ``salt``)."""
        seq_len = min(train.seq_len, self.heldout_tokens.numel() - 1)
        return heldout_windows(self.heldout_tokens, seq_len, count, self.seed + salt)

    def describe(self) -> dict[str, Any]:
        return {
            "corpus_files": {"train": len(self.split.train), "heldout": len(self.split.heldout)},
            "corpus_tokens": {"train": self.train_tokens.numel(), "heldout": self.heldout_tokens.numel()},
            "heldout_files": [p.relative_to(self.split.root).as_posix() for p in self.split.heldout],
            "vocab_size": len(self.tokenizer),
            "num_prompts": len(self.prompts),
        }


def _evaluate_saved(out: Path, data: _Data, config: ZooConfig) -> tuple[dict[str, Any], dict[str, int]]:
    """The pair's figures as saved, on windows of held-out files (drawn with another salt than the validation
    ones), and its parameter counts.
    """
    target, draft = _load(out / "target"), _load(out / "draft")
    eval_windows = data.windows(config.target_train, config.eval_windows, 2)
    eval_texts = [data.tokenizer.decode(w, skip_special_tokens=False) for w in eval_windows]
    figures = evaluate_pair(
        target,
        draft,
        data.tokenizer,
        eval_texts,
        seq_len=config.target_train.seq_len,
        latency_context=config.latency_context,
        latency_repeats=config.latency_repeats,
    )
    return figures, {"target": num_params(target), "draft": num_params(draft)}


def _figures(figures: dict[str, Any], config: ZooConfig) -> dict[str, Any]:
    """The pair's evaluation figures as ``build_info.json`` records them."""
    return {
        "target_val_loss": round(figures["target_val_loss"], 4),
        "draft_val_loss": round(figures["draft_val_loss"], 4),
        "acceptance": round(figures["acceptance"], 4),
        "greedy_agreement": round(figures["greedy_agreement"], 4),
        "kl": round(figures["kl"], 4),
        "eval_positions": figures["positions"],
        "latency_ms": {
            "target": round(figures["target_latency_ms"], 3),
            "draft": round(figures["draft_latency_ms"], 3),
            "ratio": round(figures["latency_ratio"], 2),
            "context": config.latency_context,
            "threads": torch.get_num_threads(),
        },
    }


def _provenance(corpus: Any, load_before: Any, started: dt.datetime) -> dict[str, Any]:
    """Versions, machine, load averages and times of a build."""
    return {
        "versions": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "lightning": L.__version__,
        },
        # The corpus is the standard library of the Python that ran the build, unless --corpus.
        "corpus_python": platform.python_version() if corpus is None else None,
        "machine": platform.machine(),
        "trained_on": _trained_on(),
        # 1-, 5- and 15-minute load averages: an idle 2-core machine reads well under 1 before the
        # build and about 2 (the build's own threads) after it; more means something shared the cores.
        "load_average": {"before": load_before, "after": _load_average()},
        "started": started.isoformat(timespec="seconds"),
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
    }


def build_pair(
    out_dir: str | Path,
    corpus: str | Path | None = None,
    minutes: float = DEFAULT_MINUTES,
    seed: int = 0,
    config: ZooConfig | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """Train a target and a distilled draft on ``corpus`` and save them under ``out_dir``.

    Args:
        out_dir: output directory (created; its ``target/`` and ``draft/`` are replaced).
        corpus: a directory of ``*.py`` files; None for the Python standard library.
        minutes: training budget, split ``config.target_share`` : rest between target and draft.
            Tokenizer training and evaluation come on top (about a minute at the defaults).
        seed: fixes the file split, tokenizer, initialisation, data order and prompts.
        config: sizes and optimisation settings; None for :class:`ZooConfig` defaults.
        progress: show Lightning's progress bars.

    Returns:
        The contents written to ``build_info.json``.
    """
    config = config or ZooConfig()
    if minutes <= 0:
        raise ValueError(f"minutes must be positive, got {minutes}")
    load_before = _load_average()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    corpus_root = Path(corpus) if corpus is not None else default_corpus()
    started = dt.datetime.now(dt.timezone.utc)
    torch.set_num_threads(config.threads)
    L.seed_everything(seed, verbose=False)
    if not progress:
        logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)

    data = _Data.prepare(corpus_root, config, seed)
    budget_s = 60.0 * minutes
    # Target: next-token cross-entropy.
    target = make_llama(config.target, data.tokenizer, seed)
    target_module = LMModule(target, config.target_train, config.target_share * budget_s)
    target_val = data.windows(config.target_train, config.val_windows, 1)
    target_run = _fit(target_module, data.train_tokens, target_val, config.target_share * budget_s, seed, progress)
    _save(target, data.tokenizer, out / "target", config.save_dtype)

    # Draft: distilled from the target as saved (rounded to ``save_dtype``), which is what it will meet.
    teacher = _load(out / "target")
    draft = make_llama(config.draft, data.tokenizer, seed + 1)
    draft_budget_s = (1 - config.target_share) * budget_s
    draft_module = DistillModule(draft, teacher, config.draft_train, draft_budget_s)
    draft_val = data.windows(config.draft_train, config.val_windows, 1)
    draft_run = _fit(draft_module, data.train_tokens, draft_val, draft_budget_s, seed + 1, progress)
    _save(draft, data.tokenizer, out / "draft", config.save_dtype)

    with (out / PROMPTS).open("w", encoding="utf-8") as f:
        for prompt in data.prompts:
            f.write(json.dumps({"prompt": prompt}) + "\n")

    figures, params = _evaluate_saved(out, data, config)
    info = {
        "seed": seed,
        "minutes": minutes,
        "corpus": "stdlib" if corpus is None else str(corpus_root),
        **data.describe(),
        "params": params,
        **_figures(figures, config),
        "training": {"target": target_run, "draft": draft_run},
        "config": config.to_dict(),
        **_provenance(corpus, load_before, started),
    }
    (out / BUILD_INFO).write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
    return info


def load_pair(
    path: str | Path, device: torch.device | str | None = None, dtype: torch.dtype | None = None
) -> tuple[PreTrainedModel, PreTrainedModel, PreTrainedTokenizerFast]:
    """(target, draft, tokenizer) from a directory written by :func:`build_pair`, in eval mode.

    ``dtype`` None means float32 on CPU (half-precision matmuls are slow there) and the
    checkpoint's dtype on other devices.
    """
    path = Path(path)
    device = torch.device(device or "cpu")
    if dtype is None:
        dtype = torch.float32 if device.type == "cpu" else "auto"
    kw = {"dtype": dtype, "local_files_only": True}
    target = load_causal_lm(path / "target", "target", **kw).to(device).eval()
    draft = load_causal_lm(path / "draft", "draft", **kw).to(device).eval()
    tokenizer = AutoTokenizer.from_pretrained(path / "target", local_files_only=True)
    return target, draft, tokenizer


__all__ = ["BUILD_INFO", "PROMPTS", "build_pair", "load_pair"]
