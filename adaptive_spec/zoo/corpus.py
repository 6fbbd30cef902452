"""Corpus, tokenizer and prompts for the built-in pair: Python source, split by file.

The default corpus is the Python standard library of the running interpreter
(``sysconfig.get_paths()["stdlib"]``), which every machine with Python has. Files are split
into *train* and *held-out* deterministically from the seed; the held-out files give the
validation windows, the evaluation texts and the built-in prompts, so none of them was seen
in training.
"""

from __future__ import annotations

import ast
import random
import sysconfig
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from adaptive_spec.zoo.config import EOS_TOKEN

# Directory names skipped in the stdlib: third-party packages and test suites.
SKIP_DIRS = frozenset({"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__"})


def default_corpus() -> Path:
    """The Python standard library of this interpreter."""
    return Path(sysconfig.get_paths()["stdlib"])


def list_sources(root: Path) -> list[Path]:
    """All ``*.py`` files under ``root`` outside :data:`SKIP_DIRS`, sorted by relative path."""
    root = Path(root)
    if root.is_file():
        return [root]
    files = [p for p in root.rglob("*.py") if not SKIP_DIRS.intersection(p.relative_to(root).parts[:-1])]
    return sorted(files, key=lambda p: p.relative_to(root).as_posix())


def read_source(path: Path) -> str:
    return path.read_text(encoding="utf-8", errors="replace")


@dataclass(frozen=True)
class CorpusSplit:
    """Files of the corpus, split by the seed."""

    root: Path
    train: list[Path]
    heldout: list[Path]


def split_corpus(root: Path, heldout_fraction: float, seed: int) -> CorpusSplit:
    """Shuffle the sorted file list with ``random.Random(seed)`` and hold out a fraction of it.

    Raises:
        ValueError: fewer than two files (both sides of the split need one).
    """
    files = list_sources(root)
    if len(files) < 2:
        raise ValueError(f"need at least two .py files under {root}, found {len(files)}")
    order = list(files)
    random.Random(seed).shuffle(order)
    n_heldout = min(len(files) - 1, max(1, round(heldout_fraction * len(files))))
    heldout = sorted(order[:n_heldout])
    train = sorted(order[n_heldout:])
    return CorpusSplit(root=Path(root), train=train, heldout=heldout)


def train_tokenizer(texts: Sequence[str], vocab_size: int) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer (GPT-2 style: every byte is a token, so nothing is unknown).

    No prefix space is added and nothing is prepended on encoding: code is whitespace-exact,
    and ``decode(encode(text)) == text`` for every string.
    """
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer, length=len(texts))
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=EOS_TOKEN,
        eos_token=EOS_TOKEN,
        pad_token=EOS_TOKEN,
        clean_up_tokenization_spaces=False,
        model_max_length=1024,
    )


def encode_stream(tokenizer: PreTrainedTokenizerFast, texts: Sequence[str]) -> torch.Tensor:
    """Concatenate the token ids of ``texts``, each followed by EOS: LongTensor[N]."""
    ids: list[int] = []
    eos = tokenizer.eos_token_id
    for enc in tokenizer(list(texts), add_special_tokens=False, verbose=False)["input_ids"]:
        ids.extend(enc)
        ids.append(eos)
    return torch.tensor(ids, dtype=torch.long)


class TokenWindows(torch.utils.data.Dataset):
    """Non-overlapping windows of ``seq_len + 1`` tokens over a token stream (input + shifted label)."""

    def __init__(self, tokens: torch.Tensor, seq_len: int) -> None:
        if tokens.ndim != 1:
            raise ValueError(f"expected a 1-D token stream, got shape {tuple(tokens.shape)}")
        if tokens.numel() < seq_len + 1:
            raise ValueError(f"token stream of {tokens.numel()} tokens is shorter than one window ({seq_len + 1})")
        self.tokens = tokens
        self.seq_len = seq_len

    def __len__(self) -> int:
        return (self.tokens.numel() - 1) // self.seq_len

    def __getitem__(self, i: int) -> torch.Tensor:
        start = i * self.seq_len
        return self.tokens[start : start + self.seq_len + 1]  # [seq_len + 1]


def heldout_windows(tokens: torch.Tensor, seq_len: int, count: int, seed: int) -> torch.Tensor:
    """``count`` windows of ``seq_len + 1`` tokens from the held-out stream, chosen by the seed.

    Returns LongTensor[min(count, available), seq_len + 1].
    """
    data = TokenWindows(tokens, seq_len)
    order = torch.randperm(len(data), generator=torch.Generator().manual_seed(seed))[:count]
    return torch.stack([data[int(i)] for i in order.sort().values])


def extract_prompts(
    files: Sequence[Path], count: int, min_chars: int, max_chars: int, seed: int, per_file: int = 2
) -> list[str]:
    """Function signatures with the start of their docstring, from ``files``.

    Each prompt is a dedented ``def`` header (decorators excluded) followed by the first line of
    its docstring and a newline, so a model continues the docstring or the body. Candidates
    between ``min_chars`` and ``max_chars`` long are shuffled by the seed; at most ``per_file``
    are taken from one file, for variety.
    """
    by_file: list[list[str]] = []
    for path in files:
        source = read_source(path)
        try:
            tree = ast.parse(source)
        except (SyntaxError, ValueError):
            continue
        lines = source.splitlines(keepends=True)
        found = []
        for node in ast.walk(tree):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) or not node.body:
                continue
            doc = node.body[0]
            if not (
                isinstance(doc, ast.Expr) and isinstance(doc.value, ast.Constant) and isinstance(doc.value.value, str)
            ):
                continue
            # From the ``def`` line to the docstring's first line, inclusive.
            snippet = textwrap.dedent("".join(lines[node.lineno - 1 : doc.lineno]))
            if min_chars <= len(snippet) <= max_chars and snippet.endswith("\n") and snippet.isascii():
                found.append(snippet)
        if found:
            by_file.append(found)
    rng = random.Random(seed)
    pool = []
    for found in by_file:
        rng.shuffle(found)
        pool.extend(found[:per_file])
    rng.shuffle(pool)
    return pool[:count]
