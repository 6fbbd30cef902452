"""User-like prompts for a real target's drafts: training sets, and the evaluation-only sets they must avoid.

**Evaluation only** (never trained or tuned on): Spec-Bench's questions
(``adaptive_spec/bench/questions/spec_bench.jsonl.gz``) and the demo's chat prompts
(``adaptive_spec/zoo/<model>/prompts.jsonl``). :func:`exclude_evaluation` drops every training prompt whose
normalised text (case, whitespace and punctuation folded) equals, contains or is contained in one of
theirs (for texts of 24 normalised characters or more), and :func:`check_no_evaluation` refuses a set that
still holds one.

**Training prompt files** (:func:`read_prompt_file`): JSON Lines, one prompt a line, either
``{"prompt": "..."}``, ``{"messages": [{"role": "user", "content": "..."}, ...]}`` (the first user turn is
taken) or ``{"conversations": [{"from": "human", "value": "..."}, ...]}`` (ShareGPT style); an optional
``"domain"`` field is kept. Only the prompts are taken: the target writes the answers. A file's licence is
recorded from a sidecar ``<file>.licence`` (or ``LICENSE``/``LICENCE`` beside it) when there is one.
:data:`PROMPT_SETS` names the public sets shipped with the package: ``self-instruct`` (the 252 user-oriented
instructions and 175 seed tasks of Self-Instruct, Wang et al. 2023, Apache-2.0; prompts only).
``adaptive_spec/zoo/online_prompts.jsonl`` holds this project's own code prompts and prompts of other domains
(written for this project, public domain), for the online-distillation measurement.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import re
import unicodedata
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "ONLINE_PROMPTS",
    "PROMPT_SETS",
    "check_no_evaluation",
    "demo_prompts",
    "evaluation_texts",
    "exclude_evaluation",
    "normalise",
    "read_prompt_file",
    "spec_bench_sample",
]

_PACKAGE = Path(__file__).resolve().parents[1]
SPEC_BENCH = _PACKAGE / "bench" / "questions" / "spec_bench.jsonl.gz"  # read as data: bench is a higher layer
ONLINE_PROMPTS = Path(__file__).resolve().parent / "online_prompts.jsonl"
# Named public prompt sets shipped with the package (prompts only; licence in <file>.licence).
PROMPT_SETS = {"self-instruct": Path(__file__).resolve().parent / "user_prompt_sets" / "self_instruct.jsonl"}
_MIN_CONTAINED = 24


def normalise(text: str) -> str:
    """Lower case, NFKC, punctuation dropped, whitespace folded: what two copies of one prompt share."""
    text = unicodedata.normalize("NFKC", text).casefold()
    text = re.sub(r"[^\w\s]", " ", text)
    return " ".join(text.split())


def demo_prompts(name: str = "smollm2") -> list[str]:
    """The first user turn of each of the demo's prompts (``zoo/<name>/prompts.jsonl``); evaluation only."""
    path = Path(__file__).resolve().parent / name / "prompts.jsonl"
    return [p["text"] for p in _read_jsonl(path)]


def spec_bench_questions() -> list[tuple[int, str, list[str]]]:
    """``(question_id, category, turns)`` of every Spec-Bench question; evaluation only."""
    out = []
    with gzip.open(SPEC_BENCH, "rt", encoding="utf-8") as f:
        for line in f:
            if line.strip():
                rec = json.loads(line)
                out.append((int(rec["question_id"]), str(rec["category"]), [str(t) for t in rec["turns"]]))
    return out


def spec_bench_sample(count: int = 48, max_chars: int = 2000) -> list[str]:
    """A fixed sample of Spec-Bench first turns (evaluation only): ``count`` questions evenly spaced through
    those whose first turn has at most ``max_chars`` characters (long summarisation articles are left out).
    """
    qs = [q for q in spec_bench_questions() if len(q[2][0]) <= max_chars]
    count = max(1, min(count, len(qs)))
    return [qs[i * len(qs) // count][2][0] for i in range(count)]


def evaluation_texts(name: str = "smollm2") -> list[str]:
    """Every text reserved for evaluation: each Spec-Bench turn and each demo prompt."""
    texts = [t for _, _, turns in spec_bench_questions() for t in turns]
    with contextlib.suppress(FileNotFoundError):
        texts += demo_prompts(name)
    return texts


class _Reserved:
    def __init__(self, texts: Iterable[str]) -> None:
        self.exact = {normalise(t) for t in texts}
        self.long = [t for t in self.exact if len(t) >= _MIN_CONTAINED]

    def hit(self, text: str) -> str | None:
        n = normalise(text)
        if n in self.exact:
            return n
        if len(n) >= _MIN_CONTAINED:
            for t in self.long:
                if t in n or n in t:
                    return t
        return None


def evaluation_hit(text: str, name: str = "smollm2") -> str | None:
    """The evaluation-only text that ``text`` equals, holds or is held in (normalised), or None."""
    global _RESERVED
    if _RESERVED is None:
        _RESERVED = _Reserved(evaluation_texts(name))
    return _RESERVED.hit(text)


_RESERVED: _Reserved | None = None


def exclude_evaluation(prompts: Sequence[str], name: str = "smollm2") -> tuple[list[str], int]:
    """``prompts`` without those that match an evaluation-only text (see the module docstring), and duplicates.

    Returns the kept prompts (first copy of each normalised text, in order) and how many were dropped.
    """
    reserved = _Reserved(evaluation_texts(name))
    kept, seen = [], set()
    for p in prompts:
        n = normalise(p)
        if n in seen or reserved.hit(p) is not None:
            continue
        seen.add(n)
        kept.append(p)
    return kept, len(prompts) - len(kept)


def check_no_evaluation(prompts: Sequence[str], what: str, name: str = "smollm2") -> None:
    """Refuse training prompts that hold an evaluation-only text.

    Raises:
        ValueError: one line naming the first such prompt.
    """
    reserved = _Reserved(evaluation_texts(name))
    for i, p in enumerate(prompts):
        if reserved.hit(p) is not None:
            raise ValueError(
                f"{what}: prompt {i} ({p[:60]!r}) is a Spec-Bench question or a demo prompt (evaluation only)"
            )


def _first_user(rec: dict[str, Any]) -> str | None:
    if isinstance(rec.get("prompt"), str):
        return rec["prompt"]
    for m in rec.get("messages") or []:
        if isinstance(m, dict) and m.get("role") == "user" and isinstance(m.get("content"), str):
            return m["content"]
    for m in rec.get("conversations") or []:
        if isinstance(m, dict) and m.get("from") in ("human", "user") and isinstance(m.get("value"), str):
            return m["value"]
    return None


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Records ``{"text", "domain"}`` of a prompt file (see the module docstring)."""
    if not path.is_file():
        raise FileNotFoundError(f"prompt file {path} not found")
    opener = gzip.open if path.suffix == ".gz" else open
    out = []
    with opener(path, "rt", encoding="utf-8") as f:
        for line_no, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(f"{path}, line {line_no}: not JSON ({err.msg})") from None
            text = _first_user(rec) if isinstance(rec, dict) else None
            if not text or not text.strip():
                raise ValueError(
                    f"{path}, line {line_no}: no prompt (want {{'prompt': ...}}, {{'messages': [...]}} "
                    "or {'conversations': [...]})"
                )
            out.append({"text": text.strip(), "domain": rec.get("domain")})
    return out


def read_prompt_file(
    path: str | Path, *, domain: str | None = None, name: str = "smollm2"
) -> tuple[list[str], dict[str, Any]]:
    """The training prompts of a JSONL file (of one ``domain`` if given), evaluation texts excluded.

    Returns the prompts and a description for ``build_info.json``: the file, its licence (from a sidecar,
    else "unknown"), prompts read, kept, and dropped as evaluation texts or duplicates.

    Raises:
        FileNotFoundError: no such file. ValueError: a malformed line (one line naming it), or no prompt left.
    """
    path = Path(path)
    recs = _read_jsonl(path)
    if domain is not None:
        recs = [r for r in recs if r["domain"] == domain]
    kept, dropped = exclude_evaluation([r["text"] for r in recs], name)
    if not kept:
        raise ValueError(f"{path}: no training prompt left (domain {domain!r}, {dropped} dropped as evaluation texts)")
    return kept, {
        "file": str(path),
        "domain": domain,
        "licence": _licence(path),
        "prompts_read": len(recs),
        "prompts_kept": len(kept),
        "dropped_evaluation_or_duplicate": dropped,
        "answers": "written by the target; only the prompts are taken",
    }


def _licence(path: Path) -> str:
    for p in (path.with_name(path.name + ".licence"), path.parent / "LICENSE", path.parent / "LICENCE"):
        if p.is_file():
            return p.read_text(encoding="utf-8").strip().splitlines()[0][:200]
    if path.resolve() == ONLINE_PROMPTS:
        return "written for adaptive-spec (public domain)"
    return "unknown (no <file>.licence beside the file)"
