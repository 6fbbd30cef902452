"""One model with its KV cache: block forwards under a tree mask, and commit/rollback.

Convention (for both models): the cache holds a prefix ``context[:cached]`` of the committed
context; the tokens ``context[cached:]`` are *pending* and are fed, as a causal chain, at the
start of the next block. For the target ``cached == len(context) - 1`` after every step (its
pending token is the last committed one, the tree's root). The draft may lag by one more
token (an accepted leaf is never fed to the draft).

A block is ``pending chain + tree nodes``; block token j has the parent set given by the
caller's ancestor rows, and the KV rows of a block are appended to the cache in order.
Committing keeps ``context[:cached]`` plus chosen block rows (the accepted path), gathered
in place and then cropped.

Models of the fast path (:data:`FAST_PATH_TYPES`) and EAGLE heads keep their keys and values in a
static cache (:class:`~adaptive_spec.engine.static_cache.StaticKV`, allocated once, written in
place; a rollback moves a length), lent by the engine with the model's captured CUDA graphs
(:class:`~adaptive_spec.engine.graphs.ModelSlot`); other architectures use transformers'
``DynamicCache``, cropped with ``Cache.crop`` (which in transformers 5 takes a negative count
of tokens to remove).
"""

from __future__ import annotations

import collections
import functools
import inspect
from collections.abc import Callable, Sequence
from typing import Any

import torch
from transformers import DynamicCache, PreTrainedModel
from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer

from adaptive_spec.engine.decoder import attention_forms, decoder_layers, lean_parts, rms
from adaptive_spec.engine.graphs import ModelSlot
from adaptive_spec.engine.logits import ProbsFn
from adaptive_spec.engine.static_cache import SCRATCH
from adaptive_spec.trees import additive_mask

SUPPORTED_ATTENTION = ("eager", "sdpa")
# Architectures whose forward is embed -> rotary -> decoder layers -> norm -> LM head, with nothing
# else in between: the runner calls those parts itself (the "fast path"), which skips the
# wrappers' per-call work (mask creation, argument checks, output classes). On this CPU that
# is about a third of a one-layer draft's forward. The logits are the same (tested). Their decoder layers
# run as engine.decoder's, in fewer kernels (a layer with hooks: its own modules).
FAST_PATH_TYPES = ("llama", "qwen2")


def _dynamic_cache(model: PreTrainedModel) -> DynamicCache:
    """A new ``DynamicCache`` for ``model``; refused for layers that cannot be gathered row by row."""
    cache = DynamicCache(config=model.config)
    for layer in cache.layers:
        if type(layer) is not DynamicLayer or isinstance(layer, DynamicSlidingWindowLayer):
            raise ValueError(
                f"{type(model).__name__}: cache layer {type(layer).__name__} is not supported "
                "(sliding-window or hybrid caches cannot be gathered row by row); disable sliding windows"
            )
    return cache


class ModelRunner:
    """A causal LM plus its ``DynamicCache``; the engine keeps one per model.

    Attributes:
        model: the transformers model (eval mode).
        input_limit: ids at or above it are fed as ``input_limit - 1`` (None: no limit).
        cache: its ``DynamicCache``.
        cached: number of committed context tokens whose KV rows are in the cache.
        forwards: number of forward passes run so far.
        keep_hidden: whether forwards keep the model's last hidden states (the LM head's
            input) at the rows whose logits they return.
        hidden: with ``keep_hidden``, Tensor[logits_to_keep, H] of the latest forward, else None.
        keep_features: whether forwards keep the last hidden states of *every* row fed (what an
            EAGLE head reads, :mod:`adaptive_spec.engine.eagle`).
        features: with ``keep_features``, Tensor[n, H] over the rows of the latest forward, else None.
    """

    #: Call the parts of known architectures directly (see :data:`FAST_PATH_TYPES`).
    fast_path = True
    #: Run the fast path's decoder layers with :func:`~adaptive_spec.engine.decoder.decoder_layers` (fewer kernels).
    lean_layers = True

    def __init__(
        self,
        model: PreTrainedModel,
        keep_hidden: bool = False,
        input_limit: int | None = None,
        keep_features: bool = False,
        slot: ModelSlot | None = None,
    ) -> None:
        impl = getattr(model.config, "_attn_implementation", None) or "eager"
        if impl not in SUPPORTED_ATTENTION:
            raise ValueError(
                f"{type(model).__name__} uses attn_implementation={impl!r}; tree attention needs a custom 4-D "
                f"mask, supported by {SUPPORTED_ATTENTION}: load it with attn_implementation='sdpa'"
            )
        self.model = model
        # read once: a model's ``device`` and ``dtype`` walk its parameters (a runner lives for one request)
        self._device, self._dtype = model.device, model.dtype
        self.cached = 0
        self.forwards = 0
        self.keep_hidden = keep_hidden
        self.hidden: torch.Tensor | None = None
        self.keep_features = keep_features
        self.features: torch.Tensor | None = None
        # Token ids >= input_limit (ids of the target's vocabulary this model has no embedding
        # for, e.g. a draft with a smaller vocabulary) are read as id input_limit - 1.
        self.input_limit = input_limit
        self.fast_parts = fast_path_parts(model)
        # the fast path's layers in fewer kernels (engine.decoder), where they qualify; else the layers' own forward
        self.lean = self._lean_parts(impl) if self.lean_layers else None
        # the forms a captured pass is captured in, timed, the fastest kept (engine.decoder.attention_forms): attention
        # as sdpa or matrix products, the projections split or fused; in half precision the products' rounding would
        # part from sdpa's float32 sums: sdpa alone there
        full = self.lean is not None and model.dtype == torch.float32
        self.attention_forms = attention_forms(matmul=full) if self.lean is not None else ("sdpa",)
        # The static cache (and captured forwards) of the fast path; None: the DynamicCache above.
        self.slot: ModelSlot | None = None
        if slot is not None or self._static_capable():
            self.slot = slot if slot is not None else ModelSlot(model, 256)
            self.cache = self.slot.kv
        else:
            self.cache = _dynamic_cache(model)
        self.length = 0  # static cache: rows written (committed plus fed this step)
        # EAGLE-style policy trees decided on the device (engine.drafting); off once a step redid its tree on the host
        self.device_policy = True
        # policy trees decided on the device (chains, conf-delayed trunks, EAGLE trees with i.i.d. children): each
        # policy's last stop depths in the request, which choose the level where it reads the host
        # (drafting.chains.look_level)
        self.chain_look: dict[str, collections.deque] = {}

    def _lean_parts(self, attention: str) -> tuple[int, int, int] | None:
        """:func:`~adaptive_spec.engine.decoder.lean_parts` of the fast path's layers and final norm (None: none)."""
        return lean_parts(self.fast_parts[1], self.fast_parts[3], attention) if self.fast_parts else None

    def _static_capable(self) -> bool:
        """Whether this runner can keep a static cache (the fast path's decoder layers only call ``update``)."""
        return self.fast_parts is not None

    @property
    def device(self) -> torch.device:
        """The model's device when the runner was made."""
        return self._device

    @property
    def dtype(self) -> torch.dtype:
        """The model's dtype when the runner was made."""
        return self._dtype

    def cache_length(self) -> int:
        return self.length if self.slot is not None else self.cache.get_seq_length()

    def chain_forward(self, tokens: torch.Tensor, logits_to_keep: int) -> torch.Tensor | None:
        """Feed committed tokens (LongTensor[n]) with the model's own causal mask.

        Returns the last ``logits_to_keep`` logits rows (None when ``tokens`` is empty); the
        tokens become committed cache rows.
        """
        if tokens.numel() == 0:
            return None
        if self.input_limit is not None:
            tokens = tokens.clamp(max=self.input_limit - 1)
        n = tokens.numel()
        pos = torch.arange(self.cached, self.cached + n, device=tokens.device)
        mask = None  # the model's own causal mask
        if self.fast_parts is not None and n > 1:  # the fast path needs it explicit (None: "attend to all")
            mask = additive_mask(
                torch.ones(n, n, dtype=torch.bool, device=tokens.device).tril_(), self.cached, self.dtype
            )
        logits = self._run_model(tokens, pos, mask, logits_to_keep)
        self.forwards += 1
        self.cached += n
        return logits

    def block_forward(
        self,
        input_ids: torch.Tensor,  # [n]
        position_ids: torch.Tensor,  # [n]
        ancestors: torch.Tensor | None,  # [n, m] bool: rows over the m block tokens fed this step (these n last)
        logits_to_keep: int,
    ) -> torch.Tensor:
        """Run ``n`` block tokens against the cache; return logits Tensor[logits_to_keep, V'].

        The cache must hold ``cached`` committed rows plus the ``m - n`` block tokens fed
        earlier in this step. Each new token attends to every committed row and to the block
        tokens marked in its ``ancestors`` row (itself included). ``ancestors=None``: one token
        that attends to every row before it (a chain's next node), with no mask built.
        """
        past = self.cached
        if ancestors is None:
            if input_ids.numel() != 1:
                raise ValueError("block_forward: ancestors=None feeds one token; pass the ancestor rows for more")
            n, m = 1, self.cache_length() - past + 1
        else:
            n, m = ancestors.shape
        if self.input_limit is not None:
            input_ids = input_ids.clamp(max=self.input_limit - 1)
        if self.cache_length() != past + m - n:
            raise RuntimeError(f"cache holds {self.cache_length()} rows, expected {past + m - n}")
        mask = None if ancestors is None else additive_mask(ancestors, past, self.dtype)  # [1, 1, n, past + m]
        self.forwards += 1
        return self._run_model(input_ids, position_ids, mask, logits_to_keep)  # [logits_to_keep, V']

    def captured_draft(
        self,
        pending: torch.Tensor,
        depth: int,
        key: Any,
        make: Callable[[int], tuple],
        fill: Callable[[torch.Tensor], None] | None,
        block: int,
        cuts: bool = True,
    ) -> tuple[torch.Tensor, ...] | None:
        """Feed the ``pending`` tokens (LongTensor[n], root last) and draft after them in one replay of a captured graph
        (:meth:`~adaptive_spec.engine.graphs.ModelSlot.draft_graph`, whose ``make``, ``key`` and ``depth`` the drafter
        gives: :func:`~adaptive_spec.engine.drafting.draft_tree`'s chains, :func:`~.drafting.draft_policy_tree`'s
        EAGLE-style trees); ``fill(noise)`` draws the draft's randomness before the replay (None at temperature 0);
        ``block``: the rows the draft writes after the pending ones (``make(depth)``'s); ``cuts``: whether its cuts at
        lower depths share ``key`` (``draft_graph``'s).
        Returns the graph's outputs, which its next replay overwrites; None: not captured here (no graphs, hidden
        states kept, a block already begun, a failed capture): draft level by level. The pending rows and the fed
        nodes are left in the cache as block rows, as the level-by-level drafter leaves them.
        """
        slot = self.slot
        if slot is None or not slot.graphs_on or self.keep_hidden or self.keep_features or self.length != self.cached:
            return None
        n, start = int(pending.numel()), self.length
        if n < 1 or depth < 1 or block >= SCRATCH:  # a fresh graph's warm-up and timing write scratch rows only
            return None
        ids = pending if self.input_limit is None else pending.clamp(max=self.input_limit - 1)
        pos = torch.arange(start, start + n, device=pending.device)
        causal = None if n == 1 else torch.ones(n, n, dtype=torch.bool, device=pending.device).tril_()
        mask = None if causal is None else additive_mask(causal, start, self.dtype)
        extra = self._draft_inputs(ids, pos, mask)
        if extra is None:
            return None
        slot.ensure(start + n + block, keep=start)
        g = slot.draft_graph(n, depth, key, make, extra, self.attention_forms, self._draft_pending_most, cuts)
        if g is None:
            return None
        out = slot.replay_draft(g, n, start, ids, pos, mask, extra, fill)
        self.length = start + n + block
        self.forwards += depth
        self._draft_made()
        return out

    @property
    def captures_drafts(self) -> bool:
        """Whether this runner's drafts may be made in one captured replay (:meth:`captured_draft`): a slot capturing
        on CUDA, its draft graphs on and none failed (cheap: read every step before any of the captured path's work).
        """
        slot = self.slot
        return slot is not None and slot.graphs_on and slot.drafts_on and slot.draft_failed is None

    def graph_probs(self, probs_fn: ProbsFn) -> ProbsFn | None:
        """``probs_fn`` as a captured draft may record it (reading the slot's copy of its vocabulary map, which outlives
        the request), or None when a graph cannot keep its processors (:meth:`ProbsFn.graph_key`).
        """
        if self.slot is None or probs_fn.graph_key() is None:
            return None
        ids = None if probs_fn.token_ids is None else self.slot.constant("token_ids", probs_fn.token_ids)
        return ProbsFn(probs_fn.processors, probs_fn.vocab_size, probs_fn.one_hot, ids)

    def root_stage(
        self,
        ids: torch.Tensor,
        pos: torch.Tensor,
        mask: torch.Tensor,
        extra: Sequence[torch.Tensor],
        rows: torch.Tensor,
        last: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """In a captured draft (:meth:`captured_draft`): the pending rows' forward as a bucket's, at cache rows
        ``rows``; ``(the root's logits [1, V'], its cache row [1], its position [1], its final hidden state [1, H])``,
        the root being row ``last`` of the bucket.
        """
        kv = self.slot.kv
        kv.rows, kv.width = rows, None
        logits, h = self._core(ids, pos, mask, *extra)  # every pending row's
        root = (logits, rows, pos, h)
        return tuple(t.index_select(0, last) for t in root)

    def level_forward(
        self, tokens: torch.Tensor, rows: torch.Tensor, pos: torch.Tensor, see: torch.Tensor, parents: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """In a captured draft: ``F`` new rows (``tokens``, cache ``rows`` and positions ``pos``, each [F]) attending to
        the cache's columns where ``see`` (BoolTensor[F, capacity]) is True; ``parents`` [F, H]: their parents' final
        hidden states (an EAGLE head's features; a model reads none). ``(logits [F, V'], hidden [F, H])``.
        """
        kv = self.slot.kv
        kv.rows = rows
        zero = torch.zeros((), dtype=kv.keys[0].dtype, device=rows.device)
        lowest = torch.full((), torch.finfo(zero.dtype).min, dtype=zero.dtype, device=rows.device)
        mask = torch.where(see, zero, lowest)[None, None]  # [1, 1, F, capacity]
        fed = tokens if self.input_limit is None else tokens.clamp(max=self.input_limit - 1)
        return self._core(fed, pos, mask, *self._draft_level_inputs(parents))

    def cache_columns(self) -> torch.Tensor:
        """LongTensor[capacity]: the columns a captured pass attends over, ``0 .. capacity - 1``."""
        return torch.arange(self.slot.kv.capacity, device=self.device)

    def _draft_inputs(
        self,
        ids: torch.Tensor,  # noqa: ARG002 - an EAGLE head's features read them
        pos: torch.Tensor,  # noqa: ARG002
        mask: torch.Tensor | None,  # noqa: ARG002
    ) -> tuple[torch.Tensor, ...] | None:
        """The pending rows' inputs to the core beyond ids, positions and mask, for :meth:`captured_draft` (None: the
        draft is made level by level).
        """
        return ()

    def _draft_level_inputs(self, hidden: torch.Tensor) -> tuple[torch.Tensor, ...]:  # noqa: ARG002 - a head's
        """A drafted level's inputs to the core beyond ids, positions and mask, from its parents' final hidden states
        (an EAGLE head's features; none for a model).
        """
        return ()

    def _draft_made(self) -> None:
        """Bookkeeping after :meth:`captured_draft`'s replay (an EAGLE head's)."""

    def _draft_pending_most(self, depth: int) -> int:  # noqa: ARG002 - a head's depends on it
        """The most pending tokens a step after a draft of ``depth`` leaves: a model keeps its accepted nodes' rows, so
        the bonus token and, when every node was accepted, the never-fed leaf.
        """
        return 2

    def block_mark(self) -> tuple:
        """A mark of this step's block so far: :meth:`undo_block` drops the block rows fed after it."""
        return self.cache_length(), self.hidden, self.features

    def undo_block(self, mark: tuple) -> None:
        """Drop the block rows fed since ``mark`` (:meth:`block_mark`), as if they had never been fed."""
        length, self.hidden, self.features = mark[:3]
        self._crop(length)

    def cut_block(self, rows: int) -> None:
        """Keep only the first ``rows`` rows of this step's block, as if the later ones had never been fed (a captured
        draft cut at its policy's stop: its replay wrote every level).
        """
        self._crop(self.cached + rows)

    def _run_model(
        self, input_ids: torch.Tensor, position_ids: torch.Tensor, mask: torch.Tensor | None, logits_to_keep: int
    ) -> torch.Tensor:
        """One forward against the cache, by the fast path or the model's own forward; logits [logits_to_keep, V']."""
        if self.slot is not None:
            logits, h = self._static_forward(input_ids, position_ids, mask, logits_to_keep)
            if self.keep_features:
                self.features = h
            if self.keep_hidden:
                self.hidden = h[-logits_to_keep:]
            return logits
        kwargs = {"attention_mask": mask} if mask is not None else {}
        out = self._forward(
            input_ids=input_ids[None],
            position_ids=position_ids[None],
            past_key_values=self.cache,
            use_cache=True,
            logits_to_keep=logits_to_keep,
            **kwargs,
        )
        return out.logits[0]

    def _static_forward(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor,
        mask: torch.Tensor | None,
        logits_to_keep: int,
        extra: tuple[torch.Tensor, ...] = (),
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``n`` rows written at cache rows ``length ..``: a captured graph's replay, or :meth:`_core` eagerly.

        ``mask``: additive, over the first ``length + n`` rows (None: one row attending to all).
        ``extra``: per-row inputs of the core beyond ids, positions and mask (an EAGLE head's features).
        Returns the last ``logits_to_keep`` logits rows and the final hidden states (every row when
        features are kept or the forward replayed a graph, else the kept rows).
        """
        n, start, slot = input_ids.numel(), self.length, self.slot
        slot.ensure(start + n, keep=start)
        graph = slot.graph(n, self._core, extra, self.attention_forms)
        if graph is not None:
            logits, h = slot.replay(graph, n, start, input_ids, position_ids, mask, extra)
            logits = logits[n - logits_to_keep :]
        else:
            kv = slot.kv
            kv.rows, kv.width = torch.arange(start, start + n, device=input_ids.device), start + n
            logits, h = self._core(input_ids, position_ids, mask, *extra, keep=logits_to_keep)
            kv.width = None
        self.length = start + n
        return logits, h

    def _core(
        self, input_ids: torch.Tensor, position_ids: torch.Tensor, mask: torch.Tensor | None, keep: int | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The fast path: the model's parts called in order (see :data:`FAST_PATH_TYPES`), writing the static cache.

        Returns the logits of the last ``keep`` rows (None: every row) and the final hidden states
        (the LM head's input) of every row when features are kept or ``keep`` is None, else of the
        kept rows. This is the function a :class:`~adaptive_spec.engine.graphs.ModelSlot` captures.
        """
        embed, layers, rotary, norm, head = self.fast_parts
        ids, pos = input_ids[None], position_ids[None]
        h = embed(ids)
        pe = rotary(h, pos)
        if self.lean is not None:
            h = decoder_layers(layers, self.lean, h, mask, pe, self.slot.kv)
            norm = functools.partial(rms, norm=norm)  # the final norm too (one op where torch fuses it)
        else:
            cache = {_cache_kw(type(layers[0])): self.slot.kv}
            for layer in layers:
                h = layer(h, attention_mask=mask, position_ids=pos, use_cache=True, position_embeddings=pe, **cache)
                if isinstance(h, tuple):
                    h = h[0]
        if keep is None or self.keep_features:
            h = norm(h)
            kept = h if keep is None else h[:, -keep:]
        else:
            h = kept = norm(h[:, -keep:])
        return head(kept)[0], h[0]

    def _forward(self, **kwargs):  # the model's own forward (architectures without a fast path)
        if self.keep_features:
            return self._forward_with_features(**kwargs)
        if not self.keep_hidden:
            return self.model(**kwargs)
        # The LM head's input is the last hidden state (after the final norm), already cut to
        # the kept rows: a pre-hook reads it for any causal LM architecture, at no extra cost.
        seen: list[torch.Tensor] = []
        head = self.model.get_output_embeddings()
        handle = head.register_forward_pre_hook(lambda _module, args: seen.append(args[0]))
        try:
            out = self.model(**kwargs)
        finally:
            handle.remove()
        self.hidden = seen[-1][0]  # [logits_to_keep, H]
        return out

    def _forward_with_features(self, **kwargs):
        """The model's forward, keeping every row's last hidden state (the LM head's input) in ``features``."""
        keep = kwargs.pop("logits_to_keep")
        seen: list[torch.Tensor] = []
        head = self.model.get_output_embeddings()
        handle = head.register_forward_pre_hook(lambda _module, args: seen.append(args[0]))
        try:
            out = self.model(logits_to_keep=0, **kwargs)  # every row through the head: the hook sees them all
        finally:
            handle.remove()
        self.features = seen[-1][0]  # [n, H]
        if self.keep_hidden:
            self.hidden = self.features[-keep:]
        out.logits = out.logits[:, -keep:]
        return out

    def commit(self, committed: int, block_rows: torch.Tensor | list[int] | None) -> None:
        """Keep ``committed`` context rows, then the block rows ``block_rows`` (cache indices), drop the rest.

        Args:
            committed: number of leading cache rows that stay as they are.
            block_rows: LongTensor[k] (or a list) of cache row indices (all >= ``committed``) to move, in
                order, to positions ``committed .. committed + k - 1``; None or empty for none. Rows already
                in place (a chain's accepted prefix: ``committed, committed + 1, ...``) move nothing.
        """
        if isinstance(block_rows, list):
            if block_rows == list(range(committed, committed + len(block_rows))):
                self.rollback(committed + len(block_rows))
                return
            block_rows = torch.tensor(block_rows, dtype=torch.long, device=self.device)
        k = 0 if block_rows is None else int(block_rows.numel())
        if k and self.slot is not None:
            self.slot.kv.move(committed, block_rows)
        elif k:
            for layer in self.cache.layers:
                # index_select copies first, so overlapping source and destination are safe.
                layer.keys[..., committed : committed + k, :] = layer.keys.index_select(-2, block_rows)
                layer.values[..., committed : committed + k, :] = layer.values.index_select(-2, block_rows)
        self.rollback(committed + k)

    def rollback(self, length: int) -> None:
        """Crop the cache to its first ``length`` rows and mark them committed."""
        if length > self.cache_length():
            raise RuntimeError(f"cannot roll back a cache of {self.cache_length()} rows to {length}")
        self._crop(length)
        self.cached = length

    def _crop(self, length: int) -> None:
        """Keep the cache's first ``length`` rows (a static cache: only the length moves)."""
        if self.slot is not None:
            self.length = length
        elif self.cache_length() > length:
            self.cache.crop(length - self.cache_length())  # a negative count: drop that many rows


@functools.cache
def _cache_kw(layer_type: type) -> str:
    """The decoder layer's cache argument: ``cache`` in newer transformers 5.x, ``past_key_values`` before."""
    return "cache" if "cache" in inspect.signature(layer_type.forward).parameters else "past_key_values"


def fast_path_parts(model: PreTrainedModel) -> tuple | None:
    """(embed, layers, rotary, norm, head) of a model the runner may call part by part, else None.

    Only :data:`FAST_PATH_TYPES` qualify, without sliding windows, without hooks on the model
    itself or a model spread over devices, and only when every part is where those
    architectures keep it; ``ModelRunner.fast_path = False`` (class attribute) turns
    the fast path off everywhere.
    """
    config = getattr(model, "config", None)
    if not ModelRunner.fast_path or getattr(config, "model_type", None) not in FAST_PATH_TYPES:
        return None
    if getattr(config, "use_sliding_window", False):
        return None
    # Hooks on the model itself (accelerate's device_map dispatch, user hooks) need its own forward.
    if (
        model._forward_hooks
        or model._forward_pre_hooks
        or len(set((getattr(model, "hf_device_map", None) or {}).values())) > 1
    ):
        return None
    inner = getattr(model, "model", None)
    parts = tuple(getattr(inner, name, None) for name in ("embed_tokens", "layers", "rotary_emb", "norm"))
    head = getattr(model, "lm_head", None)
    if inner is None or head is None or any(p is None for p in parts):
        return None
    return (*parts, head)
