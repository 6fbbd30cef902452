"""Online distillation: fine-tune a shipped EAGLE head on what the engine logged, and check the engine against it.

- :func:`records_to_shard` turns draft-log generations (:mod:`adaptive_spec.formats.draft_log`) into the
  feature shards :func:`adaptive_spec.zoo.drafts.train_head` trains on (labels: every position with a
  logged law, i.e. from the prompt's last token on);
- :func:`fine_tune_from_logs` (``adaptive-spec zoo drafts --from-logs DIR``) fine-tunes the shipped head on
  them, with a held-out split by prompt (every ``held_out_every``-th prompt key), reporting
  ``sum(min(p, q))`` and top-1 on the held-out generations before and after;
- :func:`chain1_consistency`: at T = 0, ``chain:1/block``'s acceptance in the engine equals the head's
  teacher-forced top-1 agreement on the generated text, step by step (it catches any misalignment of the
  features between training and the engine);
- :func:`measure_online`: the whole measurement (log one domain, fine-tune on N logged tokens, report the
  depth-1 figures on held-out prompts of that domain and of another), written to a JSON file.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from adaptive_spec.files import write_json_atomic
from adaptive_spec.zoo.drafts import evaluate_drafts, shift_right, train_head

__all__ = [
    "chain1_consistency",
    "fine_tune_from_logs",
    "log_batched",
    "measure_online",
    "records_to_shard",
    "split_records",
    "take_tokens",
    "teacher_forced_top1",
]


# ---------------------------------------------------------------------- logs -> training shards
def records_to_shard(records: Sequence[dict[str, Any]]) -> dict[str, torch.Tensor]:
    """One feature shard (the layout of :func:`adaptive_spec.zoo.drafts.extract_features`) from logged generations.

    Positions without a logged law get zero soft labels (no cross-entropy term); the labelled span of a
    generation starts at its prompt's last token (``answer`` = the prompt length).
    """
    if not records:
        raise ValueError("no logged generation to make a shard of")
    K = records[0]["top_ids"].shape[1]
    ids, feat, top_ids, top_p, starts, answer = [], [], [], [], [0], []
    for r in records:
        n = r["ids"].numel()
        ti = torch.zeros(n, K, dtype=torch.int32)
        tp = torch.zeros(n, K, dtype=torch.float16)
        ti[r["law_positions"]] = r["top_ids"]
        tp[r["law_positions"]] = r["top_p"]
        ids.append(r["ids"])
        feat.append(r["feat"])
        top_ids.append(ti)
        top_p.append(tp)
        starts.append(starts[-1] + n)
        answer.append(min(int(r["prompt_length"]), n))
    return {
        "ids": torch.cat(ids),
        "starts": torch.tensor(starts),
        "answer": torch.tensor(answer),
        "feat": torch.cat(feat),
        "top_ids": torch.cat(top_ids),
        "top_p": torch.cat(top_p),
    }


def drop_evaluation_records(records: Sequence[dict[str, Any]], tokenizer: Any) -> list[dict[str, Any]]:
    """The logged generations whose prompt (decoded) holds no Spec-Bench question or demo prompt."""
    from adaptive_spec.zoo.user_prompts import evaluation_hit

    return [
        r
        for r in records
        if evaluation_hit(tokenizer.decode(r["ids"][: r["prompt_length"]].tolist(), skip_special_tokens=True)) is None
    ]


def split_records(records: Sequence[dict[str, Any]], every: int = 10) -> tuple[list, list]:
    """(training, held-out) generations: a prompt is held out when its key's number is ``every - 1`` mod ``every``."""
    train, held = [], []
    for r in records:
        (held if int(r["prompt_key"], 16) % every == every - 1 else train).append(r)
    return train, held


def labelled(r: dict[str, Any]) -> int:
    return int(r["law_positions"].numel())


def take_tokens(records: Sequence[dict[str, Any]], n: int | None) -> list[dict[str, Any]]:
    """The first generations holding ``n`` labelled positions (the last one cut); all when ``n`` is None."""
    if n is None:
        return list(records)
    out, total = [], 0
    for r in records:
        if total >= n:
            break
        k = labelled(r)
        if total + k > n:  # cut this generation after its (n - total)-th labelled position
            last = int(r["law_positions"][n - total - 1])
            keep = r["law_positions"] <= last
            r = {
                **r,
                "ids": r["ids"][: last + 1],
                "feat": r["feat"][: last + 1],
                "law_positions": r["law_positions"][keep],
                "top_ids": r["top_ids"][keep],
                "top_p": r["top_p"][keep],
            }
            k = labelled(r)
        out.append(r)
        total += k
    if total < n:
        raise ValueError(f"the log holds {total} labelled training positions, fewer than the {n} asked for")
    return out


def _to(shard: dict[str, torch.Tensor], device: torch.device) -> dict[str, torch.Tensor]:
    return {k: (v.to(device) if k in ("feat", "top_ids", "top_p", "ids") else v) for k, v in shard.items()}


def fine_tune_from_logs(
    target: Any,
    head: Any,
    log_dir: str | Path,
    work: str | Path,
    *,
    minutes: float = 5.0,
    max_tokens: int | None = None,
    held_out_every: int = 10,
    lr: float = 3e-4,
    batch_tokens: int = 2048,
    steps: int = 100_000,
    passes: int = 2,
    device: str | torch.device = "cpu",
    seed: int = 0,
    progress: bool = True,
    records: Sequence[dict[str, Any]] | None = None,
    tokenizer: Any = None,
) -> dict[str, Any]:
    """Fine-tune a bound EAGLE ``head`` on a draft log; returns figures for ``build_info.json``.

    ``max_tokens``: train on the first that many labelled positions of the training split. With a
    ``tokenizer``, generations whose prompt holds a Spec-Bench question or a demo prompt are dropped first
    (evaluation only, :mod:`adaptive_spec.zoo.user_prompts`). The held-out
    split (whole prompts) is evaluated before and after. Resumable: the checkpoint is ``work/head.ckpt``.

    Raises:
        ValueError: an empty training or held-out split, or fewer logged positions than ``max_tokens``.
    """
    from adaptive_spec.formats.draft_log import read_draft_log

    device = torch.device(device)
    records = list(records) if records is not None else read_draft_log(log_dir)
    dropped = 0
    if tokenizer is not None:
        kept = drop_evaluation_records(records, tokenizer)
        records, dropped = kept, len(records) - len(kept)
    train_r, held_r = split_records(records, held_out_every)
    if not train_r or not held_r:
        raise ValueError(
            f"{log_dir}: {len(train_r)} training and {len(held_r)} held-out generations; "
            f"log more prompts (every {held_out_every}th prompt is held out)"
        )
    train_r = take_tokens(train_r, max_tokens)
    train = [_to(records_to_shard(train_r), device if device.type == "cuda" else torch.device("cpu"))]
    held = [records_to_shard(held_r)]
    info: dict[str, Any] = {
        "log": str(log_dir),
        "generations": {"train": len(train_r), "held_out": len(held_r), "dropped_evaluation": dropped},
        "labelled_tokens": {"train": sum(map(labelled, train_r)), "held_out": sum(map(labelled, held_r))},
        "held_out_before": evaluate_drafts(target, {"eagle": head}, held)["eagle"],
    }
    head.train()
    info["training"] = train_head(
        head,
        train,
        work,
        minutes=minutes,
        steps=steps,
        lr=lr,
        batch_tokens=batch_tokens,
        seed=seed,
        passes=passes,
        progress=progress,
        device=device,
    )
    head.eval()
    info["held_out_after"] = evaluate_drafts(target, {"eagle": head}, held)["eagle"]
    return info


# ---------------------------------------------------------------------- the consistency check
@torch.inference_mode()
def teacher_forced_top1(target: Any, head: Any, ids: Sequence[int], positions: Sequence[int], shift: int = 1) -> list:
    """Whether the head's argmax equals the target's at each of ``positions`` of ``ids``, teacher-forced.

    As in training (:func:`adaptive_spec.zoo.drafts.train_head`) and evaluation: one target pass gives the
    features, position ``j`` of the head reads ``f_{j - shift}`` (``shift = 1`` is the engine's alignment;
    other values are the negative control).
    """
    device = target.device
    x = torch.tensor([list(ids)], device=device)
    h = target.model(input_ids=x).last_hidden_state
    t_arg = target.lm_head(h)[0].argmax(-1)
    prev = h
    for _ in range(shift):
        prev = shift_right(prev)
    if shift == 0:
        prev = h
    logits, _ = head(x, prev.to(head.dtype), torch.arange(x.shape[1], device=device)[None], None, None)
    d_arg = head.token_ids[logits[0].float().argmax(-1)]
    pos = torch.tensor(list(positions), dtype=torch.long, device=device)
    return (d_arg[pos] == t_arg[pos]).tolist()


def chain1_consistency(
    engine: Any, prompts: Sequence[Any], max_new_tokens: int = 64, shift: int = 1, prompt_kw: str = "prompt"
) -> dict[str, Any]:
    """Generate each prompt at T = 0 with ``chain:1/block`` and compare each step with the teacher-forced head.

    ``prompts``: token-id lists or texts (``prompt_kw="prompt"``), or chats (``prompt_kw="messages"``).
    Returns the engine's acceptance (accepted / drafted tokens), the teacher-forced top-1 over the same
    root positions, the number of steps where the two disagree, and the positions counted.
    """
    steps = accepted = agree = mismatches = 0
    for prompt in prompts:
        out = engine.generate(
            **{prompt_kw: prompt}, max_new_tokens=max_new_tokens, temperature=0, plan="chain:1/block", keep_state=True
        )
        ids = out.state.context
        r = out.state.prompt_length - 1  # the first step's root
        roots, acc = [], []
        for s in out.steps:
            if s.num_nodes == 2 and r < len(ids):  # one drafted token (the last step may draft none)
                roots.append(r)
                acc.append(int(s.num_accepted))
            r += len(s.tokens)
        if not roots:
            continue
        tf = teacher_forced_top1(engine.target, engine.draft, ids, roots, shift)
        steps += len(roots)
        accepted += sum(acc)
        agree += sum(tf)
        mismatches += sum(int(a) != int(t) for a, t in zip(acc, tf, strict=True))
    return {
        "engine_acceptance": accepted / max(steps, 1),
        "teacher_forced_top1": agree / max(steps, 1),
        "mismatched_steps": mismatches,
        "positions": steps,
    }


# ---------------------------------------------------------------------- logging without the engine
@torch.inference_mode()
def log_batched(
    target: Any,
    tokenizer: Any,
    prompts: Sequence[str],
    logger: Any,
    *,
    max_new_tokens: int = 256,
    temperature: float = 1.0,
    batch: int = 32,
    seed: int = 0,
    index_offset: int = 0,
) -> dict[str, float]:
    """Log what the engine would log for ``prompts``, faster: batched ``generate``, then one teacher-forced pass.

    Each generation's committed positions get the target's features (and laws from the prompt's last token
    on), as the engine's commit hands them over; prompt ``i`` is recorded with index ``index_offset + i``.
    Returns the generated tokens and the seconds spent generating and in the feature pass.
    """
    device = target.device
    eos = tokenizer.eos_token_id
    tokenizer.padding_side = "left"
    t_gen = t_feat = 0.0
    tokens = 0
    torch.manual_seed(seed)
    for b in range(0, len(prompts), batch):
        chunk = prompts[b : b + batch]
        enc = _encode_chats(tokenizer, chunk, device)
        sample = {"temperature": temperature, "top_k": 0, "top_p": 1.0} if temperature > 0 else {}
        t0 = time.time()
        out = target.generate(
            **enc, max_new_tokens=max_new_tokens, pad_token_id=eos, do_sample=temperature > 0, **sample
        )
        t_gen += time.time() - t0
        width = enc["input_ids"].shape[1]
        t0 = time.time()
        for j in range(len(chunk)):
            prompt = enc["input_ids"][j][enc["attention_mask"][j].bool()].tolist()
            answer = out[j, width:].tolist()
            if eos in answer:
                answer = answer[: answer.index(eos) + 1]
            seq = torch.tensor([prompt + answer], device=device)
            h = target.model(input_ids=seq).last_hidden_state[0]
            n, P = seq.shape[1], len(prompt)
            logger.prompt_index = index_offset + b + j
            logger.temperature = float(temperature)
            logger.begin(prompt, h[: P - 1])
            # the engine commits positions P - 1 .. n - 2 with laws (the last token waits for the next step)
            logger.add(P - 1, seq[0, P - 1 : n - 1].tolist(), h[P - 1 : n - 1], target.lm_head(h[P - 1 : n - 1]), 0)
            logger.end_generation()
            tokens += len(answer)
        t_feat += time.time() - t0
    return {"tokens": tokens, "generate_s": round(t_gen, 1), "features_s": round(t_feat, 1)}


def _encode_chats(tokenizer: Any, prompts: Sequence[str], device: Any) -> Any:
    """One user turn per prompt through the chat template, left-padded into one batch on ``device``."""
    rendered = [
        tokenizer.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True, tokenize=False)
        for p in prompts
    ]
    return tokenizer(rendered, return_tensors="pt", padding=True, add_special_tokens=False).to(device)


# ---------------------------------------------------------------------- the measurement
@torch.inference_mode()
def answer_shard(target: Any, tokenizer: Any, prompts: Sequence[str], max_new_tokens: int = 128, batch: int = 16):
    """The target's greedy answers to ``prompts`` as an evaluation shard (``ids``, ``starts``, ``answer``)."""
    device = target.device
    eos = tokenizer.eos_token_id
    tokenizer.padding_side = "left"
    seqs, answer = [], []
    for b in range(0, len(prompts), batch):
        chunk = prompts[b : b + batch]
        enc = _encode_chats(tokenizer, chunk, device)
        out = target.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=eos)
        width = enc["input_ids"].shape[1]
        for j in range(len(chunk)):
            prompt = enc["input_ids"][j][enc["attention_mask"][j].bool()].tolist()
            ans = out[j, width:].tolist()
            if eos in ans:
                ans = ans[: ans.index(eos) + 1]
            seqs.append(prompt + ans)
            answer.append(len(prompt))
    starts = [0]
    for s in seqs:
        starts.append(starts[-1] + len(s))
    return {
        "ids": torch.tensor([t for s in seqs for t in s], dtype=torch.int32),
        "starts": torch.tensor(starts),
        "answer": torch.tensor(answer),
    }


def _domain_prompts(path: Path, domain: str, split: str | None) -> list[str]:
    from adaptive_spec.zoo.user_prompts import exclude_evaluation

    recs = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    out = [r["prompt"] for r in recs if r.get("domain") == domain and (split is None or r.get("split") == split)]
    if not out:
        raise ValueError(f"{path}: no prompt of domain {domain!r} and split {split!r}")
    return exclude_evaluation(out)[0]


def measure_online(
    out_json: str | Path,
    *,
    name: str = "smollm2",
    prompts: str | Path | None = None,
    train_domain: str = "code",
    other_domain: str = "everyday",
    tokens: Sequence[int] = (10_000, 30_000, 100_000),
    work: str | Path | None = None,
    minutes: float = 3.0,
    log_with: str = "batched",
    log_temperature: float = 1.0,
    max_new_tokens: int = 256,
    eval_tokens: int = 128,
    consistency_prompts: int = 0,
    device: str = "cpu",
    seed: int = 0,
    progress: bool = True,
) -> dict[str, Any]:
    """Log generations of ``train_domain``'s training prompts until ``max(tokens)`` labelled positions, fine-tune
    the shipped head on the first ``N`` of them for each ``N`` (``minutes`` each), and report its depth-1
    figures (``sum(min(p, q))`` at T = 1, top-1 at T = 0) on held-out prompts of ``train_domain`` and of
    ``other_domain`` (the target's greedy answers), the shipped head first.

    ``log_with``: ``"engine"`` (``chain:2/block`` generations through the engine with a draft-data log) or
    ``"batched"`` (:func:`log_batched`, the same records, much faster on a GPU). ``consistency_prompts > 0``
    also runs :func:`chain1_consistency` on that many held-out prompts of each domain for every head. Every
    stage resumes: the log, each N's checkpoint, and the JSON (a finished N is skipped).
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from adaptive_spec.engine import SpecEngine
    from adaptive_spec.engine.draft_data import log_draft_data
    from adaptive_spec.engine.models import fetch_model, shipped_drafts_dir
    from adaptive_spec.files import user_data_dir
    from adaptive_spec.formats.draft_log import DraftDataLogger, logged_keys, read_draft_log
    from adaptive_spec.zoo.user_prompts import ONLINE_PROMPTS

    out_json = Path(out_json)
    work = Path(work) if work is not None else user_data_dir() / "online" / name
    prompts = Path(prompts) if prompts is not None else ONLINE_PROMPTS
    dev = torch.device(device)
    target_dir = fetch_model(name)
    tok = AutoTokenizer.from_pretrained(target_dir)
    target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).to(dev).eval()
    target.requires_grad_(False)

    def shipped() -> Any:
        head = AutoModelForCausalLM.from_pretrained(shipped_drafts_dir(name) / "eagle", dtype=torch.float32)
        return head.to(dev).bind(target).eval()

    train_p = _domain_prompts(prompts, train_domain, "train")
    held = {d: _domain_prompts(prompts, d, "held_out") for d in (train_domain, other_domain)}
    result: dict[str, Any] = json.loads(out_json.read_text()) if out_json.exists() else {}
    result.update(
        {
            "target": name,
            "device": str(dev),
            "prompts": str(prompts),
            "train_domain": train_domain,
            "other_domain": other_domain,
            "train_prompts": len(train_p),
            "held_out_prompts": {d: len(p) for d, p in held.items()},
            "log_with": log_with,
            "log_temperature": log_temperature,
            "minutes_per_fine_tune": minutes,
        }
    )
    result.setdefault("runs", {})

    # 1) the log: rounds over the training prompts (prompt index = round * len + i) until max(tokens) labels
    log_dir = work / f"log-{train_domain}"
    need = max(tokens)
    try:  # a stopped run resumes from its complete shards
        have = sum(map(labelled, read_draft_log(log_dir)))
    except FileNotFoundError:
        have = 0
    done = {i for _, i in logged_keys(log_dir)}
    t0 = time.time()
    if have < need:
        logger = DraftDataLogger(log_dir)
        engine = SpecEngine(target, shipped(), tok, device=dev)
        log_draft_data(engine, logger)  # both ways write the same records under the same manifest
        rnd = 0
        while have < need:
            todo = [(rnd * len(train_p) + i, p) for i, p in enumerate(train_p) if rnd * len(train_p) + i not in done]
            if log_with == "engine":
                for idx, p in todo:
                    logger.prompt_index = idx
                    r = engine.generate(
                        messages=[{"role": "user", "content": p}],
                        max_new_tokens=max_new_tokens,
                        temperature=log_temperature,
                        plan="chain:2/block",
                        seed=seed + idx,
                    )
                    have += len(r.token_ids)
                    if progress:
                        print(f"logged prompt {idx}: {have}/{need} tokens", flush=True)
                    if have >= need:
                        break
            elif todo:
                got = log_batched(
                    target,
                    tok,
                    [p for _, p in todo],
                    logger,
                    max_new_tokens=max_new_tokens,
                    temperature=log_temperature,
                    seed=seed + rnd,
                    index_offset=todo[0][0],
                )
                have += got["tokens"]
                if progress:
                    print(f"logged round {rnd}: {have}/{need} tokens ({got})", flush=True)
            rnd += 1
        logger.close()
    result["log"] = {"dir": str(log_dir), "labelled_tokens": have, "seconds_this_run": round(time.time() - t0, 1)}
    records = read_draft_log(log_dir)

    # 2) the held-out answers of both domains
    t0 = time.time()
    eval_shards = {d: [answer_shard(target, tok, p, eval_tokens)] for d, p in held.items()}
    result["eval_answers_s"] = round(time.time() - t0, 1)

    def figures(head: Any) -> dict[str, Any]:
        figs = {d: evaluate_drafts(target, {"eagle": head}, s)["eagle"] for d, s in eval_shards.items()}
        if consistency_prompts:
            engine = SpecEngine(target, head, tok, device=dev)
            for d, p in held.items():
                msgs = [[{"role": "user", "content": x}] for x in p[:consistency_prompts]]
                figs[d]["chain1"] = chain1_consistency(engine, msgs, eval_tokens, prompt_kw="messages")
        return figs

    if "shipped" not in result["runs"]:
        result["runs"]["shipped"] = {"labelled_tokens": 0, "held_out": figures(shipped())}
        write_json_atomic(result, out_json)
    for n in tokens:
        key = f"N={n}"
        if key in result["runs"]:
            continue
        head = shipped()
        # Every prompt is training data here (the held-out prompts are the file's): no split of the log.
        train_r = take_tokens([r for r in records if r["prompt_index"] >= 0], n)
        shard = _to(records_to_shard(train_r), dev)
        head.train()
        info = train_head(
            head,
            [shard],
            work / f"ft-{train_domain}-{n}",
            minutes=minutes,
            lr=3e-4,
            seed=seed,
            progress=progress,
            device=dev,
        )
        head.eval()
        result["runs"][key] = {"labelled_tokens": n, "training": info, "held_out": figures(head)}
        write_json_atomic(result, out_json)
    return result
