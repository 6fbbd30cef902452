"""A synthetic label table with a learnable structure, for selector tests (written with write_labels).

Each prompt has a draft/target agreement level (acceptance ``alpha``), visible to the selector
through ``l1_target_draft`` (``1 - l1/2`` is the acceptance) and optionally through the draft
hidden state. Block efficiency follows the i.i.d.-acceptance formula per tree shape, step time a
linear latency model; so short chains win when alpha is low and deep trees when it is high, and a
good selector beats the best static action.
"""

from __future__ import annotations

import numpy as np

from adaptive_spec.formats.features import SCHEMA
from adaptive_spec.formats.label_table import LabelTable

ACTIONS = ["chain:1/block", "chain:2/block", "chain:4/block", "chain:8/block", "iid:2x3/traversal"]
_SHAPES = [(1, 1), (1, 2), (1, 4), (1, 8), (2, 3)]  # (paths K, depth L)


def block_efficiency(alpha: np.ndarray, k: int, depth: int) -> np.ndarray:
    """E[tau + 1] when each drafted token is accepted with probability alpha independently: K paths of depth L."""
    return 1 + sum(1 - (1 - alpha**d) ** k for d in range(1, depth + 1))


def synthetic_labels(num_prompts: int = 24, steps: int = 16, seed: int = 0, hidden: bool = False) -> LabelTable:
    rng = np.random.default_rng(seed)
    n = num_prompts * steps
    prompt = np.repeat(np.arange(num_prompts), steps)
    step = np.tile(np.arange(steps), num_prompts)
    temperature = np.where(prompt % 2 == 0, 0.0, 1.0)
    # Two regimes (poor and good draft agreement), so that no single action is best everywhere.
    low = rng.random(num_prompts) < 0.5
    base_alpha = np.where(low, rng.uniform(0.02, 0.3, num_prompts), rng.uniform(0.75, 0.98, num_prompts))[prompt]
    alpha = np.clip(base_alpha + 0.05 * rng.standard_normal(n), 0.02, 0.98) * np.where(temperature > 0, 0.9, 1.0)
    feats = {name: rng.standard_normal(n) for name in SCHEMA.names}  # noise columns
    feats.update(
        l1_target_draft=2 * (1 - alpha),
        temperature=temperature,
        top_p=np.ones(n),
        context_length=20.0 + 5 * step,
        is_first_step=(step == 0).astype(float),
        draft_ms=np.full(n, 1.5),
        target_ms=np.full(n, 8.0),
        target_ms_per_token=np.full(n, 0.3),
    )
    features = np.stack([feats[name] for name in SCHEMA.names], axis=1).astype(np.float32)
    be = np.stack([block_efficiency(alpha, k, d) for k, d in _SHAPES], axis=1)
    be *= 1 + 0.01 * rng.standard_normal(be.shape)
    nodes = np.array([1 + k * d for k, d in _SHAPES], dtype=float)
    depth = np.array([d for _, d in _SHAPES], dtype=float)
    step_time = (depth * 1.5 + 8.0 + 0.3 * nodes)[None, :] * 1e-3 * np.ones((n, 1))
    draft_hidden = None
    if hidden:
        draft_hidden = rng.standard_normal((n, 8)).astype(np.float16)
        draft_hidden[:, 0] = (alpha * 4 - 2).astype(np.float16)
    return LabelTable(
        actions=list(ACTIONS),
        features=features,
        block_efficiency=be.astype(np.float32),
        step_time_s=step_time.astype(np.float32),
        run_id=["synthetic"] * n,
        prompt_key=[f"p{p:03d}" for p in prompt],
        step=step.astype(np.int32),
        draft_hidden=draft_hidden,
        manifest={"source": "tests/selector/_synthetic.py", "seed": seed},
    )
