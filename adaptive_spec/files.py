"""Files every layer reads or writes: the one atomic write, the one prompt reader, and where the
built-in pair lives.

- :func:`atomic_write` / :func:`write_json_atomic`: write through a hidden temporary file in the
  destination's folder, fsync it and rename it into place, so a reader never sees half a file,
  even after a crash;
- :func:`read_prompts`: the prompt reader of every verb that takes prompts (JSON Lines, ``.txt``
  or a pair directory);
- :func:`default_pair_path` / :func:`default_prompts`: the committed built-in pair
  (``adaptive_spec/zoo/default``, built by ``adaptive-spec zoo build``) and its held-out prompts;
- :func:`user_data_dir` / :func:`installed_models_dir` / :func:`built_pairs_dir`: where the
  commands write what they install or build (never into the installed package);
- :func:`config_path` / :func:`resolve_config`: the ``configs/`` files shipped inside the package,
  overridden by a ``configs/`` folder in the working directory.

Standard library only, so any module may import it.
"""

from __future__ import annotations

import gzip
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

__all__ = [
    "CONFIGS",
    "HOME_ENV",
    "PROMPTS",
    "ChatPrompt",
    "atomic_write",
    "built_pairs_dir",
    "config_path",
    "default_pair_path",
    "default_prompts",
    "installed_models_dir",
    "read_prompts",
    "render_prompt",
    "resolve_config",
    "user_data_dir",
    "write_json_atomic",
]

PROMPTS = "prompts.jsonl"
"""The prompt file of a pair directory."""
HOME_ENV = "ADAPTIVE_SPEC_HOME"
"""The environment variable that overrides :func:`user_data_dir`."""
CONFIGS = Path(__file__).resolve().parent / "configs"
"""The ``configs/`` folder shipped inside the package (tuned plans, selector and zoo recipes)."""


def atomic_write(path: str | os.PathLike, data: bytes | str | Callable[[BinaryIO], object]) -> Path:
    """Write ``data`` to ``path`` atomically and durably; returns ``path``.

    ``data`` is bytes, text (written as UTF-8) or a function that writes to a binary file. It goes
    to a hidden temporary file in ``path``'s folder (created if missing), which is flushed,
    fsynced and renamed over ``path``; the folder is then fsynced. On an error the temporary file
    is removed and ``path`` is left as it was.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(data, str):
        data = data.encode("utf-8")
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            if callable(data):
                data(f)
            else:
                f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    _fsync_dir(path.parent)
    return path


def write_json_atomic(data: Any, path: str | os.PathLike) -> Path:
    """Write ``data`` as indented JSON (``default=str``) with :func:`atomic_write`; returns ``path``."""
    return atomic_write(path, json.dumps(data, indent=2, default=str))


def _fsync_dir(directory: Path) -> None:
    """Make a rename durable (POSIX); a no-op where directories cannot be opened (Windows)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def default_pair_path() -> Path:
    """Directory of the committed pair: ``target/``, ``draft/``, ``prompts.jsonl``, ``build_info.json``."""
    return Path(__file__).resolve().parent / "zoo" / "default"


def user_data_dir() -> Path:
    """The folder where commands write what they install or build for later runs.

    ``$ADAPTIVE_SPEC_HOME`` if set; else the platform's per-user data folder:
    ``$XDG_DATA_HOME/adaptive-spec`` (default ``~/.local/share/adaptive-spec``) on Linux,
    ``~/Library/Application Support/adaptive-spec`` on macOS, ``%LOCALAPPDATA%/adaptive-spec`` on
    Windows. Not created here: writers create what they write.
    """
    home = os.environ.get(HOME_ENV)
    if home:
        return Path(home).expanduser()
    if sys.platform == "win32":
        base = Path(os.environ.get("LOCALAPPDATA") or Path.home() / "AppData" / "Local")
    elif sys.platform == "darwin":
        base = Path.home() / "Library" / "Application Support"
    else:
        base = Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share")
    return base / "adaptive-spec"


def installed_models_dir() -> Path:
    """``<user data>/default``: the selector and acceptance model installed for the built-in pair.

    ``selector pipeline --install`` and ``selector acceptance --install`` write here; the lookups
    (``find_selector``, ``find_acceptance_model``) try it before the copies shipped in the package.
    """
    return user_data_dir() / "default"


def built_pairs_dir() -> Path:
    """``<user data>/pairs``: where ``zoo build`` writes a pair when given no ``--out``."""
    return user_data_dir() / "pairs"


def config_path(relpath: str | os.PathLike) -> Path:
    """``configs/<relpath>``: the working directory's copy if it exists, else the one shipped in the package."""
    rel = Path(relpath)
    here = Path.cwd() / "configs" / rel
    return here if here.exists() else CONFIGS / rel


def resolve_config(path: str | os.PathLike) -> Path:
    """``path`` if it exists; else, for a path spelled ``configs/...``, the package's shipped copy.

    So ``--config configs/selector/default.yaml`` works from any directory, an installed wheel
    included. Any other missing path is returned unchanged (the caller reports it).
    """
    path = Path(path)
    if path.exists() or path.is_absolute() or not path.parts or path.parts[0] != "configs":
        return path
    shipped = CONFIGS.joinpath(*path.parts[1:])
    return shipped if shipped.exists() else path


def default_prompts(limit: int | None = None) -> list[str]:
    """The committed pair's built-in prompts (the first ``limit`` of them): function headers with a docstring
    start, from held-out files.
    """
    return read_prompts(default_pair_path(), limit)


def read_prompts(path: str | Path, limit: int | None = None) -> list[str]:
    """Prompts from a file, the one reader of every verb that takes prompts.

    * JSON Lines (``.jsonl``, ``.json``, also ``.gz``-compressed): one object per line with a
      ``prompt`` string or a non-empty ``turns`` list (the first turn is used);
    * ``.txt``: one prompt per non-empty line;
    * a directory: its ``prompts.jsonl``.

    Raises:
        FileNotFoundError: the file does not exist (checked before anything is loaded).
        ValueError: naming the file and the line: invalid JSON, a line that is not an object,
            or an object without a prompt; or a file with no prompts.
    """
    path = Path(path)
    if path.is_dir():
        path = path / PROMPTS
    if not path.is_file():
        raise FileNotFoundError(f"prompt file {path} does not exist")
    opener = gzip.open if path.suffix == ".gz" else open
    plain_text = path.name.removesuffix(".gz").endswith(".txt")
    prompts: list[str] = []
    try:
        with opener(path, "rt", encoding="utf-8-sig") as f:
            for line_no, line in enumerate(f, 1):
                if not line.strip():
                    continue
                if plain_text:
                    prompts.append(line.rstrip("\n"))
                else:
                    prompts.append(_prompt_record(line, path, line_no))
                if limit is not None and len(prompts) >= limit:
                    break
    except (UnicodeDecodeError, gzip.BadGzipFile, EOFError) as err:
        raise ValueError(f"{path}: cannot read it as UTF-8 text ({err})") from None
    if not prompts:
        raise ValueError(f"{path}: no prompts")
    return prompts


def _prompt_record(line: str, path: Path, line_no: int) -> str:
    try:
        record = json.loads(line)
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}:{line_no}: not valid JSON ({err.msg} at column {err.colno})") from None
    if not isinstance(record, dict):
        raise ValueError(
            f'{path}:{line_no}: expected a JSON object like {{"prompt": "..."}}, got a {type(record).__name__}'
        )
    if isinstance(record.get("prompt"), str):
        return record["prompt"]
    if isinstance(record.get("turns"), list) and record["turns"]:
        return ChatPrompt(str(record["turns"][0]), [{"role": "user", "content": str(record["turns"][0])}])
    messages = record.get("messages")
    if isinstance(messages, list) and messages and all(isinstance(m, dict) and "content" in m for m in messages):
        return ChatPrompt(str(messages[-1]["content"]), [dict(m) for m in messages])
    raise ValueError(
        f"{path}:{line_no}: a record needs a 'prompt' string, a non-empty 'turns' list or a 'messages' list"
    )


class ChatPrompt(str):
    """A prompt read from a chat record (``turns`` or ``messages``): the text of its last user turn,
    with the whole chat in ``messages``, for a model's chat template to render
    (:func:`render_prompt`). Used as a plain string, it is that turn's text.
    """

    messages: list[dict[str, Any]]

    def __new__(cls, text: str, messages: list[dict[str, Any]]) -> ChatPrompt:
        out = super().__new__(cls, text)
        out.messages = messages
        return out


def render_prompt(tokenizer: Any, prompt: str) -> str | list[int]:
    """``prompt`` as a model takes it: a :class:`ChatPrompt` rendered by the tokenizer's chat template (token
    ids, the assistant's turn opened) when the tokenizer has one; anything else unchanged.
    """
    if isinstance(prompt, ChatPrompt) and getattr(tokenizer, "chat_template", None):
        out = tokenizer.apply_chat_template(prompt.messages, add_generation_prompt=True, tokenize=True)
        if isinstance(out, dict) or hasattr(out, "keys"):
            out = out["input_ids"]
        return list(out)
    return prompt
