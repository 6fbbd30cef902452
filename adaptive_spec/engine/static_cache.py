"""Static KV caches: keys and values allocated once, written in place, a rollback moves a length.

A :class:`StaticKV` holds, per decoder layer, ``keys``/``values`` of shape
``[1, kv_heads, capacity + SCRATCH, head_dim]``: views of one buffer, so that a commit moves the rows of
every layer in one copy. A forward writes its ``n`` new rows at the cache
rows in :attr:`StaticKV.rows` (a LongTensor[n] on the device, set by the runner before the
forward) with ``index_copy_``, and the attention reads the buffer's first :attr:`StaticKV.width`
rows (the first ``capacity`` when ``width`` is None, as a captured CUDA graph needs: the additive mask then
hides every row that is not committed or in the block). Nothing is concatenated, so the cost of a
forward does not grow with copies of the cache, and the buffers' addresses never change, so a
CUDA graph captured against them replays for the rest of the cache's life.

The last :data:`SCRATCH` rows are never committed: the padding rows of a captured forward (a
block of ``n`` rows run in a graph of ``bucket >= n`` rows) write their keys and values there,
and no row attends to them: a captured pass reads the first ``capacity`` rows only, where every real row
is written (a slot grows its cache before a block would pass it). A captured pass's attention costs time
for every row it reads, masked or not (3.7 µs a row on an H200 with SmolLM2,
``docs/measurements/gpu-h200-2026-11-28c/``): the 128 scratch rows were read, and masked, until 2026-11-28.

The class speaks transformers' ``Cache`` protocol as far as the decoder layers of the runner's
fast path use it (``update``); the runner (:class:`~adaptive_spec.engine.runner.ModelRunner`)
keeps the committed length itself.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["SCRATCH", "StaticKV", "kv_shape"]

#: Rows after the capacity where padding rows of a captured forward write (the largest bucket).
SCRATCH = 128


def kv_shape(config: Any) -> tuple[int, int, int]:
    """``(layers, kv_heads, head_dim)`` of a Llama-like config (the text config of a composite one)."""
    cfg = config.get_text_config() if hasattr(config, "get_text_config") else config
    heads = int(cfg.num_attention_heads)
    kv_heads = int(getattr(cfg, "num_key_value_heads", None) or heads)
    head_dim = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // heads)
    return int(cfg.num_hidden_layers), kv_heads, head_dim


class StaticKV:
    """Per-layer key and value buffers of a fixed capacity (see the module docstring).

    Args:
        layers, kv_heads, head_dim: the model's attention shape.
        capacity: rows that can be committed (the request's length, rounded up).
        dtype, device: the model's.

    Attributes:
        buffer: Tensor[2 * layers, kv_heads, capacity + SCRATCH, head_dim], every layer's keys, then values.
        keys, values: one Tensor[1, kv_heads, capacity + SCRATCH, head_dim] per layer (views of ``buffer``).
        rows: LongTensor[n], where the next forward's ``n`` rows are written.
        width: how many leading rows the attention reads (None: the first ``capacity``, for a captured forward).
        attention_form: how the lean decoder layers attend (:func:`~.decoder.attend`): ``"sdpa"``, or the form a
            slot sets while it captures a graph (:class:`~.graphs.ModelSlot`).
    """

    def __init__(
        self, layers: int, kv_heads: int, head_dim: int, capacity: int, dtype: torch.dtype, device: torch.device
    ) -> None:
        self.capacity = int(capacity)
        self.buffer = torch.zeros(2 * layers, kv_heads, self.capacity + SCRATCH, head_dim, dtype=dtype, device=device)
        self.keys = [self.buffer[i : i + 1] for i in range(layers)]
        self.values = [self.buffer[layers + i : layers + i + 1] for i in range(layers)]
        self.rows: torch.Tensor = torch.zeros(0, dtype=torch.long, device=device)
        self.width: int | None = None
        self.attention_form = "sdpa"

    @classmethod
    def for_model(cls, model: Any, capacity: int) -> StaticKV:
        """Buffers shaped for ``model``'s decoder layers, in its dtype and on its device."""
        layers, kv_heads, head_dim = kv_shape(model.config)
        return cls(layers, kv_heads, head_dim, capacity, model.dtype, model.device)

    @property
    def total_rows(self) -> int:
        """Rows in each buffer, the scratch rows included."""
        return self.keys[0].shape[2]

    @property
    def device(self) -> torch.device:
        return self.keys[0].device

    def update(
        self,
        key_states: torch.Tensor,
        value_states: torch.Tensor,
        layer_idx: int,
        *args: Any,  # noqa: ARG002 - transformers passes cache kwargs, which a static cache does not need
        **kwargs: Any,  # noqa: ARG002
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write the new rows at :attr:`rows`; the keys and values the attention reads (``width`` rows; the first
        ``capacity`` when ``width`` is None: a captured pass, whose mask is that wide).
        """
        k, v = self.keys[layer_idx], self.values[layer_idx]
        k.index_copy_(2, self.rows, key_states.to(k.dtype))
        v.index_copy_(2, self.rows, value_states.to(v.dtype))
        width = self.capacity if self.width is None else self.width
        return k[:, :, :width], v[:, :, :width]

    def move(self, committed: int, block_rows: torch.Tensor) -> None:
        """Copy the rows ``block_rows`` (LongTensor[k]) of every layer to ``committed .. committed + k - 1``."""
        k = int(block_rows.numel())
        # every layer at once; index_select copies first, so overlapping source and destination are safe
        self.buffer[:, :, committed : committed + k] = self.buffer.index_select(2, block_rows)

    def grown(self, capacity: int, keep: int) -> StaticKV:
        """A larger cache holding this one's first ``keep`` rows."""
        layers, (_, kv_heads, _, head_dim) = len(self.keys), self.keys[0].shape
        out = StaticKV(layers, kv_heads, head_dim, capacity, self.keys[0].dtype, self.device)
        out.buffer[:, :, :keep] = self.buffer[:, :, :keep]
        return out

    # transformers' Cache protocol, as far as a decoder layer may ask
    def get_seq_length(self, layer_idx: int = 0) -> int:  # noqa: ARG002
        return self.capacity

    def __len__(self) -> int:
        return len(self.keys)


def round_capacity(rows: int, quantum: int = 256) -> int:
    """``rows`` rounded up to a multiple of ``quantum`` (so that requests of similar length share graphs)."""
    return max(quantum, -(-int(rows) // quantum) * quantum)
