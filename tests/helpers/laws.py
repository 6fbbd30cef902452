"""The exact law of a tiny target's first three tokens, and the chi-square test of generated counts against it."""

from __future__ import annotations

import itertools

import torch
from scipy.stats import chisquare

from adaptive_spec.engine.logits import ProbsFn, SamplingConfig, build_logits_processor


def exact_law(model, sampling: SamplingConfig, prompt: list[int], V: int) -> torch.Tensor:
    """Tensor[V, V, V]: the target's law of the first three tokens after ``prompt`` under ``sampling``."""
    probs_fn = ProbsFn(build_logits_processor(sampling.generation_config()), V, one_hot=False)
    seqs = torch.tensor([prompt + [a, b] for a, b in itertools.product(range(V), repeat=2)])  # [V*V, L+2]
    with torch.inference_mode():
        logits = model(input_ids=seqs).logits  # [V*V, L+2, V]
    L = len(prompt)
    p1 = probs_fn(logits[0, L - 1 : L]).double()[0]  # [V]
    p2 = probs_fn(logits[::V, L]).double()  # [V(x1), V]: sequences with b == 0 give p(x2 | x1)
    p3 = probs_fn(logits[:, L + 1]).double().view(V, V, V)  # [x1, x2, x3]
    return p1[:, None, None] * p2[:, :, None] * p3


def chi_square_pvalue(counts: torch.Tensor, probs: torch.Tensor, min_expected: float = 5.0) -> float:
    n = counts.sum()
    expected = probs.flatten() * n
    counts = counts.flatten().double()
    assert counts[expected == 0].sum() == 0, "a zero-probability outcome was generated"
    small = expected < min_expected
    obs = torch.cat([counts[~small], counts[small].sum()[None]])
    exp = torch.cat([expected[~small], expected[small].sum()[None]])
    keep = exp > 0
    obs, exp = obs[keep], exp[keep]
    exp = exp * (obs.sum() / exp.sum())  # float rounding: scipy wants equal totals
    return float(chisquare(obs.numpy(), exp.numpy()).pvalue)
