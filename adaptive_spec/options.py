"""The options several verbs share, each defined once so that it is spelled and explained alike.

- :func:`add_model_options`: ``--target``, ``--draft``, ``--device``, ``--dtype``;
- :func:`add_temperatures_option`: ``--temperatures 0,0.7,1`` (parsed by
  :func:`adaptive_spec.temperatures.parse_temperatures`);
- :func:`add_datastore_option` and :func:`datastore_kwargs`: ``--datastore FILE``, the corpus of ``lookup:WxL+K``;
- :func:`add_progress_option`: ``--no-progress`` (``--quiet`` is a hidden alias);
- :func:`add_json_option`: ``--json PATH``, a file the verb writes;
- :func:`add_limit_option`: ``--limit N``, the first N prompts (:func:`positive_int`: N >= 1);
- :func:`add_out_dir_option` and :func:`out_file`: ``--out DIR``, the folder a verb creates and
  writes its files into, under fixed names (``--json PATH`` is the option that names one file).

Standard library only, so any command module may import it.
"""

from __future__ import annotations

import argparse
from pathlib import Path

__all__ = [
    "MODEL_OPTIONS",
    "add_datastore_option",
    "add_draft_data_option",
    "add_json_option",
    "add_limit_option",
    "add_model_options",
    "add_out_dir_option",
    "add_progress_option",
    "add_temperatures_option",
    "datastore_kwargs",
    "out_file",
    "positive_int",
]

MODEL_OPTIONS = ("target", "draft", "device", "dtype")


def add_model_options(
    parser: argparse.ArgumentParser,
    which: tuple[str, ...] = MODEL_OPTIONS,
    *,
    pair_default: str = "the built-in pair",
    dtype_default: str = "the checkpoint's",
) -> None:
    """Add ``--target``, ``--draft``, ``--device`` and ``--dtype`` (or the subset named in ``which``)."""
    unknown = set(which) - set(MODEL_OPTIONS)
    if unknown:
        raise ValueError(f"unknown model options {sorted(unknown)}; choose from {MODEL_OPTIONS}")
    helps = {
        "target": f"target model: local directory, hub id or short name (builtin, smollm2) (default: {pair_default})",
        "draft": "draft model: local directory, hub id or short name (smollm2-eagle, smollm2-draft) (default: "
        f"{pair_default}; with --target smollm2, smollm2-eagle)",
        "device": "cpu, cuda, cuda:1, ... (default: cuda if available, else cpu)",
        "dtype": f"float32, bfloat16 or float16 (default: {dtype_default})",
    }
    for name in MODEL_OPTIONS:
        if name in which:
            parser.add_argument(f"--{name}", default=None, help=helps[name])


def add_temperatures_option(parser: argparse.ArgumentParser, default: str | None = "0,0.7,1", note: str = "") -> None:
    """Add ``--temperatures``: comma-separated sampling temperatures, 0 = greedy (``note`` adds to the help)."""
    text = "comma-separated sampling temperatures, 0 = greedy, " + (note or "e.g. 0,0.7,1")
    parser.add_argument("--temperatures", default=default, help=f"{text} (default: %(default)s)")


def add_datastore_option(parser: argparse.ArgumentParser) -> None:
    """Add ``--datastore FILE``: the corpus the plans ``lookup:WxL+K/nss`` draft from."""
    parser.add_argument(
        "--datastore",
        default=None,
        metavar="FILE",
        help="the datastore lookup:WxL+K/nss plans draft from (adaptive-spec zoo datastore); 'none' for none "
        "(default: the one shipped for a fetched --target, e.g. smollm2's)",
    )


def datastore_kwargs(value: str | None) -> dict[str, object]:
    """The engine keyword of ``--datastore``: nothing (the shipped default), ``datastore=None`` or the path."""
    if value is None:
        return {}
    return {"datastore": None if value == "none" else Path(value)}


def add_progress_option(parser: argparse.ArgumentParser) -> None:
    """Add ``--no-progress`` (dest ``no_progress``); ``--quiet`` is accepted as a hidden alias."""
    parser.add_argument("--no-progress", action="store_true", help="hide progress bars")
    parser.add_argument("--quiet", dest="no_progress", action="store_true", help=argparse.SUPPRESS)


def add_json_option(parser: argparse.ArgumentParser, what: str = "the results") -> None:
    """Add ``--json PATH``: write ``what`` as JSON to that file."""
    parser.add_argument("--json", type=Path, default=None, metavar="PATH", help=f"write {what} as JSON to PATH")


def add_profile_option(parser: argparse.ArgumentParser) -> None:
    """``--profile PATH``: the latency profile that feeds a selector's latency features."""
    parser.add_argument(
        "--profile",
        default=None,
        metavar="PATH",
        help="latency profile for the selector's latency features (default: the selector's own profile beside its "
        "file, else data/profile/profile.json, else one measured on first use and cached in the user data folder)",
    )


def positive_int(text: str) -> int:
    """An argparse ``type``: a whole number >= 1, else argparse's one-line usage error naming the option."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"takes a whole number >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"takes a whole number >= 1, got {value}")
    return value


def add_limit_option(parser: argparse.ArgumentParser, default: int | None = None, what: str = "prompts") -> None:
    """Add ``--limit N`` (N >= 1): use only the first N ``what``."""
    tail = " (default: %(default)s)" if default is not None else " (default: all)"
    parser.add_argument("--limit", type=positive_int, default=default, help=f"use only the first N {what}{tail}")


def add_out_dir_option(
    parser: argparse.ArgumentParser, files: str, default: str | Path | None = None, *, default_text: str | None = None
) -> None:
    """Add ``--out DIR``: the folder (created) the verb writes ``files`` into.

    ``default_text`` describes a default that :func:`out_file` resolves later (when ``default`` is None).
    """
    shown = default_text if default_text is not None else str(default)
    parser.add_argument(
        "--out",
        type=Path,
        default=default,
        metavar="DIR",
        help=f"folder to write {files} into, created if missing (default: {shown})",
    )


def out_file(out: str | Path, name: str) -> Path:
    """The file ``name`` that a verb writes into its ``--out`` folder ``out``, which is created.

    Args:
        out: the ``--out`` value.
        name: the file's fixed name in the folder, e.g. ``labels.parquet``.

    Raises:
        ValueError: ``out`` ends with ``name``'s suffix (``.parquet``, ``.jsonl``, ``.onnx``, ``.json``):
            ``--out`` names a folder, and the message says which to pass.
    """
    out = Path(out)
    suffix = Path(name).suffix
    if suffix and out.suffix == suffix:
        raise ValueError(
            f"--out is a folder, not a {suffix} file: pass --out {out.parent} to write {out.parent / name}"
        )
    out.mkdir(parents=True, exist_ok=True)
    return out / name


def add_draft_data_option(parser: argparse.ArgumentParser) -> None:
    """Add ``--draft-data DIR``: log every committed position's token, target feature and top-32 law there."""
    parser.add_argument(
        "--draft-data",
        default=None,
        metavar="DIR",
        help="also log the token, the target's feature and its top-32 law of every committed position (a draft log, "
        "for `zoo drafts --from-logs DIR`)",
    )


def parse_device(device: str | None):
    """The ``torch.device`` that ``device`` names (None: the engine's default, cuda if available, else cpu).

    Raises:
        ValueError: not a device string (one line naming it).
    """
    import torch

    try:
        return torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    except (RuntimeError, TypeError) as err:
        raise ValueError(f"device {device!r} is not a device (cpu, cuda, cuda:1, ...): {err}") from None


def device_type(device: str | None) -> str:
    """The kind of device ``device`` names (``"cuda"`` for ``"cuda:1"``; None: the engine's default, cuda if
    available, else cpu).

    Raises:
        ValueError: as :func:`parse_device`.
    """
    return parse_device(device).type
