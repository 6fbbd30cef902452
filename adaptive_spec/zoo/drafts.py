"""Training a real target's drafts: an EAGLE-style head and a small standalone draft.

The pipeline (``adaptive-spec zoo drafts``), each stage resumable:

1. **conversations** (:mod:`adaptive_spec.zoo.selfdistill`): the target writes requests and answers them;
2. **features**: one teacher-forced target pass over every conversation keeps, per position, the
   target's last hidden state (fp16, the head's input) and its top-``K`` next-token probabilities
   (the soft labels); chunk files ``feat-00000.pt`` ... written atomically;
3. **vocabulary**: the ``N`` most frequent target tokens of the training answers (FR-Spec / EAGLE-3);
4. **head**: the :class:`~adaptive_spec.engine.eagle.EagleHead` trained on soft cross-entropy
   over the draft vocabulary plus EAGLE's feature regression (smooth L1), with noise on the input
   features; checkpointed every few minutes and resumable;
5. **standalone draft**: a small Llama with the target's tokenizer, trained on the same soft labels
   (its embedding initialised from the target's by SVD);
6. **evaluation** on held-out conversations against the target's full distributions:
   ``sum(min(p, q))`` at T = 1 and top-1 agreement (T = 0), per draft.

Training loss on answer positions only (the request and chat template are inputs, not labels).
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from adaptive_spec.files import atomic_write, write_json_atomic
from adaptive_spec.zoo.selfdistill import read_conversations

__all__ = [
    "HELD_OUT",
    "choose_vocabulary",
    "evaluate_drafts",
    "extract_features",
    "held_out",
    "load_features",
    "standalone_config",
    "train_head",
    "train_standalone",
]

TOP_K = 32  # soft labels kept per position
HELD_OUT = 10  # shard i is held out when i % HELD_OUT == HELD_OUT - 1


def held_out(shard: int) -> bool:
    return shard % HELD_OUT == HELD_OUT - 1


def _shards(conv_dir: Path) -> list[int]:
    return sorted(int(p.stem.split("-")[1]) for p in conv_dir.glob("conv-*.jsonl"))


# ---------------------------------------------------------------------- features
@torch.inference_mode()
def extract_features(
    target: Any,
    conv_dir: str | Path,
    out_dir: str | Path,
    *,
    batch: int = 16,
    progress: bool = True,
    keep: dict[int, dict[str, torch.Tensor]] | None = None,
) -> int:
    """Teacher-forced target pass over each conversation shard not yet done; returns tokens processed now.

    The pass runs on the target's device. With ``keep`` (a dict), each shard's tensors stay on that device in
    ``keep[shard]`` instead of going to a file (a shard already in ``keep`` or on disk is skipped).
    One file ``feat-SSSSS.pt`` per conversation shard otherwise: ``ids`` (int32 [T]), ``starts`` (int64 [n + 1],
    sequence offsets), ``answer`` (int64 [n], where each answer starts), ``given`` (bool [n]: the request came
    from a prompt file), ``feat`` (fp16 [T, H]),
    ``top_ids`` (int32 [T, K]) and ``top_p`` (fp16 [T, K]) of the target's next-token law at T = 1.
    """
    conv_dir, out_dir = Path(conv_dir), Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    done = 0
    device = target.device
    for shard in _shards(conv_dir):
        path = out_dir / f"feat-{shard:05d}.pt"
        if path.exists() or (keep is not None and shard in keep):
            continue
        t0 = time.time()
        convs = read_conversations(conv_dir, [shard])
        seqs = [c["prompt_ids"] + c["answer_ids"] for c in convs]
        order = sorted(range(len(seqs)), key=lambda i: len(seqs[i]))
        rows: dict[int, tuple] = {}
        for b in range(0, len(order), batch):
            idx = order[b : b + batch]
            L = max(len(seqs[i]) for i in idx)
            ids = torch.zeros(len(idx), L, dtype=torch.long)
            mask = torch.zeros(len(idx), L, dtype=torch.long)
            for r, i in enumerate(idx):
                ids[r, : len(seqs[i])] = torch.tensor(seqs[i])
                mask[r, : len(seqs[i])] = 1
            ids, mask = ids.to(device), mask.to(device)
            h = target.model(input_ids=ids, attention_mask=mask).last_hidden_state  # [B, L, H], after the norm
            probs = torch.softmax(target.lm_head(h).float(), dim=-1)
            top = probs.topk(TOP_K, dim=-1)
            for r, i in enumerate(idx):
                n = len(seqs[i])
                rows[i] = (h[r, :n].half(), top.indices[r, :n].int(), top.values[r, :n].half())
        starts = [0]
        for s in seqs:
            starts.append(starts[-1] + len(s))
        data = {
            "ids": torch.tensor([t for s in seqs for t in s], dtype=torch.int32, device=device),
            "starts": torch.tensor(starts),
            "answer": torch.tensor([len(c["prompt_ids"]) for c in convs]),
            # requests taken from a prompt file (not the target's own text): labelled from the answer only
            "given": torch.tensor([c.get("source") == "user prompts" for c in convs]),
            "feat": torch.cat([rows[i][0] for i in range(len(seqs))]),
            "top_ids": torch.cat([rows[i][1] for i in range(len(seqs))]),
            "top_p": torch.cat([rows[i][2] for i in range(len(seqs))]),
        }
        if keep is not None:
            keep[shard] = data
        else:
            data = {k: v.cpu() for k, v in data.items()}
            atomic_write(path, lambda f, data=data: torch.save(data, f))
        done += starts[-1]
        if progress:
            dt = time.time() - t0
            print(f"features shard {shard}: {starts[-1]} tokens, {dt:.0f} s, {starts[-1] / dt:.0f} tok/s", flush=True)
    return done


def load_features(
    feat_dir: str | Path, *, held: bool, memory: dict[int, dict[str, torch.Tensor]] | None = None
) -> list[dict[str, torch.Tensor]]:
    """The feature shards, training (``held=False``) or held-out (``held=True``): files, then those in ``memory``."""
    out = []
    for p in sorted(Path(feat_dir).glob("feat-*.pt")):
        if held_out(int(p.stem.split("-")[1])) == held:
            out.append(torch.load(p))
    for shard, data in sorted((memory or {}).items()):
        if held_out(shard) == held:
            out.append(data)
    return out


def _sequences(
    shards: Sequence[dict[str, torch.Tensor]], labels_from: int | None = None
) -> list[tuple[dict[str, torch.Tensor], int, int, int]]:
    """(shard, start, end, first labelled token) of every sequence: the answer's start, or position
    ``labels_from`` (e.g. the start of the self-written request) when given and the request is the
    target's own (a request from a prompt file, ``given``, is never a label: the target did not write it).
    """
    out = []
    for d in shards:
        st = d["starts"].tolist()
        given = d["given"].tolist() if "given" in d else [False] * (len(st) - 1)
        for k in range(len(st) - 1):
            first = labels_from if labels_from is not None and not given[k] else int(d["answer"][k])
            out.append((d, st[k], st[k + 1], st[k] + first))
    return out


# ---------------------------------------------------------------------- vocabulary
def _answer_counts(shards: Sequence[dict[str, torch.Tensor]], vocab: int) -> torch.Tensor:
    """How often each token id (below ``vocab``) occurs in the shards' answers."""
    counts = torch.zeros(vocab, dtype=torch.long)
    for d, _, e, a in _sequences(shards):
        counts += torch.bincount(d["ids"][a:e].long().cpu(), minlength=vocab)
    return counts


def choose_vocabulary(shards: Sequence[dict[str, torch.Tensor]], size: int, vocab: int) -> tuple[torch.Tensor, float]:
    """The ``size`` most frequent answer tokens (sorted by id), and the share of answer tokens they cover."""
    counts = _answer_counts(shards, vocab)
    top = counts.topk(size).indices
    return top.sort().values, float(counts[top].sum() / counts.sum())


# ---------------------------------------------------------------------- batches
def _batches(seqs: list, batch_tokens: int, generator: torch.Generator, max_len: int = 512):
    """Endless shuffled batches of whole sequences (cut at ``max_len``), about ``batch_tokens`` each."""
    cur, n = [], 0  # a batch may span two epochs (a data set smaller than one batch still yields)
    while True:
        perm = torch.randperm(len(seqs), generator=generator).tolist()
        for i in perm:
            cur.append(seqs[i])
            n += min(seqs[i][2] - seqs[i][1], max_len)
            if n >= batch_tokens:
                yield cur
                cur, n = [], 0


def _collate(batch: list, max_len: int = 512) -> dict[str, torch.Tensor]:
    L = max(min(e - s, max_len) for _, s, e, _ in batch)
    B = len(batch)
    H, K = batch[0][0]["feat"].shape[1], batch[0][0]["top_ids"].shape[1]
    dev = batch[0][0]["feat"].device  # the shards' device: features kept on a GPU stay there
    ids = torch.zeros(B, L, dtype=torch.long, device=dev)
    feat = torch.zeros(B, L, H, device=dev)
    top_ids = torch.zeros(B, L, K, dtype=torch.long, device=dev)
    top_p = torch.zeros(B, L, K, device=dev)
    loss_mask = torch.zeros(B, L, dtype=torch.bool, device=dev)
    for r, (d, s, e, a) in enumerate(batch):
        e = min(e, s + L)
        n = e - s
        ids[r, :n] = d["ids"][s:e].long()
        feat[r, :n] = d["feat"][s:e].float()
        top_ids[r, :n] = d["top_ids"][s:e].long()
        top_p[r, :n] = d["top_p"][s:e].float()
        loss_mask[r, max(a - 1 - s, 0) : n - 1] = True  # positions predicting an answer token
    return {"ids": ids, "feat": feat, "top_ids": top_ids, "top_p": top_p, "mask": loss_mask}


def _soft_ce(head: nn.Module, h: torch.Tensor, top_ids: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Mean of ``-sum_k p_k log q(top_ids_k)`` over rows, ``q = softmax(head(h))``; ids < 0 are outside the
    draft vocabulary (no term). The LM head runs on the selected rows only, and no log-softmax is materialised.
    """
    z = head(h).float()  # [M, V']
    lse = torch.logsumexp(z, dim=-1)  # [M]
    valid = top_ids >= 0
    p = top_p * valid
    picked = z.gather(-1, top_ids.clamp(min=0))  # [M, K]
    return (lse * p.sum(-1) - (p * picked).sum(-1)).mean()


class _Checkpointed:
    """Save/restore a model, its optimizer and the step count to one file, atomically."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def load(self, model: nn.Module, opt: torch.optim.Optimizer) -> tuple[int, float]:
        if not self.path.exists():
            return 0, 0.0
        state = torch.load(self.path)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        return int(state["step"]), float(state["seconds"])

    def save(self, model: nn.Module, opt: torch.optim.Optimizer, step: int, seconds: float) -> None:
        state = {"model": model.state_dict(), "opt": opt.state_dict(), "step": step, "seconds": seconds}
        atomic_write(self.path, lambda f: torch.save(state, f))


def _lr(step: int, done: float, peak: float, warmup: int = 50) -> float:
    """Linear warm-up over ``warmup`` steps, then a cosine over the share ``done`` of the time budget spent."""
    if step < warmup:
        return peak * (step + 1) / warmup
    return peak * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * min(1.0, done))))


def _train_loop(
    model: nn.Module,
    loss_fn,
    seqs: list,
    *,
    minutes: float,
    steps: int,
    lr: float,
    batch_tokens: int,
    ckpt: Path,
    seed: int,
    progress: bool,
    label: str,
    device: torch.device | str = "cpu",
) -> dict[str, Any]:
    device = torch.device(device)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0, betas=(0.9, 0.95))
    saver = _Checkpointed(ckpt)
    step, spent = saver.load(model, opt)
    gen = torch.Generator().manual_seed(seed + step)
    batches = _batches(seqs, batch_tokens, gen)
    t0, last_save, tokens, ema = time.time(), time.time(), 0, None
    model.train()
    while step < steps and spent + (time.time() - t0) < minutes * 60:
        batch = {k: v.to(device, non_blocking=True) for k, v in _collate(next(batches)).items()}
        for g in opt.param_groups:
            g["lr"] = _lr(step, (spent + time.time() - t0) / (minutes * 60), lr)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=device.type == "cuda"):
            loss = loss_fn(model, batch)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        step += 1
        tokens += int(batch["mask"].sum())
        ema = loss.item() if ema is None else 0.98 * ema + 0.02 * loss.item()
        if progress and step % 50 == 0:
            el = time.time() - t0
            print(
                f"{label} step {step}/{steps}: loss {ema:.3f}, {tokens / el:.0f} tok/s, {el / 60:.1f} min", flush=True
            )
        if time.time() - last_save > 180:
            saver.save(model, opt, step, spent + time.time() - t0)
            last_save = time.time()
    run_s = time.time() - t0
    spent += run_s
    saver.save(model, opt, step, spent)
    model.eval()
    return {
        "steps": step,
        "seconds": round(spent, 1),
        "tokens_this_run": tokens,
        "tok_per_s": round(tokens / max(run_s, 1e-9), 1),
        "device": str(device),
        "final_loss": ema,
    }


# ---------------------------------------------------------------------- the head
def shift_right(x: torch.Tensor) -> torch.Tensor:
    """``x`` moved one position along dim 1, zeros first: position j reads row j-1 (EAGLE's feature shift)."""
    return torch.cat([torch.zeros_like(x[:, :1]), x[:, :-1]], dim=1)


def unroll_masks(L: int, passes: int, dtype: torch.dtype = torch.float32) -> list[torch.Tensor]:
    """Additive masks of the training-time unroll (EAGLE-3's "training-time test"), one per pass.

    Pass ``k`` (1-based) at position ``j`` stands for the token drafted at depth ``k - 1`` below the
    root ``r = j - k + 1``: it reads the head's own output of pass ``k - 1`` at ``j - 1`` as its feature
    and attends, as in the engine, to the rows fed with the target's features up to ``r`` (pass 1)
    and to the drafted rows above it (pass ``m`` at ``j - k + m``, ``2 <= m < k``), then itself. The
    key/value rows of the passes sit one after another in one cache: pass ``m``'s row ``i`` at
    column ``(m - 1) * L + i``. Returns Tensor[1, 1, L, k * L] for each pass ``k``.
    """
    from adaptive_spec.trees.masks import additive_mask

    out = []
    j = torch.arange(L)
    for k in range(1, passes + 1):
        allowed = torch.zeros(L, k * L, dtype=torch.bool)
        allowed[:, :L] = j[None, :] <= (j[:, None] - k + 1)  # pass-1 rows up to the root
        for m in range(2, k + 1):
            i = j - k + m  # the pass-m row on this path (m == k: the row itself)
            ok = i >= 0
            allowed[j[ok], (m - 1) * L + i[ok]] = True
        out.append(additive_mask(allowed, 0, dtype))
    return out


def unrolled_hidden(
    head: Any, ids: torch.Tensor, prev: torch.Tensor, pos: torch.Tensor, masks: Sequence[torch.Tensor]
) -> list[torch.Tensor]:
    """The head's outputs ``[B, L, H]`` of each unrolled pass (``masks`` from :func:`unroll_masks`).

    Pass 1 reads ``prev`` (the target's features, shifted by one); pass ``k`` reads pass ``k - 1``'s outputs,
    shifted by one, against one shared cache of every pass's keys and values.
    """
    from transformers import DynamicCache

    cache = DynamicCache(config=head.config) if len(masks) > 1 else None
    out = []
    for k, mask in enumerate(masks):
        h = head.hidden_states(ids, prev, pos, mask if cache is not None else None, cache)
        out.append(h)
        if k + 1 < len(masks):
            prev = shift_right(h)  # the next pass reads these
    return out


def train_head(
    head: Any,
    shards: Sequence[dict[str, torch.Tensor]],
    work: str | Path,
    *,
    minutes: float,
    steps: int = 100_000,
    lr: float = 1e-3,
    batch_tokens: int = 2048,
    feature_weight: float = 0.1,
    noise: float = 0.1,
    seed: int = 0,
    labels_from: int | None = None,
    passes: int = 2,
    progress: bool = True,
    device: torch.device | str = "cpu",
) -> dict[str, Any]:
    """Train a bound :class:`EagleHead` (soft CE over its vocabulary + smooth-L1 feature regression).

    As in EAGLE, the LM head stays the target's own (its rows of the draft vocabulary, frozen): the
    head learns to predict the target's next feature, which it also feeds back as a feature. With
    ``passes > 1`` the head is unrolled as it drafts (:func:`unroll_masks`): pass ``k`` trains the
    token at depth ``k`` of a chain on the head's own features, weighted ``0.8 ** (k - 1)``.
    """
    head.lm_head.weight.requires_grad_(False)
    device = torch.device(device)
    t2d = torch.full((head.config.target_vocab_size,), -1, dtype=torch.long, device=device)
    t2d[head.token_ids.to(device)] = torch.arange(head.token_ids.numel(), device=device)
    scale = float(torch.cat([d["feat"][:4096].float() for d in shards]).abs().mean())
    masks: dict[int, list[torch.Tensor]] = {}

    def loss_fn(model, b):
        feat, m = b["feat"], b["mask"]
        B, L = feat.shape[:2]
        prev = shift_right(feat)  # position j reads f_{j-1}
        prev = prev + (torch.rand_like(prev) * 2 - 1) * noise * scale
        pos = torch.arange(L, device=feat.device)[None].expand(B, -1)
        if L not in masks:
            masks.clear()
            masks[L] = [m.to(feat.device) for m in unroll_masks(L, passes)]
        total, weight = 0.0, 1.0
        for h in unrolled_hidden(model, b["ids"], prev, pos, masks[L]):
            ce = _soft_ce(model.lm_head, h[m], t2d[b["top_ids"][m]], b["top_p"][m])
            reg = nn.functional.smooth_l1_loss(h[m], feat[m])
            total = total + weight * (ce + feature_weight * reg)
            weight *= 0.8
        return total

    return _train_loop(
        head,
        loss_fn,
        _sequences(shards, labels_from),
        minutes=minutes,
        steps=steps,
        lr=lr,
        batch_tokens=batch_tokens,
        ckpt=Path(work) / "head.ckpt",
        seed=seed,
        progress=progress,
        label="head",
        device=device,
    )


# ---------------------------------------------------------------------- the standalone draft
def standalone_config(target_config: Any, hidden: int = 256, layers: int = 2) -> Any:
    """A small Llama config sharing the target's vocabulary, special tokens and rotary settings."""
    from transformers import LlamaConfig

    t = target_config
    return LlamaConfig(
        vocab_size=t.vocab_size,
        hidden_size=hidden,
        intermediate_size=3 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=hidden // 64,
        num_key_value_heads=max(1, hidden // 128),
        head_dim=64,
        max_position_embeddings=t.max_position_embeddings,
        rms_norm_eps=t.rms_norm_eps,
        rope_parameters=getattr(t, "rope_parameters", None),
        tie_word_embeddings=True,
        bos_token_id=t.bos_token_id,
        eos_token_id=t.eos_token_id,
        pad_token_id=t.pad_token_id,
    )


def init_standalone(target: Any, hidden: int = 256, layers: int = 2, seed: int = 0) -> Any:
    """The standalone draft, its tied embedding set to the target's projected on its top principal directions."""
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = standalone_config(target.config, hidden, layers)
    cfg._attn_implementation = "sdpa"
    model = LlamaForCausalLM(cfg)
    E = target.get_input_embeddings().weight.detach().float()
    U, S, _ = torch.linalg.svd(E - E.mean(0), full_matrices=False)
    init = U[:, :hidden] * S[:hidden]
    model.get_input_embeddings().weight.data.copy_(init / init.std() * 0.05)
    model.tie_weights()
    return model


def train_standalone(
    model: Any,
    shards: Sequence[dict[str, torch.Tensor]],
    work: str | Path,
    *,
    minutes: float,
    steps: int = 100_000,
    lr: float = 2e-3,
    batch_tokens: int = 2048,
    seed: int = 0,
    labels_from: int | None = None,
    progress: bool = True,
    device: torch.device | str = "cpu",
) -> dict[str, Any]:
    """Train the standalone draft on the target's soft labels (soft cross-entropy over the whole vocabulary)."""

    def loss_fn(m, b):
        h = m.model(input_ids=b["ids"]).last_hidden_state
        k = b["mask"]
        return _soft_ce(m.lm_head, h[k], b["top_ids"][k], b["top_p"][k])

    return _train_loop(
        model,
        loss_fn,
        _sequences(shards, labels_from),
        minutes=minutes,
        steps=steps,
        lr=lr,
        batch_tokens=batch_tokens,
        ckpt=Path(work) / "standalone.ckpt",
        seed=seed,
        progress=progress,
        label="standalone",
        device=device,
    )


# ---------------------------------------------------------------------- evaluation
@torch.inference_mode()
def evaluate_drafts(
    target: Any, drafts: dict[str, Any], shards: Sequence[dict[str, torch.Tensor]], max_tokens: int = 20000
) -> dict[str, dict[str, float]]:
    """Per draft, over held-out answer positions: ``sum(min(p, q))`` at T=1 and top-1 agreement.

    ``p`` is the target's full next-token law (recomputed here, not the stored top-K), ``q`` the
    draft's, teacher-forced on the target's own text: an EAGLE head reads the target's features.
    """
    from adaptive_spec.engine.eagle import is_eagle_head

    sums = {k: [0.0, 0.0, 0] for k in drafts}
    seen = 0
    device = target.device
    for d, s, e, a in _sequences(shards):
        if seen >= max_tokens:
            break
        ids = d["ids"][s:e].long()[None].to(device)
        h = target.model(input_ids=ids).last_hidden_state
        p = torch.softmax(target.lm_head(h).float(), -1)[0]  # [n, V]
        rows = slice(max(a - 1 - s, 0), e - s - 1)
        for name, m in drafts.items():
            if is_eagle_head(m):
                prev = shift_right(h)
                logits, _ = m(ids, prev.to(m.dtype), torch.arange(ids.shape[1], device=device)[None], None, None)
                q = torch.zeros_like(p)
                q[:, m.token_ids] = torch.softmax(logits[0].float(), -1)
            else:
                q = torch.softmax(m(input_ids=ids).logits[0].float(), -1)[:, : p.shape[-1]]
            pr, qr = p[rows], q[rows]
            sums[name][0] += float(torch.minimum(pr, qr).sum())
            sums[name][1] += float((pr.argmax(-1) == qr.argmax(-1)).sum())
            sums[name][2] += pr.shape[0]
        seen += e - a
    return {
        k: {"sum_min_pq_T1": v[0] / max(v[2], 1), "top1_agreement_T0": v[1] / max(v[2], 1), "positions": v[2]}
        for k, v in sums.items()
    }


@torch.inference_mode()
def draft_ms_per_token(model: Any, context: int = 256, repeats: int = 50) -> float:
    """Median ms of one drafted token through the engine's runner (a one-token block forward after ``context``)."""
    from adaptive_spec.engine.eagle import EagleRunner, is_eagle_head
    from adaptive_spec.engine.runner import ModelRunner

    runner = EagleRunner(model) if is_eagle_head(model) else ModelRunner(model)
    device = next(model.parameters()).device
    ids = torch.randint(0, 1000, (context + 1,), device=device)
    if isinstance(runner, EagleRunner):
        runner.set_target_features(0, torch.randn(context, model.config.hidden_size, device=device))
    runner.chain_forward(ids[:context], logits_to_keep=1)
    one = torch.ones(1, 1, dtype=torch.bool, device=device)
    pos = torch.tensor([context], device=device)
    times = []
    for _ in range(repeats + 5):
        t0 = time.perf_counter()
        runner.block_forward(ids[context:], pos, one, logits_to_keep=1)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - t0)
        runner.rollback(context)
    return 1e3 * sorted(times[5:])[repeats // 2]


def machine_load() -> dict[str, float]:
    """The 1, 5 and 15 minute load averages and the core count, for build_info.json."""
    try:
        one, five, fifteen = os.getloadavg()
    except OSError:
        one = five = fifteen = float("nan")
    return {"load_1m": one, "load_5m": five, "load_15m": fifteen, "cores": os.cpu_count() or 0}


def write_info(path: Path, info: dict[str, Any]) -> None:
    write_json_atomic(json.loads(json.dumps(info, default=str)), path)


# ---------------------------------------------------------------------- the whole build
def new_head(target: Any, train: Sequence[dict[str, torch.Tensor]], vocab_size: int) -> tuple[Any, float]:
    """An EAGLE-style head for ``target`` over the ``vocab_size`` most frequent answer tokens of ``train``.

    Its LM head starts from the target's rows of that vocabulary. Returns the head and the share of
    answer tokens the vocabulary covers.
    """
    from adaptive_spec.engine.eagle import EagleConfig, EagleHead

    vocab, coverage = choose_vocabulary(train, vocab_size, target.config.vocab_size)
    cfg = EagleConfig.for_target(target.config, draft_vocab_size=vocab_size)
    cfg._attn_implementation = "sdpa"
    head = EagleHead(cfg)
    head.set_vocabulary(vocab)
    head.bind(target)
    with torch.no_grad():
        head.lm_head.weight.copy_(target.get_output_embeddings().weight[vocab])
    return head, coverage


def vocabulary_coverage(train: Sequence[dict[str, torch.Tensor]], token_ids: torch.Tensor) -> float:
    """The share of ``train``'s answer tokens that a draft vocabulary (``token_ids``) holds."""
    vocab = max(int(token_ids.max()), *(int(d["ids"].max()) for d in train)) + 1
    counts = _answer_counts(train, vocab)
    return float(counts[token_ids.long().cpu()].sum() / counts.sum().clamp_min(1))


def shipped_drafts(target: Any, folder: str | Path) -> tuple[Any, Any]:
    """The committed EAGLE head (bound to ``target``) and standalone draft of ``folder``, in float32, to train on."""
    from transformers import AutoModelForCausalLM

    folder = Path(folder)
    for sub in ("eagle", "draft"):
        if not (folder / sub / "config.json").is_file():
            raise FileNotFoundError(f"no committed drafts to start from: {folder / sub} has no config.json")
    head = AutoModelForCausalLM.from_pretrained(folder / "eagle", dtype=torch.float32).bind(target)
    standalone = AutoModelForCausalLM.from_pretrained(folder / "draft", dtype=torch.float32)
    return head, standalone


MAX_SHARD = "16MB"  # weight files of at most 16 MiB: the GPU machine returns nothing larger


def save_sharded(model: Any, folder: str | Path) -> None:
    """``save_pretrained`` in fp16 files of at most :data:`MAX_SHARD` (with an index when there are several)."""
    model.half().save_pretrained(folder, max_shard_size=MAX_SHARD)


def _fits_on(device: torch.device, conv_tokens: int, hidden: int) -> bool:
    """Whether the features of ``conv_tokens`` positions (fp16, plus top-K labels) fit in half the free memory."""
    if device.type != "cuda":
        return False
    free, _ = torch.cuda.mem_get_info(device)
    return conv_tokens * (2 * hidden + 6 * TOP_K) < free // 2


def _budget(minutes: float | None, t_all: float) -> dict[str, float] | None:
    """Deadlines (``time.time()``) of a total budget: generation 40%, training to 85%, the rest for evaluation."""
    if minutes is None:
        return None
    return {"generate": t_all + 0.40 * minutes * 60, "train": t_all + 0.85 * minutes * 60}


@torch.inference_mode()
def user_like_evaluation(
    target: Any, tokenizer: Any, drafts: dict[str, Any], *, name: str, spec_bench: int = 48, answer_tokens: int = 128
) -> dict[str, Any]:
    """The drafts' figures on the target's greedy answers to the demo's prompts and a fixed Spec-Bench sample.

    Both sets are for evaluation only (:mod:`adaptive_spec.zoo.user_prompts`).
    """
    from adaptive_spec.zoo.online import answer_shard
    from adaptive_spec.zoo.user_prompts import demo_prompts, spec_bench_sample

    sets = {"demo_prompts": demo_prompts(name), f"spec_bench_{spec_bench}": spec_bench_sample(spec_bench)}
    out = {}
    for key, prompts in sets.items():
        shard = answer_shard(target, tokenizer, prompts, answer_tokens)
        out[key] = {"prompts": len(prompts), **evaluate_drafts(target, drafts, [shard], max_tokens=10**9)}
    return out


def used_seeds(folder: str | Path) -> set[int]:
    """Every shard seed of the committed build in ``folder`` and of the builds it went on from (its
    ``continued_from``): shard ``i`` of a build uses seed ``seed + i``.
    """
    path = Path(folder) / "build_info.json"
    info = json.loads(path.read_text()) if path.is_file() else None
    used: set[int] = set()
    while isinstance(info, dict):
        conv = info.get("conversations") or {}
        if isinstance(info.get("seed"), int) and isinstance(conv.get("shards"), int):
            used.update(range(info["seed"], info["seed"] + conv["shards"]))
        info = info.get("continued_from")
    return used


def reused_seeds(folder: str | Path, seed: int, shards: int) -> list[int]:
    """The shard seeds ``seed .. seed + shards - 1`` that :func:`used_seeds` holds: a build that goes on from the
    committed one with them regenerates the same conversations, so it trains on data the drafts have seen.
    """
    return sorted(s for s in used_seeds(folder) if seed <= s < seed + shards)


def unused_seed(folder: str | Path) -> int:
    """The first multiple of 1000 above every one of :func:`used_seeds`: a seed for a build that goes on from the
    committed one with new conversations (0 when there is none).
    """
    used = used_seeds(folder)
    return (max(used) // 1000 + 1) * 1000 if used else 0


def build_drafts(
    name: str = "smollm2",
    *,
    work: str | Path | None = None,
    out: str | Path | None = None,
    shards: int = 40,
    head_minutes: float = 20.0,
    draft_minutes: float = 12.0,
    vocab_size: int = 8192,
    seed: int = 0,
    progress: bool = True,
    device: str | torch.device = "cpu",
    minutes: float | None = None,
    prompt_files: Sequence[str | Path] = (),
    spec_bench: int = 48,
    init: str = "new",
    batch: int | None = None,
) -> dict[str, Any]:
    """Every stage of the module docstring for model ``name``; each resumes where it stopped.

    ``work`` holds the data and checkpoints (default ``<user data>/distill/<name>``); ``out`` gets
    ``eagle/`` and ``draft/`` (fp16 safetensors in files of at most 16 MiB) and ``build_info.json``
    (default: the package's ``zoo/<name>`` folder, the committed copy).

    ``device``: where every stage runs (``cuda``: batched generation sized for it, features kept in its
    memory when they fit, bf16 training). ``minutes``: a total budget (generation stops starting shards at
    40% of it, the head and the standalone draft share the training time up to 85%, 70/30), instead of
    ``head_minutes``/``draft_minutes``. ``prompt_files``: JSONL prompt sets (:func:`read_prompt_file`) whose
    prompts make every other conversation shard's requests. The figures are reported on the held-out
    shards, the demo's prompts and ``spec_bench`` Spec-Bench questions (both evaluation only).
    ``init``: ``"new"`` (a head over this data's most frequent tokens, a fresh standalone draft) or
    ``"shipped"`` (go on training the committed head and draft, their vocabularies kept, at a lower peak
    learning rate: what this data adds to what they learned before; the committed ones are evaluated
    beside them as ``eagle_before`` and ``draft_before``). ``batch``: conversations per shard, generated
    together (default 384 on CUDA, 96 on a CPU; smaller shards let a short budget stop sooner).
    """
    if init not in ("new", "shipped"):
        raise ValueError(f"init must be 'new' or 'shipped', got {init!r}")
    from transformers import AutoTokenizer

    from adaptive_spec.engine.models import MODELS, fetch_model, shipped_drafts_dir
    from adaptive_spec.engine.pretrained import load_causal_lm
    from adaptive_spec.files import user_data_dir
    from adaptive_spec.zoo.selfdistill import generate_conversations
    from adaptive_spec.zoo.user_prompts import read_prompt_file

    t_all = time.time()
    device = torch.device(device)
    deadlines = _budget(minutes, t_all)
    torch.manual_seed(seed)
    work = Path(work) if work is not None else user_data_dir() / "distill" / name
    out = Path(out) if out is not None else shipped_drafts_dir(name)
    user_prompts: list[str] = []
    sources = []
    for f in prompt_files:
        got, desc = read_prompt_file(f, name=name)
        user_prompts += got
        sources.append(desc)
    info: dict[str, Any] = {
        "target": name,
        "source": MODELS[name].description,
        "load_before": machine_load(),
        "threads": torch.get_num_threads(),
        "seed": seed,
        "device": str(device) + (f" ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else ""),
        "minutes_budget": minutes,
    }
    target_dir = fetch_model(name)
    tok = AutoTokenizer.from_pretrained(target_dir)
    target = load_causal_lm(target_dir, "target", dtype=torch.float32).to(device).eval()
    for p in target.parameters():
        p.requires_grad_(False)

    committed = shipped_drafts_dir(name)
    if init == "shipped" and (again := reused_seeds(committed, seed, shards)):
        print(
            f"zoo drafts: shard seeds {again[0]}-{again[-1]} were used by the committed build: those shards repeat "
            f"its conversations; pass a --seed it did not use (e.g. {unused_seed(committed)}) for new data",
            flush=True,
        )
    t = time.time()
    conv = generate_conversations(
        target,
        tok,
        work / "conv",
        shards=shards,
        seed=seed,
        progress=progress,
        batch=batch if batch is not None else (384 if device.type == "cuda" else 96),
        user_prompts=user_prompts,
        deadline=deadlines["generate"] if deadlines else None,
        first=[HELD_OUT - 1],  # a build its budget stops early still has a held-out shard
    )
    info["conversations"] = {
        **conv,
        "seconds_this_run": round(time.time() - t, 1),
        "data": "the target's own requests and answers (self-distillation); no benchmark text",
        "licence": f"generated by {name} ({MODELS[name].licence})",
    }
    if sources:
        info["conversations"]["data"] = (
            "the target's own requests and answers, and the target's answers to the prompt files' requests "
            "(every other shard); no benchmark text"
        )
        info["conversations"]["prompt_files"] = sources
    t = time.time()
    n_conv = sum(len(c["prompt_ids"]) + len(c["answer_ids"]) for c in read_conversations(work / "conv"))
    memory: dict[int, dict[str, torch.Tensor]] | None = (
        {} if _fits_on(device, n_conv, target.config.hidden_size) else None
    )
    n = extract_features(target, work / "conv", work / "feat", progress=progress, keep=memory)
    info["features"] = {
        "tokens_this_run": n,
        "seconds_this_run": round(time.time() - t, 1),
        "tok_per_s": round(n / max(time.time() - t, 1e-9), 1) if n else None,
        "top_k": TOP_K,
        "kept_in": f"{device} memory" if memory is not None else "fp16 files",
    }
    train = load_features(work / "feat", held=False, memory=memory)
    held = load_features(work / "feat", held=True, memory=memory)
    if device.type == "cuda":  # one device for every shard (those read from files too)
        train = [
            {k: v.to(device) if k not in ("starts", "answer", "given") else v for k, v in d.items()} for d in train
        ]
    info["tokens"] = {
        "train": sum(int(d["starts"][-1]) for d in train),
        "held_out": sum(int(d["starts"][-1]) for d in held),
    }

    before: dict[str, Any] = {}
    if init == "shipped":
        head, standalone = shipped_drafts(target, committed)
        b_head, b_draft = shipped_drafts(target, committed)  # evaluated beside the new ones
        before = {"eagle_before": b_head.to(device).eval(), "draft_before": b_draft.to(device).eval()}
        vocab_size = head.token_ids.numel()
        coverage = vocabulary_coverage(train, head.token_ids)
        info["init"] = "the drafts committed before (their build: continued_from), trained on further"
        if (committed / "build_info.json").is_file():
            info["continued_from"] = json.loads((committed / "build_info.json").read_text())
    else:
        head, coverage = new_head(target, train, vocab_size)
        standalone = init_standalone(target, seed=seed)
        info["init"] = "new"
    head.to(device)
    standalone.to(device)
    info["draft_vocabulary"] = {"size": vocab_size, "answer_token_coverage": round(coverage, 4)}
    if deadlines:  # the training share of the budget, 70% head / 30% standalone draft
        left = max(deadlines["train"] - time.time(), 60.0) / 60
        head_minutes, draft_minutes = 0.7 * left, 0.3 * left
    # Labels: the target's own text, its self-written request included (the fixed system prompt is not).
    from adaptive_spec.zoo.selfdistill import user_prefix

    first = len(user_prefix(tok))
    kw = {"seed": seed, "labels_from": first, "progress": progress, "device": device}
    info["labels"] = "every position after the chat template's fixed opening: the request and the answer"
    lr = {"lr": 3e-4} if init == "shipped" else {}
    info["head"] = train_head(head, train, work, minutes=head_minutes, **kw, **lr)
    info["standalone"] = train_standalone(standalone, train, work, minutes=draft_minutes, **kw, **lr)
    drafts = {"eagle": head, "draft": standalone}
    # No held-out shard (a build of fewer than HELD_OUT shards): no figures, rather than zeros.
    info["held_out"] = evaluate_drafts(target, {**drafts, **before}, held) if held else None
    info["user_like"] = user_like_evaluation(target, tok, {**drafts, **before}, name=name, spec_bench=spec_bench)
    info["speed"] = {
        "device": str(device),
        "generation_tok_per_s": conv.get("tok_per_s"),
        "features_tok_per_s": info["features"]["tok_per_s"],
        "head_training_tok_per_s": info["head"].get("tok_per_s"),
        "standalone_training_tok_per_s": info["standalone"].get("tok_per_s"),
    }
    ms = {k: draft_ms_per_token(m) for k, m in (("eagle", head), ("draft", standalone), ("target", target))}
    info["ms_per_draft_token"] = {**ms, "context": 256, "device": str(device), "threads": torch.get_num_threads()}
    info["load_after"] = machine_load()
    info["seconds_this_run"] = round(time.time() - t_all, 1)
    save_sharded(head.cpu(), out / "eagle")
    save_sharded(standalone.cpu(), out / "draft")
    write_info(out / "build_info.json", info)
    return info
