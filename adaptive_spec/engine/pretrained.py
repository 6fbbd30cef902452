"""Loading a model pair: local folders, short names or hub names (checked before any download), placement.

:func:`load_pair` is the body of :meth:`SpecEngine.from_pretrained
<adaptive_spec.engine.engine.SpecEngine.from_pretrained>`; the other helpers read the facts the
engine needs from a loaded model (logits size, context window, EOS ids) and check that two
tokenizers agree.
"""

from __future__ import annotations

import os
from typing import Any

import torch
from transformers import PreTrainedModel


def parse_dtype(name: str) -> torch.dtype:
    """A dtype from its name: ``float32``/``fp32``, ``bfloat16``/``bf16``, ``float16``/``fp16``."""
    table = {
        "float32": torch.float32,
        "fp32": torch.float32,
        "bfloat16": torch.bfloat16,
        "bf16": torch.bfloat16,
        "float16": torch.float16,
        "fp16": torch.float16,
    }
    if name not in table:
        raise ValueError(f"unknown dtype {name!r}; use one of {', '.join(table)}")
    return table[name]


def check_same_tokenizer(tokenizer: Any, other: Any, vocab_size: int) -> None:
    """Raise a ValueError unless both tokenizers map the same strings to the same ids below ``vocab_size``."""
    a = {k: v for k, v in tokenizer.get_vocab().items() if v < vocab_size}
    b = {k: v for k, v in other.get_vocab().items() if v < vocab_size}
    if a != b:
        diff = sorted(set(a.items()) ^ set(b.items()), key=lambda kv: kv[1])[:3]
        raise ValueError(
            "the target and draft tokenizers differ (speculative decoding needs one shared vocabulary); "
            f"first differences: {diff}"
        )


def place(model: PreTrainedModel, role: str, device: torch.device, dtype: torch.dtype | None) -> PreTrainedModel:
    """``model`` on ``device`` (and in ``dtype``) in eval mode; ``nn.Module.to`` works in place, so say so."""
    import warnings

    moves = []
    if model.device != device and not (model.device.type == device.type and device.index is None):
        moves.append(f"moved from {model.device} to {device}")
    if dtype is not None and model.dtype != dtype:
        moves.append(f"cast from {model.dtype} to {dtype}")
    if moves:
        warnings.warn(
            f"SpecEngine {' and '.join(moves)} the {role} model in place (nn.Module.to); pass a copy to keep yours",
            UserWarning,
            stacklevel=3,
        )
        model = model.to(device=device, dtype=dtype) if dtype is not None else model.to(device)
    return model.eval()


def check_model_path(role: str, path: str) -> None:
    """Refuse at once a model path that looks local but is not a directory (it is never sent to the hub).

    A hub id is ``name`` or ``org/name``; anything with a leading ``/``, ``.`` or ``~``, a
    backslash, more than one ``/`` or a trailing ``/`` is a local path.
    """
    import os

    if os.path.isdir(os.path.expanduser(path)):
        return
    looks_local = (
        path.startswith(("/", ".", "~"))
        or "\\" in path
        or path.count("/") > 1
        or path.endswith("/")
        or os.path.exists(os.path.expanduser(path))
    )
    if looks_local:
        what = "is a file, not a model directory" if os.path.isfile(os.path.expanduser(path)) else "no such directory"
        raise ValueError(f"{role} model {path!r}: {what} (a model directory holds config.json and the weights)")


def load_causal_lm(path: str | os.PathLike, role: str, **kwargs: Any) -> PreTrainedModel:
    """``AutoModelForCausalLM.from_pretrained(path, **kwargs)``, with one line for an unreadable weight file.

    A truncated or corrupt ``*.safetensors`` file (an interrupted download or build) makes
    safetensors raise a ``SafetensorError`` that names no file; this raises a ValueError that
    names it (the first unreadable one in the folder) and how to get it again.
    """
    from safetensors import SafetensorError
    from transformers import AutoModelForCausalLM

    try:
        return AutoModelForCausalLM.from_pretrained(path, **kwargs)
    except SafetensorError as err:
        raise ValueError(
            f"the {role} model's weight file {unreadable_weights(path) or path} cannot be read ({err}): it is "
            "truncated or corrupt. Fetch it again (`adaptive-spec zoo fetch NAME`), rebuild it (`adaptive-spec "
            "zoo drafts NAME` for a head or standalone draft, `adaptive-spec zoo build` for the built-in pair), "
            "or save the model there again"
        ) from None


def unreadable_weights(path: str | os.PathLike) -> str | None:
    """The first ``*.safetensors`` file in the folder ``path`` whose header cannot be read, or None."""
    from pathlib import Path

    from safetensors import SafetensorError, safe_open

    folder = Path(path).expanduser()
    for file in sorted(folder.glob("*.safetensors")) if folder.is_dir() else []:
        try:
            with safe_open(file, "pt"):
                pass
        except (SafetensorError, OSError):
            return str(file)
    return None


def hub_offline() -> bool:
    """Offline mode, read now (``HF_HUB_OFFLINE``/``TRANSFORMERS_OFFLINE``; huggingface_hub reads them at import)."""
    from huggingface_hub import constants

    flags = (os.environ.get("HF_HUB_OFFLINE"), os.environ.get("TRANSFORMERS_OFFLINE"))
    return constants.is_offline_mode() or any((f or "").strip().upper() in ("1", "ON", "YES", "TRUE") for f in flags)


def hub_reachable(timeout: float = 3.0) -> bool:
    """Whether the hub endpoint answers a TCP connection within ``timeout`` seconds (True behind a proxy)."""
    import socket
    from urllib.parse import urlparse

    from huggingface_hub import constants

    if any(os.environ.get(k) for k in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")):
        return True  # the proxy decides; let huggingface_hub try
    url = urlparse(constants.ENDPOINT)
    try:
        socket.create_connection((url.hostname, url.port or (443 if url.scheme == "https" else 80)), timeout).close()
    except OSError:
        return False
    return True


def check_hub_name(role: str, name: str, revision: str | None) -> bool:
    """True when model ``name`` needs no network (a local directory, or a hub name in the local cache).

    A hub name that is neither cached nor reachable (offline mode, or no connection) raises at once.
    """
    if os.path.isdir(os.path.expanduser(name)):
        return True
    from huggingface_hub import try_to_load_from_cache

    try:
        cached = isinstance(try_to_load_from_cache(name, "config.json", revision=revision), str)
    except ValueError:  # not a valid repo id
        raise ValueError(f"{role} model {name!r}: no such directory, and not a valid hub name") from None
    if cached:
        return True
    if hub_offline():
        raise ValueError(
            f"{role} model {name!r} is not a local directory nor in the Hugging Face cache, and the hub is offline "
            "(HF_HUB_OFFLINE=1): download it while online, or give a local model directory"
        )
    if not hub_reachable():
        from huggingface_hub import constants

        raise ValueError(
            f"{role} model {name!r} is not a local directory nor in the Hugging Face cache, and "
            f"{constants.ENDPOINT} cannot be reached: check the network, or give a local model directory"
        )
    return False


def check_accelerate() -> None:
    """device_map needs accelerate: say so in one line rather than from deep inside transformers."""
    import importlib.util

    if importlib.util.find_spec("accelerate") is None:
        raise ValueError("device_map= needs the accelerate package: pip install accelerate")


def logits_size(model: PreTrainedModel) -> int:
    """The size of the model's output rows (its LM head), which may exceed the tokenizer's vocabulary."""
    head = model.get_output_embeddings()
    if head is not None and getattr(head, "weight", None) is not None:
        return int(head.weight.shape[0])
    return int(model.config.get_text_config().vocab_size)


def context_window(model: PreTrainedModel) -> int | None:
    """``max_position_embeddings`` of the model's text config, or None."""
    cfg = model.config.get_text_config()
    w = getattr(cfg, "max_position_embeddings", None)
    return int(w) if w else None


def eos_ids(model: PreTrainedModel, tokenizer: Any) -> set[int]:
    """The model's EOS ids (its generation config, else its config) and the tokenizer's."""
    out: set[int] = set()
    for source in (getattr(model, "generation_config", None), model.config):
        eos = getattr(source, "eos_token_id", None) if source is not None else None
        if eos is not None:
            out.update([eos] if isinstance(eos, int) else list(eos))
            break
    if tokenizer is not None and getattr(tokenizer, "eos_token_id", None) is not None:
        out.add(int(tokenizer.eos_token_id))
    return out


def model_paths(
    target: str | None, draft: str | None, device: Any, device_map: Any, dtype: torch.dtype | None
) -> tuple[str, str, torch.dtype | None]:
    """The pair's folders or hub names, and the dtype to load them in.

    Neither model: the built-in pair. Short names (``builtin``, ``smollm2``, ``smollm2-eagle``,
    ...) resolve to their folders (fetched on first use); both load in float32 on a CPU unless
    ``dtype`` says otherwise (their checkpoints are float16, which is slow on CPUs).
    """
    on_cpu = torch.device(device or "cpu").type == "cpu" and device_map is None
    if target is None and draft is None:
        from adaptive_spec.files import default_pair_path

        root = default_pair_path()
        target, draft = str(root / "target"), str(root / "draft")
        named = True
    else:
        from adaptive_spec.engine.models import SHORT_NAMES, resolve_pair

        named = target in SHORT_NAMES or draft in SHORT_NAMES
        target, draft = resolve_pair(target, draft)
    if target is None or draft is None:
        raise ValueError(
            "give both target and draft, a short-named target (builtin, smollm2) alone, or neither for the "
            "built-in default pair"
        )
    if named and dtype is None and on_cpu:
        dtype = torch.float32
    return str(target), str(draft), dtype


def load_pair(
    target: str | None,
    draft: str | None,
    *,
    device: torch.device | str | None,
    dtype: torch.dtype | str | None,
    attn_implementation: str,
    trust_remote_code: bool,
    local_files_only: bool | None,
    revision: str | None,
    token: str | bool | None,
    quantization_config: Any,
    device_map: str | dict[str, Any] | None,
    offload_folder: str | os.PathLike | None,
) -> tuple[PreTrainedModel, PreTrainedModel, Any, Any]:
    """``(target, draft, tokenizer, draft_tokenizer)`` loaded as :meth:`SpecEngine.from_pretrained` documents.

    ``draft_tokenizer`` is None when the draft was saved without one (it shares the target's).
    """
    from transformers import AutoTokenizer

    if isinstance(dtype, str):
        dtype = parse_dtype(dtype)
    if device is not None and device_map is not None:
        raise ValueError("give device= (both models on one device) or device_map= (the target spread), not both")
    target, draft, dtype = model_paths(target, draft, device, device_map, dtype)
    for role, path in (("target", target), ("draft", draft)):
        check_model_path(role, path)
    if local_files_only is None:
        local_files_only = os.path.isdir(target) and os.path.isdir(draft)
    if not local_files_only:  # hub names: cached, or reachable, or one clear line now
        local_files_only = all([check_hub_name("target", target, revision), check_hub_name("draft", draft, revision)])
    kw: dict[str, Any] = {"trust_remote_code": trust_remote_code, "local_files_only": local_files_only}
    kw.update({k: v for k, v in (("revision", revision), ("token", token)) if v is not None})
    model_kw: dict[str, Any] = {"dtype": dtype or "auto", "attn_implementation": attn_implementation, **kw}
    if quantization_config is not None:
        model_kw["quantization_config"] = quantization_config
    if device_map is not None:
        check_accelerate()
        offload = {"offload_folder": str(offload_folder)} if offload_folder is not None else {}
        target_model = load_causal_lm(target, "target", device_map=device_map, **offload, **model_kw)
        models = [target_model, load_causal_lm(draft, "draft", **model_kw).to(target_model.device)]
    else:
        models = [load_causal_lm(path, role, **model_kw) for role, path in (("target", target), ("draft", draft))]
    tokenizer = AutoTokenizer.from_pretrained(target, **kw)
    try:
        draft_tokenizer = AutoTokenizer.from_pretrained(draft, **kw)
    except (OSError, ValueError):  # a draft saved without its tokenizer shares the target's
        draft_tokenizer = None
    if device is not None:  # models loaded here are ours to move (no in-place warning)
        models = [m.to(torch.device(device)) for m in models]
    return models[0], models[1], tokenizer, draft_tokenizer


def describe_pair(
    target: PreTrainedModel, draft: PreTrainedModel, hidden_sizes: tuple[int, int], vocab_size: int, device: Any
) -> dict[str, Any]:
    """``{"models": ..., "run": ...}`` of a loaded pair (see :meth:`SpecEngine.describe`).

    ``hidden_sizes``: ``(draft, target)``.
    """
    import platform
    from importlib.metadata import PackageNotFoundError, version

    def config(model: PreTrainedModel, hidden: int) -> dict[str, Any]:
        cfg = model.config.to_dict()
        for key in ("_name_or_path", "transformers_version", "dtype", "torch_dtype"):
            cfg.pop(key, None)
        return {
            "config": cfg,
            "dtype": str(model.dtype).removeprefix("torch."),
            "hidden_size": hidden,
            "logits_size": logits_size(model),
        }

    versions = {"python": platform.python_version()}
    for pkg in ("adaptive-spec", "torch", "transformers", "numpy"):
        try:
            versions[pkg] = version(pkg)
        except PackageNotFoundError:
            versions[pkg] = None
    return {
        "models": {
            "target": config(target, hidden_sizes[1]),
            "draft": config(draft, hidden_sizes[0]),
            "vocab_size": vocab_size,
        },
        "run": {
            "target": getattr(target, "name_or_path", "") or None,
            "draft": getattr(draft, "name_or_path", "") or None,
            "device": str(device),
            "versions": versions,
        },
    }
