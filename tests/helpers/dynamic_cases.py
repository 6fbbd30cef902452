"""Drafting policies and instances for the exact tests of policy-grown (dynamic) trees."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from adaptive_spec.analysis.instances import Instance, random_instance, toy_instance
from adaptive_spec.rng import Sampler
from adaptive_spec.trees import DraftLaw, TreeShape
from adaptive_spec.trees.policy import (
    ConfidenceChain,
    ConfidenceDelayed,
    CumulativeChain,
    DraftPolicy,
    EagleTree,
    FixedShapePolicy,
    LearnedChain,
    LookedChain,
    LookedDelayed,
    NodeView,
    PolicyContext,
)

DYNAMIC_LAWS = (DraftLaw.DYNAMIC_CHAIN, DraftLaw.DYNAMIC_IID, DraftLaw.DYNAMIC_WOR)


@dataclass(frozen=True)
class RandomPolicy(DraftPolicy):
    """Random decisions that lean on draft-side facts: depth, the draft probabilities, path confidence.

    ``widths``: a categorical over 0..max_width whose weights move with the node's own top-1 and
    depth. ``feed``: a coin whose bias is the token's draft probability (or the path's).
    """

    kind: DraftLaw = DraftLaw.DYNAMIC_IID
    cap: int = 2
    use_path: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "law", self.kind)

    @property
    def max_width(self) -> int:
        return 1 if self.kind is DraftLaw.DYNAMIC_CHAIN else self.cap

    def feed(self, views: Sequence[NodeView], ctx: PolicyContext, sampler: Sampler) -> list[bool]:
        out = []
        for v in views:
            bias = v.path_prob if self.use_path else v.token_prob
            out.append(sampler.flip(0.2 + 0.6 * bias))
        return out

    def widths(self, views: Sequence[NodeView], ctx: PolicyContext, sampler: Sampler) -> list[int]:
        import torch

        out = []
        for v in views:
            top = v.top1 if v.top1 is not None else 0.5
            w = [1.0 + v.depth] + [top * (k + 1) + 0.1 for k in range(self.max_width)]  # 0, 1, ..., max_width
            out.append(sampler.categorical(torch.tensor(w, dtype=torch.float64)))
        return out

    def __str__(self) -> str:
        return f"random({self.kind.value},D={self.depth},B={self.budget},path={self.use_path})"


class TinyAcceptanceNet:
    """A fixed logistic model standing in for a trained acceptance model (draft-side features in).

    Hand-set weights plus seeded noise, so that its outputs move with the token's draft
    probability, the parent's top-1 and the depth: the decisions then vary.
    """

    def __init__(self, seed: int) -> None:
        import numpy as np

        rng = np.random.default_rng(seed)
        # features: depth, log q(token), parent top-1, parent entropy, log path prob, temperature
        skeleton = np.array([[-0.6, -0.8], [2.5, 0.0], [1.0, 4.0], [0.0, -0.5], [1.0, 1.0], [0.0, 0.0]])
        self.w = (skeleton + 0.3 * rng.normal(size=(6, 2))).astype(np.float32)
        self.bias = np.array([1.5, -1.0], dtype=np.float32)

    def __call__(self, rows):
        import numpy as np

        x = np.asarray(rows, dtype=np.float64).reshape(len(rows), 6)  # in float64, as the device's layers below
        return (1.0 / (1.0 + np.exp(-(x @ self.w.astype(np.float64) + self.bias)))).tolist()

    def device_layers(self, device):
        """The one layer as float64 tensors ``(W [2, 6], b [2])``: the policy decided on the device."""
        import torch

        return [
            (
                torch.tensor(self.w.T, dtype=torch.float64, device=device),
                torch.tensor(self.bias, dtype=torch.float64, device=device),
            )
        ]


def policies_for(law: DraftLaw) -> list[DraftPolicy]:
    """Deterministic and random policies of ``law``, small enough for exact enumeration at V <= 3."""
    if law is DraftLaw.DYNAMIC_CHAIN:
        return [
            ConfidenceChain(depth=2, threshold=0.5),
            ConfidenceChain(depth=3, threshold=0.6),
            CumulativeChain(depth=3, min_path_prob=0.3),
            RandomPolicy(depth=2, budget=2, kind=law),
            RandomPolicy(depth=3, budget=3, kind=law, use_path=True),
            FixedShapePolicy(TreeShape.chain(2)),
            LearnedChain(depth=3, cost_ratio=0.2, predictor=TinyAcceptanceNet(0)),
            LearnedChain(depth=3, cost_ratio=0.08, predictor=TinyAcceptanceNet(1)),
            # a policy chain decided on the device, its look after node 1 (engine.drafting.draft_chain_on_device)
            LookedChain(3, inner=ConfidenceChain(depth=3, threshold=0.6), look=1),
            LookedChain(3, inner=CumulativeChain(depth=3, min_path_prob=0.3), look=2),
            LookedChain(3, inner=LearnedChain(depth=3, cost_ratio=0.08, predictor=TinyAcceptanceNet(1)), look=1),
        ]
    if law is DraftLaw.DYNAMIC_IID:
        return [
            ConfidenceDelayed(depth=2, budget=3, threshold=0.6, paths=2),
            ConfidenceDelayed(depth=3, budget=4, threshold=0.5, paths=2, branch_threshold=0.5),
            EagleTree(depth=2, budget=4, top_k=1, width=2),
            RandomPolicy(depth=2, budget=3, kind=law),
            RandomPolicy(depth=2, budget=4, kind=law, use_path=True),
            FixedShapePolicy(TreeShape.delayed(1, 2, 1)),
            # conf-delayed decided on the device, its trunk read once after 1 decision (draft_conf_delayed's looked)
            LookedDelayed(2, inner=ConfidenceDelayed(depth=2, budget=4, threshold=0.5, paths=2), look=1),
            # and with paths that may stop (a branch threshold: flagged slots on the device)
            LookedDelayed(
                3, inner=ConfidenceDelayed(depth=3, budget=6, threshold=0.6, paths=2, branch_threshold=0.5), look=1
            ),
        ]
    return [
        EagleTree(depth=2, budget=4, top_k=1, width=2, without_replacement=True),
        EagleTree(depth=3, budget=4, top_k=1, width=2, without_replacement=True),
        RandomPolicy(depth=2, budget=3, kind=law),
        RandomPolicy(depth=2, budget=4, kind=law, cap=3, use_path=True),
        FixedShapePolicy(TreeShape.without_replacement((2, 1))),
    ]


def dynamic_cases(law: DraftLaw, n_random: int = 50) -> list[tuple[Instance, DraftPolicy]]:
    """The toy plus ``n_random`` random instances (V in {2, 3}, about 25% exact zeros), policies cycled."""
    pols = policies_for(law)
    out: list[tuple[Instance, DraftPolicy]] = [(toy_instance(), pols[0])]
    for i in range(n_random):
        vocab = 2 + (i % 2)
        pol = pols[i % len(pols)]
        if vocab == 3 and pol.budget > 3 and law is not DraftLaw.DYNAMIC_CHAIN:
            pol = dataclasses.replace(pol, budget=3) if not isinstance(pol, FixedShapePolicy) else pol
        out.append((random_instance(7000 + 100 * DYNAMIC_LAWS.index(law) + i, vocab), pol))
    return out
