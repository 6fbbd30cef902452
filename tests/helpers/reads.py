"""Counting host reads (``Tensor.tolist``, ``Tensor.item``) in a block of code."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch


@contextmanager
def counted_reads() -> Iterator[list[int]]:
    """Within the block, every ``Tensor.tolist`` and ``Tensor.item`` appends its tensor's size to the yielded list
    (then restored)."""
    reads: list[int] = []
    real_tolist, real_item = torch.Tensor.tolist, torch.Tensor.item

    def counted_tolist(t: torch.Tensor):
        reads.append(t.numel())
        return real_tolist(t)

    def counted_item(t: torch.Tensor):
        reads.append(t.numel())
        return real_item(t)

    torch.Tensor.tolist, torch.Tensor.item = counted_tolist, counted_item
    try:
        yield reads
    finally:
        torch.Tensor.tolist, torch.Tensor.item = real_tolist, real_item
