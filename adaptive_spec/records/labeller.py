"""The labeller: expected block efficiency and predicted step time of every action at one root context.

For every action of the action space it estimates

* E[τ + 1], averaged over ``samples`` draft trees (default 4, as in DDTE). The verifier's
  randomness is integrated out exactly on each fixed tree
  (:func:`adaptive_spec.analysis.expected.expected_block_efficiency`): closed forms for the
  token-level test, BV/traversal/GBV (one all-reject run) and the top-down walks (DDTE eq. 1-3);
* the predicted step time, from the latency profile (:class:`adaptive_spec.planner.latency.LatencyModel`).
  A chain policy's is the mean over the samples of the static chain of the length it kept (the
  policy's own decisions are not in the latency profile).

The trees come from one forest per root (:mod:`adaptive_spec.records.forest`), which the target
scores in ONE batched forward under a tree attention mask.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from adaptive_spec.analysis.expected import expected_block_efficiency
from adaptive_spec.engine.drafting import check_finite
from adaptive_spec.engine.logits import ProbsFn, SamplingConfig, build_logits_processor, finite_flag
from adaptive_spec.engine.runner import ModelRunner
from adaptive_spec.planner.plan import Plan
from adaptive_spec.records.forest import Forest, cut_tree, family_specs, grow_forest, policy_chain_length
from adaptive_spec.trees import DraftTree, TreeShape

__all__ = ["LabelConfig", "Labeller"]


@dataclass(frozen=True)
class LabelConfig:
    """Settings of a labelling run.

    Attributes:
        every: label the roots whose step index is a multiple of ``every`` (k).
        samples: draft trees per root and family (s); E[τ+1] is their mean.
        seed: seeds the tree draws (each root gets its own stream derived from it).
        max_contexts: stop after this many roots (None: all selected roots).
    """

    every: int = 4
    samples: int = 4
    seed: int = 0
    max_contexts: int | None = None

    def __post_init__(self) -> None:
        if self.every < 1 or self.samples < 1:
            raise ValueError(f"every and samples must be >= 1, got every={self.every}, samples={self.samples}")
        if self.max_contexts is not None and self.max_contexts < 1:
            raise ValueError(f"max_contexts must be >= 1 or None, got {self.max_contexts}")


class Labeller:
    """Labels root contexts for every action of a space with one draft/target pair.

    Args:
        target, draft: transformers causal LMs (eval mode) on the same device, same vocabulary.
        actions: the plans to label (an :class:`~adaptive_spec.planner.actions.ActionSpace` or list).
        latency: a :class:`~adaptive_spec.planner.latency.LatencyModel` (predicted step times).
        vocab_size: the shared vocabulary size.
        config: :class:`LabelConfig`.
    """

    def __init__(self, target, draft, actions, latency, vocab_size: int, config: LabelConfig | None = None) -> None:
        self.target, self.draft = target, draft
        self.plans = [a if isinstance(a, Plan) else Plan.parse(str(a)) for a in actions]
        self.latency = latency
        self.vocab_size = vocab_size
        self.config = config or LabelConfig()
        self.specs = family_specs(self.plans)
        self.device = next(target.parameters()).device

    def _family_of(self, shape: TreeShape) -> int:
        return next(i for i, spec in enumerate(self.specs) if spec.family_of(shape))

    @torch.inference_mode()
    def label(self, context_ids: list[int], temperature: float, top_k: int, top_p: float, seed: int):
        """(E[τ+1] per action [A], predicted seconds per step per action [A]) at one root context."""
        if len(context_ids) < 1:
            raise ValueError("a root context needs at least one token")
        sampling = SamplingConfig(float(temperature), int(top_k), float(top_p))
        processors = build_logits_processor(sampling.generation_config())
        target_fn = ProbsFn(processors, self.vocab_size, one_hot=sampling.greedy)
        draft_fn = ProbsFn(processors, self.vocab_size, one_hot=False)
        generator = torch.Generator(device=self.device).manual_seed(int(seed))
        ctx = torch.tensor(context_ids, dtype=torch.long, device=self.device)
        n = len(context_ids)

        draft = ModelRunner(self.draft)
        if n > 1:
            draft.chain_forward(ctx[:-1], logits_to_keep=1)
        root_logits = draft.block_forward(
            ctx[-1:],
            torch.tensor([n - 1], device=self.device),
            torch.ones(1, 1, dtype=torch.bool, device=self.device),
            logits_to_keep=1,
        )
        check_finite(finite_flag(root_logits), "draft")
        forest = Forest(self.specs, self.config.samples)
        rows = grow_forest(forest, draft, draft_fn(root_logits)[0], n, draft_fn, generator, sampling.greedy)

        target = ModelRunner(self.target)
        if n > 1:
            target.chain_forward(ctx[:-1], logits_to_keep=1)
        m = len(forest.tokens)
        ids = torch.tensor([context_ids[-1], *forest.tokens[1:]], dtype=torch.long, device=self.device)
        pos = torch.tensor([n - 1 + d for d in forest.depths], dtype=torch.long, device=self.device)
        logits = target.block_forward(ids, pos, forest.ancestors, logits_to_keep=m)  # ONE pass, all trees
        check_finite(finite_flag(logits), "target")
        target_probs = target_fn(logits).double()  # [m, V]
        rows = {k: v.double() for k, v in rows.items()}

        be = np.zeros(len(self.plans), dtype=np.float64)
        times = np.zeros(len(self.plans), dtype=np.float64)
        cut_cache: dict[tuple[str, int], tuple[DraftTree, torch.Tensor]] = {}
        stats: dict[int, tuple[float, float]] = {}  # (entropy, top-1) per draft row, for the policies
        for a, plan in enumerate(self.plans):
            fam = self._family_of(plan.shape)
            total, seconds = 0.0, 0.0
            for s in range(self.config.samples):
                tree = forest.trees[s * len(self.specs) + fam]
                shape = plan.shape
                if plan.policy is not None:  # the chain the policy keeps of this sample's chain
                    length = policy_chain_length(plan.policy, forest, tree.trunk_nodes, rows, temperature, stats)
                    shape = TreeShape.chain(length)
                    seconds += self.latency.predict(Plan(shape, plan.verifier), n, temperature=temperature).total_s
                key = (str(shape), s)
                if key not in cut_cache:
                    dtree, gids = cut_tree(forest, tree, shape, rows, self.vocab_size)
                    cut_cache[key] = (dtree, target_probs[torch.tensor(gids, device=self.device)])
                dtree, trows = cut_cache[key]
                verifier = "greedy" if sampling.greedy else plan.verifier
                value, _ = expected_block_efficiency(verifier, dtree, trows, generator=generator)
                total += value
            be[a] = total / self.config.samples
            if plan.policy is None:
                times[a] = self.latency.predict(plan, n, temperature=temperature).total_s
            else:
                times[a] = seconds / self.config.samples
        return be, times
