"""The fast path's decoder layers: transformers' Llama / Qwen2 arithmetic in fewer kernels.

On a GPU a small model's captured pass is bound by its kernel count (SmolLM2-135M's one-row pass is about
a thousand small kernels, 36 a layer), not by its weights. :func:`decoder_layers` runs the same layers
(a pre-norm attention block with rotary positions and grouped keys and values, then a gated MLP), reading
the modules' weights, with fewer kernels a layer:

- **RMSNorm** (the layers' two and the model's final one: :func:`rms`) is ``torch.nn.functional.rms_norm``:
  one fused kernel where torch has one (CUDA), the arithmetic of transformers' ``LlamaRMSNorm`` elsewhere
  (pow, mean, add, rsqrt, mul, mul; bit for bit in float32). In half precision transformers casts the
  normalised rows before the weight's product: so does this.
- **Rotary positions** of the queries and keys at once, in one tensor: ``x·cos + roll(x)·sin±``, where
  ``sin±`` (made once a pass) carries ``rotate_half``'s signs: five kernels for both (the cat included),
  transformers' ten
  (``q·cos + cat(−q₂, q₁)·sin``, then the same for the keys), with the same values bit for bit.
- **Grouped keys and values are never repeated.** The query heads that share a key head are stacked as rows
  of one attention (transformers does so for one row: ``pack_gqa``), the mask repeated once a pass for
  them, where transformers' ``repeat_kv`` copies every layer's keys and values over the cache's rows, as
  many times as heads share them, for every block of more than one row.
- **Attention in one of two forms**, chosen by the cache (its ``attention_form``, ``"sdpa"`` unless a captured pass says
  otherwise, :class:`~.graphs.ModelSlot`): ``scaled_dot_product_attention`` (what transformers calls), or
  ``"matmul"``, two batched matrix products and a softmax. A captured pass attends over every row of its static
  cache, masked: on an H200 each key row cost SmolLM2's pass 3.7 µs with the first form (caches of 512 and 2048 rows,
  ``docs/measurements/gpu-h200-2026-11-28c/``), as if a few thread blocks walked all the keys; the matrix
  products spread the keys over the GPU. The slot captures a bucket in both forms, times them and keeps the
  faster (:func:`attention_forms`), for float32 models: in half precision the products would round the scores
  where sdpa sums in float32 (0.05 on a tiny model's bfloat16 logits), so those keep sdpa.
- The projections' own ``forward`` is called (a CPU's per-size weight orders, :mod:`~.layout`, stay), not
  the module: no hook machinery per call (a layer with hooks is not run here).
- **Fused projections in a captured pass**, where the form says so (``"sdpa+fused"``, ``"matmul+fused"``): the
  queries, keys and values in one product with the three weights stacked, and the MLP's gate and up projections in
  another (copies made once per layer, :func:`fused_weights`): three kernels fewer a layer, 90 of SmolLM2's
  thousand a pass. The same dot products, which the GPU's matrix kernels may sum in another order. A slot times
  a bucket in every form and keeps the fastest (:func:`attention_forms`); the eager path (and so a CPU) keeps the
  projections' own ``forward``.

Same values as the modules' own forward on this CPU (tested: logits equal to the layers' within float
rounding, greedy tokens equal to transformers'); a GPU's fused norm rounds its sums in another order.
:func:`lean_parts` says whether a model's layers qualify: loaded with ``attn_implementation="sdpa"`` (the
default; they attend as it does), ``nn.Linear`` projections, RMSNorms with a ``weight`` and a
``variance_epsilon``, no hooks on any part (the modules' own forward would run them); else the runner calls the
layers themselves.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import torch
from torch.nn import functional

from adaptive_spec.engine.layout import version_counter

__all__ = [
    "ATTENTION_FORMS",
    "LINEAR_FORMS",
    "attend",
    "attention_forms",
    "decoder_layers",
    "fused_weights",
    "lean_parts",
    "refresh_fused",
    "rms",
    "split_form",
    "unversioned",
]

#: The forms of attention :func:`attend` knows: torch's fused kernel, then two matrix products and a softmax.
ATTENTION_FORMS = ("sdpa", "matmul")
#: The forms of the projections: each its own product (the modules' ``forward``), or the stacked ones fused.
LINEAR_FORMS = ("split", "fused")


def attention_forms(matmul: bool = True) -> tuple[str, ...]:
    """The forms a captured pass of lean layers is captured in and timed, the first the reference: each attention
    form (:data:`ATTENTION_FORMS`; ``matmul=False``: ``sdpa`` alone, as half precision keeps) with the projections
    split and fused (:data:`LINEAR_FORMS`), written ``"sdpa"``, ``"sdpa+fused"``, ``"matmul"``, ``"matmul+fused"``.
    The environment's ``ADAPTIVE_SPEC_ATTENTION`` (``sdpa`` or ``matmul``) and ``ADAPTIVE_SPEC_LINEARS`` (``split``
    or ``fused``) each keep one.
    """
    attention = _chosen("ADAPTIVE_SPEC_ATTENTION", ATTENTION_FORMS if matmul else ATTENTION_FORMS[:1])
    linears = _chosen("ADAPTIVE_SPEC_LINEARS", LINEAR_FORMS)
    return tuple(a if lin == "split" else f"{a}+{lin}" for a in attention for lin in linears)


def _chosen(variable: str, forms: tuple[str, ...]) -> tuple[str, ...]:
    chosen = os.environ.get(variable, "").strip().lower()
    if not chosen:
        return forms
    known = ATTENTION_FORMS if variable.endswith("ATTENTION") else LINEAR_FORMS
    if chosen not in known:
        raise ValueError(f"{variable}={chosen!r}: use one of {', '.join(known)}, or leave it unset")
    return (chosen,) if chosen in forms else forms[:1]


def split_form(form: str) -> tuple[str, str]:
    """``(attention form, linear form)`` of a capture form (:func:`attention_forms`): ``"matmul+fused"`` ->
    ``("matmul", "fused")``, ``"sdpa"`` -> ``("sdpa", "split")``.
    """
    attention, _, linears = form.partition("+")
    return attention, linears or "split"


class _Fused:
    """A layer's stacked projection weights (:func:`fused_weights`), with the weights they were made from."""

    def __init__(self, layer: torch.nn.Module) -> None:
        qkv, gate_up = self._groups(layer)
        self.sources = self._sources(layer)
        self.sizes = [lin.out_features for lin in qkv]
        self.qkv, self.qkv_bias = _stacked(qkv)
        self.gate_up, self.gate_up_bias = _stacked(gate_up)
        self.gate_up_sizes = [lin.out_features for lin in gate_up]

    @staticmethod
    def _groups(layer: torch.nn.Module) -> tuple[tuple[torch.nn.Linear, ...], tuple[torch.nn.Linear, ...]]:
        """The projections stacked: the queries', keys' and values'; the MLP's gate and up."""
        attn, mlp = layer.self_attn, layer.mlp
        return (attn.q_proj, attn.k_proj, attn.v_proj), (mlp.gate_proj, mlp.up_proj)

    @classmethod
    def _sources(cls, layer: torch.nn.Module) -> tuple:
        """Each stacked weight's and bias's storage, version counter, dtype and device (None for a missing bias)."""
        tensors = [t for group in cls._groups(layer) for lin in group for t in (lin.weight, lin.bias)]
        # no version counter (an inference tensor): a captured slot never uses the stacked copies (ModelSlot.untracked)
        return tuple(None if t is None else (t.data_ptr(), version_counter(t), t.dtype, t.device) for t in tensors)

    def refresh(self, layer: torch.nn.Module) -> bool:
        """Write the copies again, in place, where the layer's weights were written in place since (same storage, dtype
        and device; a graph that reads the copies then reads the new values). False where a weight was replaced.
        """
        now = self._sources(layer)
        if unversioned(now) != unversioned(self.sources):
            return False
        if now != self.sources:
            with torch.inference_mode():
                for (copy, bias), group in zip(
                    ((self.qkv, self.qkv_bias), (self.gate_up, self.gate_up_bias)), self._groups(layer), strict=True
                ):
                    weight, biases = _stacked(group)
                    copy.copy_(weight)
                    if bias is not None:
                        bias.copy_(biases)
            self.sources = now
        return True


def unversioned(key: Sequence[tuple | None]) -> list[tuple | None]:
    """A weights key's entries (``(storage, version counter, ...)``, or None) without their version counters: equal
    where the same tensors were at most written in place.
    """
    return [k and k[:1] + k[2:] for k in key]


def refresh_fused(model: torch.nn.Module) -> bool:
    """Every layer's stacked copies of ``model`` (:func:`fused_weights`) written again in place where its weights were
    written in place since (:meth:`_Fused.refresh`); False where a layer's weights were replaced instead.
    """
    fresh = True
    for module in model.modules():
        fused = module.__dict__.get("_adaptive_spec_fused")
        if fused is not None and not fused.refresh(module):
            fresh = False
    return fresh


def _stacked(lins: Sequence[torch.nn.Linear]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The projections' weights stacked by output rows, and their biases (zeros where one has none; None if none
    has one).
    """
    weight = torch.cat([lin.weight.detach() for lin in lins])
    if all(lin.bias is None for lin in lins):
        return weight, None
    biases = [lin.bias.detach() if lin.bias is not None else weight.new_zeros(lin.out_features) for lin in lins]
    return weight, torch.cat(biases)


def fused_weights(layer: torch.nn.Module) -> _Fused:
    """``layer``'s stacked query/key/value and gate/up weights, made once and kept on the layer, outside its state dict:
    written again in place when a weight was written in place (a graph reads the copies where they are), made again
    when one was replaced or moved.
    """
    fused = layer.__dict__.get("_adaptive_spec_fused")
    if fused is None or not fused.refresh(layer):
        fused = _Fused(layer)
        layer.__dict__["_adaptive_spec_fused"] = fused
    return fused


def attend(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor | None, scale: float, form: str
) -> torch.Tensor:
    """Attention of ``q`` [1, H, r, d] over ``keys``/``values`` [1, H, W, d] with an additive ``mask`` [1, 1, r, W]
    (None: every key), in ``form`` (:data:`ATTENTION_FORMS`); [1, H, r, d].

    ``"matmul"``: the scores ``scale·q·kᵀ + mask`` in one batched product (the mask its addend), their softmax, then
    the product with the values: the keys are spread over the GPU's blocks by the matrix kernels.
    """
    if form == "sdpa":
        return functional.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=scale)
    if form != "matmul":
        raise ValueError(f"unknown attention form {form!r}: one of {', '.join(ATTENTION_FORMS)}")
    q3, k3, v3 = q[0], keys[0], values[0]
    if mask is None:
        scores = torch.bmm(q3, k3.transpose(1, 2)).mul_(scale)
    else:
        scores = torch.baddbmm(mask[0], q3, k3.transpose(1, 2), alpha=scale)
    return torch.bmm(torch.softmax(scores, dim=-1), v3)[None]


_PROJECTIONS = (("self_attn", ("q_proj", "k_proj", "v_proj", "o_proj")), ("mlp", ("gate_proj", "up_proj", "down_proj")))


def lean_parts(
    layers: Sequence[torch.nn.Module], norm: torch.nn.Module | None = None, attention: str | None = "sdpa"
) -> tuple[int, int, int] | None:
    """``(query heads, key heads, head size)`` when :func:`decoder_layers` can run ``layers`` (and :func:`rms`
    the final ``norm``, if given), else None. ``attention``: the model's ``attn_implementation``; the layers
    attend as ``sdpa`` does, so a model loaded with another keeps its own layers.
    """
    if attention != "sdpa" or (norm is not None and not _plain_rms(norm)):
        return None
    shape = None
    for layer in layers:
        attn, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
        if attn is None or mlp is None or not callable(getattr(mlp, "act_fn", None)):
            return None
        parts = [layer, attn, mlp]
        for owner, names in _PROJECTIONS:
            for name in names:
                lin = getattr(getattr(layer, owner), name, None)
                if not isinstance(lin, torch.nn.Linear):
                    return None
                parts.append(lin)
        for name in ("input_layernorm", "post_attention_layernorm"):
            if not _plain_rms(getattr(layer, name, None)):
                return None
            parts.append(getattr(layer, name))
        if any(m._forward_hooks or m._forward_pre_hooks for m in parts):
            return None
        d = getattr(attn, "head_dim", None)
        if not isinstance(d, int) or d % 2 or attn.q_proj.out_features % d or attn.k_proj.out_features % d:
            return None
        heads, kv_heads = attn.q_proj.out_features // d, attn.k_proj.out_features // d
        if heads % kv_heads or attn.v_proj.out_features != kv_heads * d:
            return None
        if shape not in (None, (heads, kv_heads, d)) or not isinstance(getattr(attn, "scaling", None), float):
            return None
        shape = (heads, kv_heads, d)
    return shape


def _plain_rms(norm: Any) -> bool:
    """Whether ``norm`` is an RMSNorm that :func:`rms` computes: a ``weight``, a ``variance_epsilon``, no hooks."""
    return (
        norm is not None
        and "RMSNorm" in type(norm).__name__
        and isinstance(getattr(norm, "weight", None), torch.Tensor)
        and isinstance(getattr(norm, "variance_epsilon", None), float)
        and not (norm._forward_hooks or norm._forward_pre_hooks)
    )


def rms(x: torch.Tensor, norm: Any) -> torch.Tensor:
    """Transformers' ``LlamaRMSNorm``: normalised in float32, cast back, then times the weight."""
    if x.dtype == torch.float32:
        return functional.rms_norm(x, (x.shape[-1],), norm.weight, norm.variance_epsilon)
    y = functional.rms_norm(x.float(), (x.shape[-1],), None, norm.variance_epsilon).to(x.dtype)
    return norm.weight * y


def decoder_layers(
    layers: Sequence[torch.nn.Module],
    shape: tuple[int, int, int],
    h: torch.Tensor,
    mask: torch.Tensor | None,
    position_embeddings: tuple[torch.Tensor, torch.Tensor],
    cache: Any,
) -> torch.Tensor:
    """Run ``h`` [1, n, hidden] through ``layers`` (see the module docstring), writing each layer's keys and
    values with ``cache.update``; the last layer's output [1, n, hidden]. The attention's form is the cache's
    ``attention_form`` (``"sdpa"`` when it has none; see :func:`attend`), and so are its projections'
    (:func:`split_form`: fused where it ends in ``+fused``).

    ``mask``: additive, [1, 1, n, keys] (None: one row attending to every key); ``position_embeddings``: the
    model's rotary ``(cos, sin)``, [1, n, head size]; ``shape``: :func:`lean_parts`'s.
    """
    heads, kv_heads, d = shape
    n, half, group = h.shape[1], shape[2] // 2, heads // kv_heads
    if mask is None and n > 1:
        raise ValueError("decoder_layers: more than one row needs a mask")
    cos, sin = position_embeddings
    cos = cos.unsqueeze(1)  # [1, 1, n, d]
    sin = torch.cat([-sin[..., :half], sin[..., half:]], dim=-1).unsqueeze(1)  # rotate_half's signs, once a pass
    if mask is not None and group > 1 and n > 1:  # rows (head in group, row), as the stacked queries below
        mask = mask.repeat(1, 1, group, 1)
    form, linears = split_form(getattr(cache, "attention_form", "sdpa"))
    for i, layer in enumerate(layers):
        attn, mlp = layer.self_attn, layer.mlp
        x = rms(h, layer.input_layernorm)
        if linears == "fused":  # one product for the queries, keys and values (the form's: a captured pass)
            fused = fused_weights(layer)
            q, k, v = functional.linear(x, fused.qkv, fused.qkv_bias).split(fused.sizes, dim=-1)
        else:
            q, k, v = attn.q_proj.forward(x), attn.k_proj.forward(x), attn.v_proj.forward(x)
        q = q.view(1, n, heads, d).transpose(1, 2)
        k = k.view(1, n, kv_heads, d).transpose(1, 2)
        v = v.view(1, n, kv_heads, d).transpose(1, 2)
        qk = torch.cat([q, k], dim=1)  # [1, heads + kv_heads, n, d], contiguous
        qk = qk * cos + qk.roll(half, dims=-1) * sin  # rotate_half(x) = roll(x) with the first half negated
        keys, values = cache.update(qk[:, heads:], v, i)
        q = qk[:, :heads].reshape(1, kv_heads, group * n, d)  # a key head's query heads, stacked as rows
        o = attend(q, keys, values, mask, attn.scaling, form)
        o = o.view(1, kv_heads, group, n, d).permute(0, 3, 1, 2, 4).reshape(1, n, heads * d)
        h = h + attn.o_proj.forward(o)
        x = rms(h, layer.post_attention_layernorm)
        if linears == "fused":
            gate, up = functional.linear(x, fused.gate_up, fused.gate_up_bias).split(fused.gate_up_sizes, dim=-1)
        else:
            gate, up = mlp.gate_proj.forward(x), mlp.up_proj.forward(x)
        h = h + mlp.down_proj.forward(mlp.act_fn(gate) * up)
    return h
