"""EAGLE-style draft heads: one decoder layer over the target's own hidden states.

An EAGLE head (Li et al., 2024) drafts from the target's features rather than from tokens alone.
The input at position ``j`` is the fusion ``fc([embed(x_j); f_{j-1}])`` of the token's embedding
(the target's own embedding table, shared, not stored) and the feature ``f_{j-1}`` of the position
before it: the target's last hidden state (after its final norm, the LM head's input) where the
target has computed it, else the head's own output there (drafted positions, and the root, which the
target has not run yet). One Llama decoder layer maps it to ``h_j``, which approximates ``f_j`` and
is fed on to the next drafted position; ``lm_head(h_j)`` gives logits over a *reduced draft
vocabulary* (the most frequent target tokens, as in FR-Spec and EAGLE-3). Tokens outside it get
draft probability 0, which every verifier handles losslessly (the residual reaches them).

Checkpoint layout (``save_pretrained``): ``fc.weight`` [H, 2H], ``midlayer.*`` (one
``LlamaDecoderLayer``), ``lm_head.weight`` [N, H], and EAGLE-3's vocabulary maps ``d2t`` (int64
[N], draft id ``i`` is target id ``i + d2t[i]``) and ``t2d`` (bool [V], which target ids the draft
has). A published EAGLE-3 head does not load as it is: its layer reads ``2H``-wide inputs and fuses
three target layers, where this head fuses the embedding and the last layer through ``fc``.

:class:`EagleRunner` is the engine's runner for a head: the same interface as
:class:`~adaptive_spec.engine.runner.ModelRunner` (chain and block forwards under a tree mask,
commit, rollback), plus :meth:`EagleRunner.set_target_features`, through which the engine hands it
the target's hidden states of committed positions after each target pass.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
from torch import nn
from transformers import LlamaConfig, PreTrainedModel
from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

from adaptive_spec.engine.decoder import decoder_layers, lean_parts
from adaptive_spec.engine.graphs import ModelSlot
from adaptive_spec.engine.runner import ModelRunner

__all__ = ["EagleConfig", "EagleHead", "EagleRunner", "is_eagle_head"]

# transformers 5.x renamed the decoder layers' ``past_key_values`` argument to ``cache``.
_CACHE_KW = "cache" if "cache" in inspect.signature(LlamaDecoderLayer.forward).parameters else "past_key_values"


class EagleConfig(LlamaConfig):
    """A Llama config for one decoder layer plus the head's own fields.

    Attributes:
        draft_vocab_size: the size ``N`` of the reduced draft vocabulary.
        target_vocab_size: the target's vocabulary size ``V`` (``vocab_size`` as well).
    """

    model_type = "adaptive-spec-eagle"

    def __init__(self, draft_vocab_size: int = 8192, target_vocab_size: int | None = None, **kwargs: Any) -> None:
        kwargs.setdefault("num_hidden_layers", 1)
        super().__init__(**kwargs)
        self.draft_vocab_size = int(draft_vocab_size)
        self.target_vocab_size = int(target_vocab_size if target_vocab_size is not None else self.vocab_size)

    @classmethod
    def for_target(cls, target_config: Any, draft_vocab_size: int, **overrides: Any) -> EagleConfig:
        """A head config matching a Llama-like target's width, heads, rotary settings and vocabulary."""
        t = target_config.get_text_config().to_dict()
        keep = (
            "hidden_size",
            "intermediate_size",
            "num_attention_heads",
            "num_key_value_heads",
            "head_dim",
            "hidden_act",
            "max_position_embeddings",
            "rms_norm_eps",
            "rope_parameters",
            "rope_theta",
            "rope_scaling",
            "vocab_size",
            "bos_token_id",
            "eos_token_id",
            "pad_token_id",
            "attention_bias",
            "mlp_bias",
        )
        kw = {k: t[k] for k in keep if k in t}
        kw.update(overrides)
        return cls(draft_vocab_size=draft_vocab_size, target_vocab_size=t["vocab_size"], num_hidden_layers=1, **kw)


class EagleHead(PreTrainedModel):
    """The head: ``fc`` fusion, one decoder layer, a reduced-vocabulary LM head and the vocabulary maps.

    It reads token embeddings from the target (:meth:`bind`), so it runs only beside its target.
    ``forward(input_ids, features, position_ids, attention_mask, cache)`` returns
    ``(logits [1, n, N], hidden [1, n, H])``.
    """

    config_class = EagleConfig
    base_model_prefix = "eagle"
    _supports_sdpa = True
    _no_split_modules = ("LlamaDecoderLayer",)

    def __init__(self, config: EagleConfig) -> None:
        super().__init__(config)
        H = config.hidden_size
        self.fc = nn.Linear(2 * H, H, bias=False)
        self.midlayer = LlamaDecoderLayer(config, layer_idx=0)
        self.lm_head = nn.Linear(H, config.draft_vocab_size, bias=False)
        self.rotary_emb = LlamaRotaryEmbedding(config)
        self.register_buffer("d2t", torch.zeros(config.draft_vocab_size, dtype=torch.long))
        self.register_buffer("t2d", torch.zeros(config.target_vocab_size, dtype=torch.bool))
        self._embed: list[nn.Embedding] = []  # the target's embedding, bound, not a submodule (not saved)
        self.post_init()

    def set_vocabulary(self, token_ids: torch.Tensor) -> None:
        """Set the draft vocabulary: ``token_ids`` (LongTensor[N], distinct target ids, in draft-id order)."""
        ids = token_ids.to(torch.long).cpu()
        if ids.numel() != self.config.draft_vocab_size or ids.unique().numel() != ids.numel():
            raise ValueError(f"the draft vocabulary needs {self.config.draft_vocab_size} distinct target ids")
        self.d2t.copy_(ids - torch.arange(ids.numel()))
        self.t2d.zero_()
        self.t2d[ids] = True

    @property
    def token_ids(self) -> torch.Tensor:
        """LongTensor[N]: the target id of each draft id (``arange(N) + d2t``)."""
        return torch.arange(self.d2t.numel(), device=self.d2t.device) + self.d2t

    def bind(self, target: PreTrainedModel) -> EagleHead:
        """Read token embeddings from ``target``'s input embedding table (shared, never copied)."""
        emb = target.get_input_embeddings()
        if emb.weight.shape != (self.config.target_vocab_size, self.config.hidden_size):
            raise ValueError(
                f"this EAGLE head was trained for a target with a {self.config.target_vocab_size} x "
                f"{self.config.hidden_size} embedding; the target has {tuple(emb.weight.shape)}"
            )
        self._embed = [emb]
        return self

    @property
    def bound(self) -> bool:
        return bool(self._embed)

    def get_input_embeddings(self) -> nn.Module:
        if not self._embed:
            raise ValueError("this EAGLE head is not bound to its target: call head.bind(target)")
        return self._embed[0]

    def get_output_embeddings(self) -> nn.Module:
        return self.lm_head

    def forward(
        self,
        input_ids: torch.Tensor,
        features: torch.Tensor,
        position_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        cache: Any = None,
        lean: tuple[int, int, int] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``input_ids`` [B, n], ``features`` [B, n, H] (the previous position's), additive mask or None.

        ``lean``: the layer's shape from :func:`~adaptive_spec.engine.decoder.lean_parts` to run it with
        :func:`~adaptive_spec.engine.decoder.decoder_layers` (fewer kernels; one row of batch, a ``cache``).
        """
        h = self.hidden_states(input_ids, features, position_ids, attention_mask, cache, lean)
        return self.lm_head(h), h

    def hidden_states(
        self,
        input_ids: torch.Tensor,
        features: torch.Tensor,
        position_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        cache: Any = None,
        lean: tuple[int, int, int] | None = None,
    ) -> torch.Tensor:
        """The layer's output ``h`` [B, n, H] (what :meth:`forward` feeds to ``lm_head``)."""
        emb = self.get_input_embeddings()(input_ids).to(self.fc.weight.dtype)
        x = self.fc(torch.cat([emb, features.to(emb.dtype)], dim=-1))
        pe = self.rotary_emb(x, position_ids)
        if lean is not None and cache is not None:
            return decoder_layers([self.midlayer], lean, x, attention_mask, pe, cache)
        h = self.midlayer(
            x,
            attention_mask=attention_mask,
            position_ids=position_ids,
            use_cache=cache is not None,
            position_embeddings=pe,
            **{_CACHE_KW: cache},
        )
        if isinstance(h, tuple):
            h = h[0]
        return h


def is_eagle_head(model: Any) -> bool:
    return isinstance(model, EagleHead)


class EagleRunner(ModelRunner):
    """The engine's runner for an :class:`EagleHead` (see the module docstring).

    Block rows fed this step remember their position and the feature their children read: the
    target's feature at that position when the engine has handed it over, else the head's output.
    Committing keeps only context rows (the pending chain, fed with target features); accepted
    drafted nodes were fed with the head's own features, so they are fed again, with the target's,
    at the next step, as EAGLE does.
    """

    needs_target_features = True

    def __init__(self, model: EagleHead, keep_hidden: bool = False, slot: ModelSlot | None = None) -> None:
        if not model.bound:
            raise ValueError("this EAGLE head is not bound to its target: call head.bind(target)")
        super().__init__(model, keep_hidden=keep_hidden, input_limit=None, slot=slot)
        self.fast_parts = ()  # explicit masks for chains (the head has no causal mask of its own)
        self.vocab_ids = model.token_ids  # [N] target id of each logit column
        H = model.config.hidden_size
        self._buf = torch.zeros(256, H, dtype=model.dtype, device=model.device)  # target features by position
        self._known = 0
        self._block_pos: list[torch.Tensor] = []  # per forward this step: positions [n]
        self._block_feat: list[torch.Tensor] = []  # per forward this step: the feature each row passes on [n, H]
        self._sealed = False  # this step's block is a captured draft (captured_draft): nothing is fed after it

    def _lean_parts(self, attention: str) -> tuple[int, int, int] | None:
        return lean_parts([self.model.midlayer], attention=attention)  # its one decoder layer

    def _static_capable(self) -> bool:
        return True  # the head's one decoder layer only calls the cache's ``update``

    def _core(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor,
        mask: torch.Tensor | None,
        features: torch.Tensor,
        keep: int | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The head over the static cache: logits of the last ``keep`` rows (None: all), every row's output."""
        logits, h = self.model(input_ids[None], features[None], position_ids[None], mask, self.slot.kv, self.lean)
        return logits[0] if keep is None else logits[0, -keep:], h[0]

    def set_target_features(self, start: int, features: torch.Tensor, known: int | None = None) -> None:
        """The target's hidden states of committed positions ``start .. start + k - 1`` (Tensor[k, H]); ``known``:
        only the first ``known`` rows are committed ones (the rest are copied too, where no later read reaches them
        before they are written again: no slice of ``features``, one op less a step).
        """
        if start > self._known:
            raise RuntimeError(f"target features from position {start}, but only {self._known} are known")
        end = start + features.shape[0]
        if end > self._buf.shape[0]:  # grow by doubling: amortised O(1) per position
            grown = self._buf.new_zeros(max(end, 2 * self._buf.shape[0]), self._buf.shape[1])
            grown[: self._known] = self._buf[: self._known]
            self._buf = grown
        self._buf[start:end] = features  # the copy casts to the buffer's dtype (a `to` first is one more op)
        self._known = end if known is None else start + known

    @property
    def _target(self) -> torch.Tensor:
        """Tensor[known, H]: the target's features of positions ``0 .. known - 1``."""
        return self._buf[: self._known]

    @property
    def known(self) -> int:
        """Number of leading positions whose target feature is known."""
        return self._known

    def _run_model(
        self, input_ids: torch.Tensor, position_ids: torch.Tensor, mask: torch.Tensor | None, logits_to_keep: int
    ) -> torch.Tensor:
        if self._sealed:
            raise RuntimeError("a draft made in one captured replay cannot be extended in the same step")
        row = self.length  # where a lone row (no mask) is written: after every row before it, at that position
        feats = self._input_features(input_ids.numel(), position_ids, mask)
        logits, h = self._static_forward(input_ids, position_ids, mask, logits_to_keep, (feats,))
        # The feature each new row passes on: the target's where known, else the head's own output.
        if mask is None:  # decided on the host: the row is its position
            passed = self._target[row : row + 1] if row < self.known else h
        elif self.known > 0:
            known = position_ids < self.known
            passed = torch.where(known[:, None], self._target[position_ids.clamp(max=self.known - 1)], h)
        else:
            passed = h
        self._block_pos.append(position_ids)
        self._block_feat.append(passed)
        if self.keep_hidden:
            self.hidden = h[-logits_to_keep:]
        return logits

    def _input_features(self, n: int, position_ids: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        """The feature each of ``n`` new rows reads (Tensor[n, H]): a lone row's (no mask) is the row before it's,
        a view; masked rows' their parents', gathered on the device (:meth:`_parent_features`).
        """
        past, H = self.cached, self._target.shape[1]
        # Candidate parents: the last committed row, then the block rows so far (table index 0, 1, ...).
        last = self._target[past - 1 : past] if past > 0 else self._target.new_zeros(1, H)
        if mask is None:  # its parent is the row before it: a view, no gather (position 0: the zero row `last`)
            return self._block_feat[-1][-1:] if self._block_feat else last
        m_before = sum(int(p.numel()) for p in self._block_pos)  # block rows fed earlier this step
        return self._parent_features(last, mask, position_ids, n, past, m_before)

    def _draft_inputs(
        self, ids: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor | None
    ) -> tuple[torch.Tensor, ...] | None:
        """The pending rows' features, as :meth:`_run_model` gives them; None when the root's own target feature is
        known (it never is in a step: the target has not run the root yet), since the captured draft feeds the head's
        outputs on.
        """
        if self.cached + ids.numel() - 1 < self.known:
            return None
        return (self._input_features(ids.numel(), pos, mask),)

    def _draft_level_inputs(self, hidden: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (hidden,)  # a drafted node's parent feature: the head's output there (the target has not run it)

    def _draft_pending_most(self, depth: int) -> int:
        return depth + 1  # the accepted nodes are fed again, with the target's features, then the bonus token

    def _draft_made(self) -> None:
        # The draft's rows' features stay in the graph: a later forward of this step would read no parent's.
        self._sealed = True

    def _parent_features(
        self, last: torch.Tensor, mask: torch.Tensor, position_ids: torch.Tensor, n: int, past: int, m_before: int
    ) -> torch.Tensor:
        """The feature each of ``n`` masked rows reads: its parent's (the nearest allowed column before it), on the
        device without a host sync.
        """
        device = position_ids.device
        table = torch.cat([last, *self._block_feat]) if self._block_feat else last  # [1 + m_before, H]
        # allowed[i, j] over the columns past - 1 .. past + m_before - 1 (last committed row, earlier block rows),
        # then the new rows themselves (a new row's parent may be an earlier new row of a chain).
        allowed = mask[0, 0, :, past - 1 if past > 0 else 0 :] == 0
        if past == 0:
            allowed = torch.cat([torch.zeros(n, 1, dtype=torch.bool, device=device), allowed], dim=1)
        cols = allowed.shape[1]
        own = 1 + m_before + torch.arange(n, device=device)  # each new row's own column
        idx = torch.arange(cols, device=device)
        allowed = allowed & (idx[None, :] < own[:, None])
        parent = torch.where(allowed, idx, -1).max(dim=1).values  # [n]; -1: none (position 0)
        # A parent in this same forward (a chain) is a pending context token: its feature is the target's
        # (the engine feeds chains only of committed tokens, whose features it has handed over).
        in_new = (parent > m_before)[:, None]
        from_table = table[parent.clamp(0, m_before)]
        from_target = self._target[(position_ids - 1).clamp(0, max(self.known - 1, 0))] if self.known else from_table
        zero = torch.zeros((), dtype=table.dtype, device=device)
        feats = torch.where(in_new, from_target, torch.where((parent >= 0)[:, None], from_table, zero))
        if past == 0:  # position 0 has no previous feature
            feats = torch.where((position_ids == 0)[:, None], zero, feats)
        return feats

    def chain_forward(self, tokens: torch.Tensor, logits_to_keep: int) -> torch.Tensor | None:
        logits = super().chain_forward(tokens, logits_to_keep)
        self._block_pos, self._block_feat, self._sealed = [], [], False  # a chain is committed at once
        return logits

    def block_mark(self) -> tuple:
        return (*super().block_mark(), len(self._block_pos))

    def undo_block(self, mark: tuple) -> None:
        super().undo_block(mark)
        del self._block_pos[mark[3] :], self._block_feat[mark[3] :]
        self._sealed = False  # a captured draft's block is undone whole (its mark: before it)

    def commit(self, committed: int, block_rows: torch.Tensor | None) -> None:  # noqa: ARG002
        """Keep the ``committed`` context rows; drafted rows are dropped (fed again with target features)."""
        self.rollback(committed)

    def rollback(self, length: int) -> None:
        super().rollback(length)
        self._block_pos, self._block_feat, self._sealed = [], [], False


def _register() -> None:
    """Let ``AutoConfig``/``AutoModelForCausalLM.from_pretrained`` load a saved head folder."""
    from transformers import AutoConfig, AutoModelForCausalLM

    try:
        AutoConfig.register(EagleConfig.model_type, EagleConfig)
        AutoModelForCausalLM.register(EagleConfig, EagleHead)
    except ValueError:  # already registered (a module reload)
        pass


_register()


def draft_runner(
    draft: Any, keep_hidden: bool = False, input_limit: int | None = None, slot: ModelSlot | None = None
) -> ModelRunner:
    """The draft's runner: an :class:`EagleRunner` for an EAGLE head, else a :class:`ModelRunner`."""
    if is_eagle_head(draft):
        return EagleRunner(draft, keep_hidden=keep_hidden, slot=slot)
    return ModelRunner(draft, keep_hidden=keep_hidden, input_limit=input_limit, slot=slot)
