"""Counting host reads (``Tensor.tolist``) in a block of code."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch


@contextmanager
def counted_reads() -> Iterator[list[int]]:
    """Within the block, every ``Tensor.tolist`` appends its tensor's size to the yielded list (then restored)."""
    reads: list[int] = []
    real = torch.Tensor.tolist

    def counted(t: torch.Tensor):
        reads.append(t.numel())
        return real(t)

    torch.Tensor.tolist = counted
    try:
        yield reads
    finally:
        torch.Tensor.tolist = real
