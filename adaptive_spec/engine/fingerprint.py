"""Model fingerprints: is the loaded pair the one a tuned plan file was made for?

:func:`model_fingerprint` hashes what identifies a checkpoint and nothing that depends on how it
was loaded: the architecture config (without load-time keys such as ``dtype``, the attention
implementation or the path), the tokenizer's vocabulary, and an evenly spaced sample of a few
weight tensors (input embeddings, output head, the first and last parameters), rounded to
bfloat16 so that the same checkpoint loaded in float32, float16 or bfloat16, on any device,
gives the same fingerprint. It is cheap (a few thousand values per tensor) and deterministic.

Tuned plan files (``configs/plans/in-draft.yaml``) carry the fingerprints of the pair they were
tuned on under ``models: {target: ..., draft: ...}``; :func:`stamp_plan_file` writes them and
:func:`plan_file_matches` checks them. ``adaptive-spec tune stamp`` stamps a file from the
command line.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import torch

__all__ = ["model_fingerprint", "pair_fingerprints", "plan_file_matches", "stamp_plan_file"]

FINGERPRINT_VERSION = 1
_SAMPLE = 4096  # values hashed per tensor
# Config keys set by how a model is loaded or run, not by the checkpoint.
_VOLATILE_KEYS = {
    "transformers_version",
    "dtype",
    "torch_dtype",
    "attn_implementation",
    "use_cache",
    "output_hidden_states",
    "output_attentions",
    "return_dict",
    "quantization_config",
    "device_map",
    "tp_plan",
    "pp_plan",
}


def _config_bytes(model: Any) -> bytes:
    cfg = model.config.to_dict()
    cfg = {k: v for k, v in cfg.items() if not k.startswith("_") and k not in _VOLATILE_KEYS}
    return json.dumps(cfg, sort_keys=True, default=str).encode()


def _tensor_bytes(t: torch.Tensor) -> bytes:
    if t.device.type == "meta":  # offloaded or not materialised: nothing to hash
        return b"meta" + str(tuple(t.shape)).encode()
    flat = t.detach().reshape(-1)
    n = flat.numel()
    if n > _SAMPLE:
        idx = torch.linspace(0, n - 1, _SAMPLE, device=flat.device).long().clamp_(max=n - 1)  # float rounding
        flat = flat[idx]
    if flat.is_floating_point():
        flat = flat.to(torch.bfloat16).float()  # dtype-independent: the checkpoint's values at bf16 precision
    return str(tuple(t.shape)).encode() + flat.cpu().contiguous().numpy().tobytes()


def model_fingerprint(model: Any, tokenizer: Any = None) -> str:
    """A short, deterministic fingerprint of a transformers model (and its tokenizer's vocabulary).

    The same checkpoint gives the same fingerprint whatever the device, dtype (float32, float16,
    bfloat16) or attention implementation it was loaded with; another checkpoint, config or
    vocabulary gives another. Quantized or offloaded weights give another fingerprint.

    Args:
        model: a ``PreTrainedModel``.
        tokenizer: its tokenizer (its ``get_vocab()`` is hashed), or None (as is one without ``get_vocab``).

    Returns:
        ``"v1:"`` followed by 16 hex digits.
    """
    h = hashlib.sha256()
    h.update(_config_bytes(model))
    if callable(getattr(tokenizer, "get_vocab", None)):
        vocab = sorted(tokenizer.get_vocab().items(), key=lambda kv: (kv[1], kv[0]))
        h.update(json.dumps(vocab).encode())
    named = list(model.named_parameters())
    tensors: list[torch.Tensor] = []
    for module in (model.get_input_embeddings(), model.get_output_embeddings()):
        weight = getattr(module, "weight", None) if module is not None else None
        if weight is not None:
            tensors.append(weight)
    if named:
        tensors += [named[0][1], named[-1][1]]
    seen: set[int] = set()
    for t in tensors:
        if id(t) in seen:
            continue
        seen.add(id(t))
        h.update(_tensor_bytes(t))
    return f"v{FINGERPRINT_VERSION}:{h.hexdigest()[:16]}"


def pair_fingerprints(target: Any, draft: Any, tokenizer: Any = None) -> dict[str, str]:
    """``{"target": ..., "draft": ...}``: both models' fingerprints, each with the shared ``tokenizer``."""
    with torch.no_grad():
        return {"target": model_fingerprint(target, tokenizer), "draft": model_fingerprint(draft, tokenizer)}


def plan_file_matches(data: Any, fingerprints: dict[str, str]) -> bool:
    """True when a plan file's ``models`` metadata names exactly this pair (a file without it matches nothing)."""
    models = data.get("models") if isinstance(data, dict) else None
    if not isinstance(models, dict):
        return False
    return models.get("target") == fingerprints["target"] and models.get("draft") == fingerprints["draft"]


def stamp_plan_file(path: str | Path, fingerprints: dict[str, str]) -> Path:
    """Record ``fingerprints`` as the pair a plan file was tuned for (its ``models`` key), keeping the rest.

    Stamp only the pair the file was actually tuned on: the engine then plays its plans by
    default for that pair (and only for it).

    Raises:
        FileNotFoundError: no such file.
        ValueError: not a plan file (no ``plans`` mapping).
    """
    import yaml

    path = Path(path)
    text = path.read_text(encoding="utf-8")
    data = yaml.safe_load(text) or {}
    if not isinstance(data, dict) or not isinstance(data.get("plans"), dict):
        raise ValueError(f"{path} is not a plan file: expected a mapping with a 'plans' mapping")
    header = "".join(line + "\n" for line in text.splitlines() if line.startswith("#"))
    models = {"target": fingerprints["target"], "draft": fingerprints["draft"]}
    data = {"version": data.get("version", 1), "models": models, **{k: v for k, v in data.items() if k != "version"}}
    data["models"] = models
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(header + yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    tmp.replace(path)
    return path
