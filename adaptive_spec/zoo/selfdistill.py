"""Self-distillation data for a target's drafts: the target writes requests, then answers them.

Given only its chat template's opening up to the user turn, an instruction model writes a varied
user request itself; the request is then put in a proper chat and the model answers it. The
conversations (token ids, with the temperature of the answer) are the training text of its draft
head and its standalone draft, as in EAGLE and Medusa: a draft learns the target's own
distribution on the contexts the target itself produces. No benchmark's questions are used.

:func:`generate_conversations` writes shards ``conv-00000.jsonl``, ``conv-00001.jsonl``, ... into a
folder, each written atomically; it is resumable (an existing shard is skipped, and shard ``i``
always uses seed ``seed + i``), so it can be stopped at any time and started again.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from adaptive_spec.files import atomic_write

__all__ = ["ANSWER_TEMPERATURES", "generate_conversations", "read_conversations"]

# Shard i answers at ANSWER_TEMPERATURES[i % 3]: greedy text (what T=0 decoding sees) and samples.
ANSWER_TEMPERATURES = (1.0, 0.0, 0.7)


def user_prefix(tokenizer: Any) -> list[int]:
    """Token ids of the chat template up to the start of the first user turn's content."""
    marker = "\u2063REQUEST\u2063"
    text = tokenizer.apply_chat_template([{"role": "user", "content": marker}], tokenize=False)
    return tokenizer(text[: text.index(marker)], add_special_tokens=False)["input_ids"]


def generate_conversations(
    model: Any,
    tokenizer: Any,
    out: str | Path,
    *,
    shards: int,
    batch: int = 96,
    request_tokens: int = 64,
    answer_tokens: int = 320,
    seed: int = 0,
    progress: bool = True,
    user_prompts: Sequence[str] = (),
    deadline: float | None = None,
    first: Sequence[int] = (),
    answer_temperatures: Sequence[float] = ANSWER_TEMPERATURES,
    repeat_prompts: bool = True,
    start: int = 0,
    prompt_offset: int = 0,
) -> dict[str, Any]:
    """Write ``shards`` shards of ``batch`` self-generated conversations each into ``out`` (resumable).

    With ``user_prompts`` (public instruction or chat prompts, evaluation texts already excluded), every
    odd-numbered shard takes its requests from them instead (the next ``batch`` of them, in turn); the target
    still writes every answer. ``repeat_prompts``: once all are used, start again from the first (answers
    sampled anew); if False, the odd shards after that are self-written like the others (greedy answers to a
    prompt already answered would repeat it word for word). No new shard is started after ``deadline`` (a
    ``time.time()`` value). ``start``: the shards below it are not written (another build has them).
    ``prompt_offset``: odd shard ``i`` takes the user prompts from ``(i // 2) * batch + prompt_offset`` on.
    ``first``: shard numbers written before the others (a shard's text depends on its number only, so the
    order changes which shards a stopped run has, not what they hold). ``answer_temperatures``: shard ``i``
    answers at ``answer_temperatures[i % len(answer_temperatures)]`` (default :data:`ANSWER_TEMPERATURES`).
    Returns totals: shards present, conversations and answer tokens in them, seconds spent here, and the
    generation speed of this run (answer tokens per second, on the model's device).
    """
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    tokenizer.padding_side = "left"
    t0, made = time.time(), 0
    order = [i for i in first if start <= i < shards]
    for i in [*order, *(i for i in range(start, shards) if i not in order)]:
        path = out / f"conv-{i:05d}.jsonl"
        if path.exists():
            continue
        if deadline is not None and time.time() >= deadline:
            break
        ts = time.time()
        temperature = answer_temperatures[i % len(answer_temperatures)]
        requests = None
        k = (i // 2) * batch + prompt_offset
        if user_prompts and i % 2 == 1 and repeat_prompts:
            requests = [user_prompts[(k + j) % len(user_prompts)] for j in range(min(batch, len(user_prompts)))]
        elif user_prompts and i % 2 == 1 and k < len(user_prompts):
            requests = list(user_prompts[k : k + batch])  # the last of them (fewer than a batch, maybe)
        lines, n_requests, n_tok = _one_shard(
            model, tokenizer, eos, batch, request_tokens, answer_tokens, temperature, seed + i, requests
        )
        atomic_write(path, "\n".join(lines) + "\n")
        made += n_tok
        if progress:
            dt = time.time() - ts
            print(
                f"shard {i}: {n_requests} conversations, {n_tok} answer tokens, {dt:.0f} s, "
                f"{n_tok / dt:.0f} tok/s, T={temperature}",
                flush=True,
            )
    convs = read_conversations(out)
    return {
        "shards": len(list(out.glob("conv-*.jsonl"))),
        "conversations": len(convs),
        "answer_tokens": sum(len(c["answer_ids"]) for c in convs),
        "seconds": round(time.time() - t0, 1),
        "new_answer_tokens": made,
        "tok_per_s": round(made / max(time.time() - t0, 1e-9), 1) if made else None,
        "device": str(next(model.parameters()).device),
        "batch": batch,
    }


def _one_shard(
    model: Any,
    tokenizer: Any,
    eos: int,
    batch: int,
    request_tokens: int,
    answer_tokens: int,
    temperature: float,
    seed: int,
    given: Sequence[str] | None = None,
) -> tuple[list[str], int, int]:
    """One shard: ``batch`` self-written requests (T = 1), or the ``given`` ones, then the answers at ``temperature``.

    Returns the JSON lines, the number of conversations and of answer tokens.
    """
    import torch

    torch.manual_seed(seed)
    prefix = user_prefix(tokenizer)
    device = next(model.parameters()).device
    with torch.inference_mode():
        requests = list(given) if given is not None else []
        if given is None:
            ids = torch.tensor([prefix] * batch, device=device)
            req = model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                do_sample=True,
                temperature=1.0,
                top_k=0,
                top_p=1.0,
                max_new_tokens=request_tokens,
                eos_token_id=eos,
                pad_token_id=eos,
            )
            for row in req[:, len(prefix) :].tolist():
                if eos not in row:
                    continue  # an unfinished request
                text = tokenizer.decode(row[: row.index(eos)], skip_special_tokens=True).strip()
                if len(text) >= 8:
                    requests.append(text)
        chats = [[{"role": "user", "content": r}] for r in requests]
        rendered = [tokenizer.apply_chat_template(c, add_generation_prompt=True, tokenize=False) for c in chats]
        enc = tokenizer(rendered, return_tensors="pt", padding=True, add_special_tokens=False).to(device)
        if temperature > 0:
            sample = {"do_sample": True, "temperature": temperature, "top_k": 0, "top_p": 1.0}
        else:
            sample = {"do_sample": False}
        ans = model.generate(**enc, max_new_tokens=answer_tokens, eos_token_id=eos, pad_token_id=eos, **sample)
    lines, n_tok = [], 0
    width = enc["input_ids"].shape[1]
    for j, request in enumerate(requests):
        prompt = enc["input_ids"][j][enc["attention_mask"][j].bool()].tolist()
        answer = ans[j, width:].tolist()
        if eos in answer:
            answer = answer[: answer.index(eos) + 1]
        n_tok += len(answer)
        record = {"request": request, "prompt_ids": prompt, "answer_ids": answer, "temperature": temperature}
        if given is not None:
            record["source"] = "user prompts"
        lines.append(json.dumps({**record, "seed": seed}))
    return lines, len(requests), n_tok


def read_conversations(folder: str | Path, shards: Sequence[int] | None = None) -> list[dict[str, Any]]:
    """Every conversation in the shards of ``folder`` (all shards, or those numbered in ``shards``)."""
    paths = sorted(Path(folder).glob("conv-*.jsonl"))
    if shards is not None:
        keep = set(shards)
        paths = [p for p in paths if int(p.stem.split("-")[1]) in keep]
    convs = []
    for p in paths:
        convs.extend(json.loads(line) for line in p.read_text().splitlines() if line.strip())
    return convs
