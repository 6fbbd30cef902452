"""A real target's datastore: its own greedy answers to requests, for the corpus lookup ``lookup:WxL+K/nss``.

:func:`build_datastore` has the target answer requests at temperature 0 (every other shard's
requests written by the target itself, the others taken from public prompt sets, as for its drafts:
:mod:`adaptive_spec.zoo.selfdistill`; Spec-Bench's and the demo's prompts are never used), then
indexes the answers' token ids as a :class:`~adaptive_spec.trees.datastore.Datastore`, saved where
:meth:`SpecEngine.from_pretrained <adaptive_spec.engine.SpecEngine.from_pretrained>` finds it for the
model (``adaptive_spec/zoo/<name>/datastore.npz``, the committed copy). Generation is resumable: a
stopped build keeps its finished shards, and a rerun starts where it stopped.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["DATASTORE_SEED", "build_datastore", "datastore_from_conversations"]

DATASTORE_SEED = 7000  # shard i of a datastore's conversations uses seed DATASTORE_SEED + i (its drafts' use 0 up)


def datastore_from_conversations(
    folder: str | Path, vocab_size: int, name: str = "smollm2", base: Any = None, shards: Sequence[int] | None = None
) -> Any:
    """The datastore of the greedy answers in ``folder``'s conversation shards; its ``info`` says what went in.

    Conversations at a temperature above 0 are left out (the corpus predicts what greedy decoding writes),
    and so is any whose request is an evaluation text (a Spec-Bench turn or a demo prompt). An answer that
    repeats an earlier one word for word (a prompt answered twice) is kept once: a copy adds no continuation,
    only weight to that text in the picks. ``base``: a datastore whose texts come first (the new answers are
    appended, those it holds dropped as copies); its ``info`` counts add up with the new ones. ``shards``: read
    only the shards with these numbers (default: all).

    Raises:
        ValueError: no greedy conversation in ``folder``.
    """
    from adaptive_spec.trees.datastore import Datastore
    from adaptive_spec.zoo.selfdistill import read_conversations
    from adaptive_spec.zoo.user_prompts import evaluation_hit

    convs = [c for c in read_conversations(folder, shards) if c["temperature"] == 0]
    clean = [c for c in convs if evaluation_hit(c["request"], name) is None]
    if not clean and base is None:
        raise ValueError(f"no greedy conversation in {folder}: generate some first (adaptive-spec zoo datastore)")
    texts = base.texts() if base is not None else []
    seen = {tuple(t) for t in texts}
    kept = []
    for c in clean:
        key = tuple(c["answer_ids"])
        if key not in seen:
            seen.add(key)
            kept.append(c)
    old = base.info if base is not None else {}
    info = {
        "text": "the target's greedy answers (self-written requests and public prompt sets); no benchmark text",
        "conversations": old.get("conversations", 0) + len(kept),
        "dropped_evaluation": old.get("dropped_evaluation", 0) + len(convs) - len(clean),
        "dropped_duplicates": old.get("dropped_duplicates", 0) + len(clean) - len(kept),
        "user_prompt_conversations": old.get("user_prompt_conversations", 0)
        + sum(c.get("source") == "user prompts" for c in kept),
    }
    store = Datastore.from_texts([*texts, *(c["answer_ids"] for c in kept)], vocab_size, info=info)
    store.info["tokens"] = len(store)
    return store


def build_datastore(
    name: str = "smollm2",
    *,
    work: str | Path | None = None,
    out: str | Path | None = None,
    shards: int = 24,
    batch: int = 48,
    answer_tokens: int = 256,
    prompt_files: Sequence[str | Path] = (),
    minutes: float | None = None,
    device: str = "cpu",
    progress: bool = True,
    repeat_prompts: bool = False,
    extend: bool = False,
) -> dict[str, Any]:
    """Generate ``shards`` shards of ``batch`` greedy conversations into ``work``/conv, then write the datastore.

    ``work``: default ``<user data>/datastore/<name>``. ``out``: the datastore file (default the package's
    ``zoo/<name>/datastore.npz``). ``prompt_files``: JSONL prompt sets whose prompts make every other shard's
    requests (:func:`~adaptive_spec.zoo.user_prompts.read_prompt_file`). ``minutes``: no new shard starts
    after that long; the datastore is written from the shards there are. ``repeat_prompts``: once the prompt
    sets are used up, their shards start them again (the greedy answers repeat, and are dropped), as builds did
    before 2026-12-02; by default those shards are self-written instead. ``extend``: grow the datastore at
    ``out`` instead of writing a new one: its texts are kept, and only the shards after those it records are
    generated (its ``info["shards"]``, up to ``shards``); its recorded command gains this build's. Returns the
    build's record (kept in the file's ``info``) and this run's generation speed.
    """
    import torch
    from transformers import AutoTokenizer

    from adaptive_spec.engine.models import MODELS, fetch_model, shipped_drafts_dir
    from adaptive_spec.engine.pretrained import load_causal_lm
    from adaptive_spec.files import user_data_dir
    from adaptive_spec.trees.datastore import Datastore
    from adaptive_spec.zoo.selfdistill import generate_conversations
    from adaptive_spec.zoo.user_prompts import read_prompt_file

    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; known: {', '.join(sorted(MODELS))}")
    t0 = time.time()
    work = Path(work) if work is not None else user_data_dir() / "datastore" / name
    out = Path(out) if out is not None else shipped_drafts_dir(name) / "datastore.npz"
    base, start = None, 0
    if extend:
        if not out.is_file():
            raise FileNotFoundError(f"--extend: no datastore at {out} to extend; build one first (without --extend)")
        base = Datastore.load(out)
        if base.info.get("model", name) != name:
            raise ValueError(f"--extend: {out} is {base.info['model']}'s datastore, not {name}'s")
        start = int(base.info.get("shards", 0))
        if shards <= start:
            raise ValueError(f"--extend: {out} already holds shards 0..{start - 1}; give --shards above {start}")
    prompts: list[str] = []
    for f in prompt_files:
        prompts += read_prompt_file(f, name=name)[0]
    used = 0  # the user prompts answered so far (the base's), from the first
    if base is not None:  # the extension's prompt shards go on after them
        used = base.info.get("prompts_used", (start // 2) * base.info.get("batch", len(prompts)))
        used = min(used, len(prompts))
    offset = used - (start // 2) * batch
    path = fetch_model(name)
    model = load_causal_lm(path, "target", dtype=torch.float32, local_files_only=True).to(device).eval()
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    conv = generate_conversations(
        model,
        tokenizer,
        work / "conv",
        shards=shards,
        batch=batch,
        answer_tokens=answer_tokens,
        seed=DATASTORE_SEED,
        progress=progress,
        user_prompts=prompts,
        deadline=t0 + 60 * minutes if minutes is not None else None,
        answer_temperatures=(0.0,),
        repeat_prompts=repeat_prompts,
        start=start,
        prompt_offset=offset,
    )
    present = [int(p.stem.split("-")[1]) for p in (work / "conv").glob("conv-*.jsonl")]
    new = [i for i in present if start <= i < shards]  # an extension reads only the shards after its base's
    store = datastore_from_conversations(work / "conv", len(tokenizer), name, base=base, shards=new)
    total = max([start - 1, *new]) + 1  # shards 0..total-1 have gone in (a budget may stop early)
    for i in (i for i in new if i % 2 == 1 and prompts):  # the prompts the new shards answered
        used = len(prompts) if repeat_prompts else max(used, min((i // 2) * batch + offset + batch, len(prompts)))
    # the command that writes these conversations again (after the base's, for an extension)
    command = (
        f"adaptive-spec zoo datastore {name}{' --extend' * extend} --shards {total} --batch {batch} "
        f"--answer-tokens {answer_tokens}{_prompts_flags(prompt_files)}{' --repeat-prompts' * repeat_prompts}"
    )
    if base is not None:
        command = f"{base.info.get('command', '(unrecorded)')} && {command}"
    store.info.update(
        model=name,
        command=command,
        shards=total,
        batch=batch,
        prompts_used=used,
        answer_tokens_per_conversation=answer_tokens,
        prompt_files=[str(Path(f).name) for f in prompt_files],
    )
    store.save(out)
    speed = {k: conv[k] for k in ("new_answer_tokens", "tok_per_s", "device")}
    return {"out": str(out), **store.info, "generation_this_run": speed, "seconds_this_run": round(time.time() - t0, 1)}


def _prompts_flags(prompt_files: Sequence[str | Path]) -> str:
    """The ``--prompts`` flags of ``zoo datastore`` that read ``prompt_files`` (none for its default set)."""
    from adaptive_spec.zoo.user_prompts import PROMPT_SETS

    files = [Path(f).resolve() for f in prompt_files]
    if files == [PROMPT_SETS["self-instruct"].resolve()]:
        return ""
    return "".join(f" --prompts {f}" for f in files) or " --prompts none"
