"""The selector network: a plain ``nn.Module`` (no Lightning), the one that is exported to ONNX.

After DDTE's neural selector (Thomas et al., arXiv 2602.16994, App. E; see docs/algorithms.md §8 and the
reference): each hidden-state block is projected to ``proj_dim`` and layer-normalised, the scalar
features are standardised, everything is concatenated and an MLP gives one logit per action.
Departures from the paper: two hidden blocks (draft and target at the root, the columns of
:data:`adaptive_spec.formats.features.SCHEMA`) instead of three, both optional; the scalar
standardisation lives *inside* the module as buffers, so the exported graph takes raw features;
standardised values are clipped to ``±clip`` so that one wild input (a context length far beyond
the training data) cannot drown the others.

The default objective, :func:`selector_loss` with ``objective="net"``, maximises the *aggregate*
tokens/s a run measures (a ratio of sums) rather than DDTE's mean of per-context ratios: each
context's value of an action is ``E[τ+1] - λ T``, with ``λ`` the best static plan's tokens/s
(see :mod:`adaptive_spec.selector.datamodule`). DDTE's own objective is kept as ``"ddte"``. A
cross-entropy towards the soft per-context best action keeps actions the policy has given up on
reachable. Actions outside the candidate set get a fixed ``-1e4`` logit bias (a buffer, so the
exported graph never picks them).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F  # noqa: N812 (PyTorch's own convention)
from torch import nn

OBJECTIVES = ("net", "ddte", "expected")
EXCLUDED_BIAS = -1.0e4  # logit bias of an action outside the candidate set


class SelectorNet(nn.Module):
    """Scalar features (+ optional hidden states) -> one logit per action.

    Args:
        num_features: scalar features F (``SCHEMA.num_scalar``).
        num_actions: actions A (the label table's action list).
        draft_hidden_dim: width of the draft hidden state input; 0 = not an input.
        target_hidden_dim: width of the target hidden state input; 0 = not an input.
        proj_dim: width of each hidden-state projection (DDTE: 128).
        hidden_sizes: MLP hidden layer widths (DDTE: 512, 32).
        dropout: dropout after each MLP hidden layer (off in ``eval()``, so absent from the export).
        clip: standardised features are clipped to ``[-clip, clip]``.
    """

    def __init__(
        self,
        num_features: int,
        num_actions: int,
        draft_hidden_dim: int = 0,
        target_hidden_dim: int = 0,
        proj_dim: int = 128,
        hidden_sizes: Sequence[int] = (512, 32),
        dropout: float = 0.1,
        clip: float = 8.0,
    ) -> None:
        super().__init__()
        if num_features < 1 or num_actions < 2:
            raise ValueError(f"need >= 1 feature and >= 2 actions, got {num_features} and {num_actions}")
        self.num_features, self.num_actions = num_features, num_actions
        self.draft_hidden_dim, self.target_hidden_dim = draft_hidden_dim, target_hidden_dim
        self.clip = float(clip)
        # Set from the training split by the data module; identity until then.
        self.register_buffer("feature_mean", torch.zeros(num_features))
        self.register_buffer("feature_std", torch.ones(num_features))
        self.register_buffer("action_bias", torch.zeros(num_actions))  # 0 = candidate, EXCLUDED_BIAS = never
        self.draft_proj = _projection(draft_hidden_dim, proj_dim)
        self.target_proj = _projection(target_hidden_dim, proj_dim)
        width = num_features + proj_dim * ((draft_hidden_dim > 0) + (target_hidden_dim > 0))
        layers: list[nn.Module] = []
        for h in hidden_sizes:
            layers += [nn.Linear(width, h), nn.GELU(), nn.Dropout(dropout)]
            width = h
        layers.append(nn.Linear(width, num_actions))
        self.mlp = nn.Sequential(*layers)

    @property
    def input_names(self) -> list[str]:
        """The forward's inputs, in order (also the ONNX graph's input names)."""
        names = ["features"]
        if self.draft_proj is not None:
            names.append("draft_hidden")
        if self.target_proj is not None:
            names.append("target_hidden")
        return names

    def set_standardisation(self, mean: Sequence[float] | torch.Tensor, std: Sequence[float] | torch.Tensor) -> None:
        """Store the training split's feature mean and standard deviation (zero std -> 1)."""
        mean = torch.as_tensor(mean, dtype=torch.float32).reshape(-1)
        std = torch.as_tensor(std, dtype=torch.float32).reshape(-1)
        if mean.numel() != self.num_features or std.numel() != self.num_features:
            raise ValueError(f"standardisation needs {self.num_features} means and stds")
        std = torch.where(std > 1e-6, std, torch.ones_like(std))  # constant features pass through centred
        self.feature_mean.copy_(mean)
        self.feature_std.copy_(std)

    def set_candidates(self, candidates: Sequence[int] | None) -> None:
        """Restrict the choice to the action indices ``candidates`` (None: every action)."""
        bias = torch.zeros(self.num_actions)
        if candidates is not None:
            index = torch.as_tensor(list(candidates), dtype=torch.long)
            if index.numel() == 0 or int(index.min()) < 0 or int(index.max()) >= self.num_actions:
                raise ValueError(f"candidates must be non-empty indices in [0, {self.num_actions}), got {candidates}")
            bias.fill_(EXCLUDED_BIAS)
            bias[index] = 0.0
        self.action_bias.copy_(bias)

    @property
    def candidates(self) -> list[int]:
        """The action indices the network can choose."""
        return torch.nonzero(self.action_bias == 0).flatten().tolist()

    def forward(
        self,
        features: torch.Tensor,  # [B, F] raw scalar features, SCHEMA order
        draft_hidden: torch.Tensor | None = None,  # [B, Hd]
        target_hidden: torch.Tensor | None = None,  # [B, Ht]
    ) -> torch.Tensor:  # [B, A] logits
        x = ((features - self.feature_mean) / self.feature_std).clamp(-self.clip, self.clip)
        parts = [x]
        blocks = ((self.draft_proj, draft_hidden, "draft_hidden"), (self.target_proj, target_hidden, "target_hidden"))
        for proj, h, name in blocks:
            if proj is None:
                continue
            if h is None:
                raise ValueError(f"this selector takes {name}; pass it")
            parts.append(proj(h.to(x.dtype)))
        return self.mlp(torch.cat(parts, dim=-1)) + self.action_bias


def _projection(dim: int, proj_dim: int) -> nn.Module | None:
    return nn.Sequential(nn.Linear(dim, proj_dim), nn.LayerNorm(proj_dim)) if dim > 0 else None


def selector_loss(
    logits: torch.Tensor,  # [B, A]
    block_efficiency: torch.Tensor,  # [B, A] E[τ+1] per action
    step_time_s: torch.Tensor,  # [B, A] predicted seconds per step
    base_tps: torch.Tensor,  # [B] tokens/s of the best static action for the row's sampling settings
    *,
    objective: str = "net",
    net_value: torch.Tensor | None = None,  # [B, A] (BE - λT) / (λ T_static); needed by "net"
    action_bias: torch.Tensor | None = None,  # [A] the network's candidate bias (0 or EXCLUDED_BIAS)
    tail_weight: float = 0.0,
    tail_fraction: float = 0.1,
    ce_weight: float = 0.0,
    ce_temperature: float = 0.05,
) -> torch.Tensor:
    """The selector's training loss (lower is better), a scalar.

    Objectives (``r`` is the policy's tokens/s at a context relative to the best static action):

    - ``"net"``: ``r = 1 + Σ_a π_a V_a`` with ``V = net_value``; loss ``-mean(r)``. Summed over
      contexts this is the aggregate tokens gained over the static rate per static step, so its
      maximiser, ``argmax_a BE_a - λ T_a`` per context, maximises the aggregate tokens/s.
    - ``"ddte"``: ``r = (Σ_a π_a BE_a / Σ_a π_a T_a) / TPS_base``; loss ``mean(-log r)`` (DDTE App. E).
    - ``"expected"``: ``r = Σ_a π_a (BE_a / T_a) / TPS_base``; loss ``-mean(r)``.

    The last two put all mass on ``argmax_a BE_a / T_a``, the best *per-context* ratio, which
    favours rare big wins over the aggregate.

    Extra terms:
        tail: ``tail_weight`` times the mean of ``max(1 - r, 0)²`` over the worst ``tail_fraction``
            of the batch (DDTE's guard against contexts where the policy loses to the static plan).
        cross-entropy: ``ce_weight`` times the cross-entropy towards a soft per-context best
            action, ``softmax(V / ce_temperature)`` for ``"net"`` (a 5% static step worse gets
            weight 1/e at 0.05), else ``softmax(log(tps_a / max tps) / ce_temperature)``; restricted
            to the candidates when ``action_bias`` is given.
    """
    if objective not in OBJECTIVES:
        raise ValueError(f"unknown objective {objective!r}; use one of {', '.join(OBJECTIVES)}")
    if objective == "net" and net_value is None:
        raise ValueError('objective "net" needs net_value [B, A]')
    logits = logits.float()
    probs = logits.softmax(dim=-1)
    tps = block_efficiency / step_time_s  # [B, A]
    if objective == "net":
        r = 1 + (probs * net_value).sum(-1)
        loss = -r.mean()
    elif objective == "ddte":
        r = (probs * block_efficiency).sum(-1) / (probs * step_time_s).sum(-1) / base_tps
        loss = -r.clamp_min(1e-12).log().mean()
    else:
        r = (probs * tps).sum(-1) / base_tps
        loss = -r.mean()
    if tail_weight > 0:
        k = max(1, math.ceil(tail_fraction * r.numel()))
        shortfall = (1 - r).clamp_min(0).square()
        loss = loss + tail_weight * shortfall.topk(k).values.mean()
    if ce_weight > 0:
        score = net_value.float() if objective == "net" else tps.log() - tps.log().amax(dim=-1, keepdim=True)
        score = score / ce_temperature
        if action_bias is not None:
            score = score + action_bias.to(score.dtype)
        target = score.softmax(dim=-1)
        loss = loss + ce_weight * F.cross_entropy(logits, target)
    return loss
