"""Figures of a draft/target pair: acceptance, greedy agreement, losses and one-token latency."""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence

import torch
import torch.nn.functional as F  # noqa: N812 (PyTorch's own convention)
from transformers import PreTrainedModel, PreTrainedTokenizerBase


def _windows(tokenizer: PreTrainedTokenizerBase, texts: Sequence[str], seq_len: int) -> list[torch.Tensor]:
    """Each text as token windows of at most ``seq_len + 1`` tokens (at least 2)."""
    out = []
    for text in texts:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        for start in range(0, max(1, len(ids) - 1), seq_len):
            chunk = ids[start : start + seq_len + 1]
            if len(chunk) >= 2:
                out.append(torch.tensor(chunk, dtype=torch.long))
    return out


@torch.inference_mode()
def window_figures(target: PreTrainedModel, draft: PreTrainedModel, windows: Sequence[torch.Tensor]) -> dict:
    """Teacher-forced figures over token windows (each LongTensor[n + 1]: n inputs, shifted labels).

    Every position of every window counts once (a token-weighted mean).
    """
    if not windows:
        raise ValueError("no windows to evaluate (texts too short?)")
    sums = {"acceptance": 0.0, "greedy_agreement": 0.0, "target_loss": 0.0, "draft_loss": 0.0, "kl": 0.0}
    n = 0
    for w in windows:
        inputs, labels = w[None, :-1], w[None, 1:]  # [1, n]
        target_logp = F.log_softmax(target(input_ids=inputs.to(target.device)).logits.float().cpu(), -1)[0]  # [n, V]
        draft_logp = F.log_softmax(draft(input_ids=inputs.to(draft.device)).logits.float().cpu(), -1)[0]  # [n, V]
        target_probs, draft_probs = target_logp.exp(), draft_logp.exp()
        # sum_v min(target_probs_v, draft_probs_v): probability that one drafted token is accepted at T=1.
        sums["acceptance"] += torch.minimum(target_probs, draft_probs).sum(-1).sum().item()
        sums["greedy_agreement"] += (target_logp.argmax(-1) == draft_logp.argmax(-1)).sum().item()
        sums["target_loss"] += F.nll_loss(target_logp, labels[0], reduction="sum").item()
        sums["draft_loss"] += F.nll_loss(draft_logp, labels[0], reduction="sum").item()
        sums["kl"] += (target_probs * (target_logp - draft_logp)).sum().item()
        n += labels.shape[1]
    return {k: v / n for k, v in sums.items()} | {"positions": n}


@torch.inference_mode()
def one_token_latencies(
    models: Sequence[PreTrainedModel], context: int, repeats: int, warmup: int = 10, seed: int = 0, block: int = 10
) -> list[float]:
    """Median seconds of a one-token forward *through the engine* with ``context`` cached tokens, per model.

    Each step is the engine's own call (:meth:`adaptive_spec.engine.runner.ModelRunner.block_forward`
    with its explicit 4-D mask and position ids, then reading the logits), so the figure is what a
    decoding step pays. The models take turns in blocks of ``block`` consecutive steps (as in
    decoding, where the draft runs several forwards in a row and then the target one), so that load
    from other processes on a shared machine affects their ratio as little as possible while each
    model runs with its own weights in the CPU caches; the cache is rolled back to ``context``
    after each step.
    """
    from adaptive_spec.engine.runner import ModelRunner

    vocab = min(m.config.vocab_size for m in models)
    gen = torch.Generator().manual_seed(seed)
    prompt = torch.randint(vocab, (context + 1,), generator=gen)  # [context + 1]
    times: list[list[float]] = [[] for _ in models]
    with torch.inference_mode():
        runners = []
        for m in models:
            runner = ModelRunner(m)
            runner.chain_forward(prompt[:context].to(m.device), logits_to_keep=1)
            runners.append(runner)

        def step(m: PreTrainedModel, runner: ModelRunner) -> float:
            x = prompt[context:].to(m.device)
            pos = torch.tensor([context], device=m.device)
            allowed = torch.ones(1, 1, dtype=torch.bool, device=m.device)
            if m.device.type == "cuda":
                torch.cuda.synchronize(m.device)
            t0 = time.perf_counter()
            logits = runner.block_forward(x, pos, allowed, logits_to_keep=1)
            logits.sum().item()  # waits for the device; the cost of a sampler reading the logits
            dt = time.perf_counter() - t0
            runner.rollback(context)  # drop the step just taken: back to ``context`` tokens
            return dt

        rounds = -(-repeats // block)
        for r in range(-(-warmup // block) + rounds):
            for i, (m, runner) in enumerate(zip(models, runners, strict=True)):
                for _ in range(block):
                    dt = step(m, runner)
                    if r >= -(-warmup // block):
                        times[i].append(dt)
    return [statistics.median(t) for t in times]


def evaluate_pair(
    target: PreTrainedModel,
    draft: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    texts: Sequence[str],
    *,
    seq_len: int = 256,
    latency_context: int = 128,
    latency_repeats: int = 60,
) -> dict:
    """Acceptance, greedy agreement, losses and one-token latencies of a draft/target pair.

    Args:
        texts: held-out text, cut into windows of ``seq_len`` tokens and teacher-forced.
        seq_len: window length in tokens.
        latency_context: KV-cache length at which one-token forwards are timed.
        latency_repeats: timed forwards per model (after 10 warm-up ones).

    Returns:
        ``acceptance``: mean over positions of ``sum_v min(target_probs_v, draft_probs_v)`` at T=1;
        ``greedy_agreement``: fraction of positions where the argmaxes agree;
        ``target_val_loss``/``draft_val_loss``: next-token cross-entropy (nats);
        ``kl``: mean KL(target || draft); ``positions``; ``target_latency_ms``/``draft_latency_ms``:
        median one-token forward time; ``latency_ratio``: target over draft.
    """
    target.eval()
    draft.eval()
    figs = window_figures(target, draft, _windows(tokenizer, texts, seq_len))
    t_lat, d_lat = one_token_latencies([target, draft], latency_context, latency_repeats)
    return {
        "acceptance": figs["acceptance"],
        "greedy_agreement": figs["greedy_agreement"],
        "target_val_loss": figs["target_loss"],
        "draft_val_loss": figs["draft_loss"],
        "kl": figs["kl"],
        "positions": figs["positions"],
        "target_latency_ms": 1e3 * t_lat,
        "draft_latency_ms": 1e3 * d_lat,
        "latency_ratio": t_lat / d_lat,
    }
