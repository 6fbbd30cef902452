"""Root features: what a planner sees before each speculative step (names: ``selector.features.SCHEMA``).

The *root* of a step is the last committed token. Its features compare two rows over the root
token itself, plus the draft's row after it:

- the *previous target row*: the target's distribution the root token came from, i.e. the
  target's row at the previous step's last accepted tree node (the target scores every node),
  or the prompt prefill's last row before the first step;
- the *previous draft row*: the draft's distribution at the same position: the row of that
  node in the previous tree if the draft expanded it, else (an accepted leaf, or a depth-0
  step) row -2 of this step's first draft forward, which feeds the pending tokens;
- the draft's *root distribution*: the last row of that first draft forward (over the first
  drafted token), computed before the planner chooses; drafting continues from it.

At temperature 0 the rows are plain softmaxes (T=1), since the greedy verifier's one-hot target
rows carry no information; otherwise they are the processed rows (temperature, top-k, top-p)
that drafting and verification use. With a one-token prompt there is no previous row before
the first step: the six comparison features are then 0.

With features on, the first draft forward runs before the planner chooses, so a depth-0 step
(chosen, or forced for the last token of a budget) runs it too: it feeds committed tokens,
which stay in the draft cache, so only a final depth-0 step costs an extra forward. Plain
autoregressive decoding (``plan=None``) has no speculative steps, hence no features.

:func:`root_statistics` computes the sums behind the eight distribution features on the device
in one small batch of kernels, :func:`distribution_features` finishes them on the host;
:class:`RootTracker` keeps the rows, hidden states and acceptance history between
steps and assembles the full feature dict with one host transfer per step.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import torch

from adaptive_spec.engine.drafting import check_finite
from adaptive_spec.formats.features import SCHEMA
from adaptive_spec.planner.plan import StepState
from adaptive_spec.trees.lookup import LookupMatch

if TYPE_CHECKING:
    from adaptive_spec.engine.outputs import EngineState
    from adaptive_spec.engine.request import GenerationRequest

DIST_NAMES = (
    "target_entropy",
    "draft_entropy",
    "kl_target_draft",
    "kl_draft_target",
    "l1_target_draft",
    "target_top1",
    "draft_root_entropy",
    "draft_root_top1",
)
LATENCY_NAMES = ("draft_ms", "target_ms", "target_ms_per_token")
EMA_WEIGHT = 0.3  # weight of the newest step in accepted_ema
# Probabilities are clamped here before a log: zeros (top-k/top-p, one-hot rows) give finite values.
LOG_CLAMP = torch.finfo(torch.float32).tiny


class LatencyFeatures(Protocol):
    """Anything with ``features(context_length)`` returning ``draft_ms``, ``target_ms`` and ``target_ms_per_token``.

    For example :class:`adaptive_spec.planner.latency.LatencyModel`.
    """

    def features(self, context_length: int) -> Mapping[str, float]: ...


def root_statistics(
    target_row: torch.Tensor,  # [V] previous target row
    draft_row: torch.Tensor,  # [V] previous draft row
    root_row: torch.Tensor,  # [V] the draft's root distribution
) -> torch.Tensor:
    """Float32 Tensor[9] on the rows' device (no host sync), the raw sums behind :data:`DIST_NAMES`.

    ``[t.log t, d.log d, r.log r, t.(log t - log d), d.(log t - log d), |t - d|_1, max t, max d,
    max r]``, probabilities clamped at :data:`LOG_CLAMP` inside logs; one small batch of
    kernels. :func:`distribution_features` turns them into the features on the host.
    """
    rows = torch.stack([target_row, draft_row, root_row]).float()  # [3, V]
    logs = rows.clamp_min(LOG_CLAMP).log()  # [3, V]
    return torch.cat(
        [
            (rows * logs).sum(-1),  # [3] minus the entropies
            rows[:2] @ (logs[0] - logs[1]),  # [2] KL(t || d) and -KL(d || t)
            (rows[0] - rows[1]).abs().sum()[None],  # [1] L1 distance
            rows.amax(-1),  # [3] top-1 probabilities
        ]
    )


def distribution_features(stats: list[float], known: bool) -> dict[str, float]:
    """The :data:`DIST_NAMES` features from :func:`root_statistics` (as host floats).

    The six comparison features are 0 when the previous rows are not ``known``.
    """
    t_log_t, d_log_d, r_log_r, kl_td, minus_kl_dt, l1, top_t, _, top_r = stats
    if not known:
        t_log_t = d_log_d = kl_td = minus_kl_dt = l1 = top_t = 0.0
    values = (-t_log_t, -d_log_d, kl_td, -minus_kl_dt, l1, top_t, -r_log_r, top_r)
    return {name: v + 0.0 for name, v in zip(DIST_NAMES, values, strict=True)}  # + 0.0: no -0.0


@dataclass
class RootFeatures:
    """One step's root features.

    Attributes:
        values: feature name -> value, exactly the names of ``SCHEMA`` in its order.
        draft_hidden: the draft's last hidden state at the root (Tensor[Hd] on the device), or None.
        target_hidden: the target's last hidden state at the previous row (Tensor[Ht]), or None.
        draft_hidden_host: ``draft_hidden`` as a float16 numpy array, when asked for (logging).
        target_hidden_host: likewise for ``target_hidden``.
    """

    values: dict[str, float]
    draft_hidden: torch.Tensor | None = None
    target_hidden: torch.Tensor | None = None
    draft_hidden_host: Any = None
    target_hidden_host: Any = None


class RootTracker:
    """The rows, hidden states and acceptance history behind the root features of one generation.

    The engine creates one per ``generate`` call when features are wanted, sets the previous
    rows after the prefill (:meth:`set_previous`) and after each step (:meth:`after_step`), and
    calls :meth:`features` before each step.

    Args:
        temperature: sampling temperature (a feature).
        top_p: nucleus mass (a feature).
        latency_model: source of the latency features, or None for zeros.
        hidden: keep and return hidden states.
        hidden_sizes: (draft, target) hidden widths, for the zero vectors used when a state is unknown.
    """

    def __init__(
        self,
        temperature: float,
        top_p: float,
        latency_model: LatencyFeatures | None,
        hidden: bool,
        hidden_sizes: tuple[int, int],
    ) -> None:
        self.temperature = float(temperature)
        self.top_p = float(top_p)
        self.latency_model = latency_model
        self.hidden = hidden
        self.hidden_sizes = hidden_sizes
        self.target_row: torch.Tensor | None = None  # [V]
        self.draft_row: torch.Tensor | None = None  # [V]; None: row -2 of the next first draft forward
        self.target_hidden: torch.Tensor | None = None  # [Ht]
        self.steps = 0
        self.last_accepted = 0
        self.accepted_ema = 0.0

    def set_previous(
        self, target_row: torch.Tensor | None, draft_row: torch.Tensor | None, target_hidden: torch.Tensor | None
    ) -> None:
        """The rows over the next root token (and the target's hidden state at that row)."""
        self.target_row, self.draft_row = target_row, draft_row
        if self.hidden:
            self.target_hidden = target_hidden

    def needs_draft_row(self) -> bool:
        """Whether the next first draft forward must keep row -2 (the previous draft row)."""
        return self.draft_row is None

    def after_step(self, num_accepted: int) -> None:
        """Update the acceptance history with a step's τ (EMA starts at the first step's τ)."""
        tau = float(num_accepted)
        self.accepted_ema = tau if self.steps == 0 else EMA_WEIGHT * tau + (1.0 - EMA_WEIGHT) * self.accepted_ema
        self.last_accepted = int(num_accepted)
        self.steps += 1

    def features(
        self,
        root_probs: torch.Tensor,  # [keep, V] rows of the first draft forward, root last
        root_hidden: torch.Tensor | None,  # [keep, Hd] or None
        root_ok: torch.Tensor,  # 0-dim bool: were the draft forward's logits finite?
        context_length: int,
        host_hidden: bool = False,
    ) -> RootFeatures:
        """The step's features; one host transfer (hidden states ride along when ``host_hidden``).

        Raises:
            ValueError: the draft's logits were NaN or inf.
        """
        if self.draft_row is None and root_probs.shape[0] >= 2:
            self.draft_row = root_probs[-2]
        root_row = root_probs[-1]
        known = self.target_row is not None and self.draft_row is not None
        if known:
            stats = root_statistics(self.target_row, self.draft_row, root_row)  # [9]
        else:  # a one-token prompt: no previous rows yet
            stats = root_statistics(root_row, root_row, root_row)
        draft_hidden = target_hidden = None
        parts = [stats, root_ok.float()[None]]
        if self.hidden:
            hd, ht = self.hidden_sizes
            draft_hidden = root_hidden[-1] if root_hidden is not None else stats.new_zeros(hd)
            target_hidden = self.target_hidden if self.target_hidden is not None else stats.new_zeros(ht)
            if host_hidden:
                parts += [draft_hidden.float(), target_hidden.float()]
        host = torch.cat(parts).cpu()  # the step's one host transfer
        n = stats.numel()
        head = host[: n + 1].tolist()
        check_finite(bool(head[n]), "draft")
        values = distribution_features(head[:n], known)
        values.update(
            last_accepted=float(self.last_accepted),
            accepted_ema=self.accepted_ema,
            is_first_step=1.0 if self.steps == 0 else 0.0,
            context_length=float(context_length),
            temperature=self.temperature,
            top_p=self.top_p,
        )
        if self.latency_model is None:
            values.update(dict.fromkeys(LATENCY_NAMES, 0.0))
        else:
            latency = self.latency_model.features(context_length)
            values.update({name: float(latency[name]) for name in LATENCY_NAMES})
        out = RootFeatures({name: values[name] for name in SCHEMA.names}, draft_hidden, target_hidden)
        if self.hidden and host_hidden:
            hd = draft_hidden.numel()
            rest = host[n + 1 :].numpy().astype("float16")
            out.draft_hidden_host, out.target_hidden_host = rest[:hd], rest[hd:]
        return out


MAX_LOOKUP = 64  # the most looked-up tokens a planner is shown


def planner_view(request: GenerationRequest, state: EngineState, step: int, features: RootFeatures | None) -> StepState:
    """What the planner sees before step ``step``: position, budget, the last step, the root features, and
    (when the planner sets ``needs_lookup``) what a lookup in the context would draft now (no forward).
    """
    wants_lookup = request.planner is not None and request.planner.needs_lookup
    found = state.ngrams.match(MAX_LOOKUP) if wants_lookup else LookupMatch([], 0)
    f = features
    return StepState(
        step=step,
        context_length=len(state.context),
        generated=len(state.generated),
        remaining=request.budget - len(state.generated),
        temperature=float(request.sampling.temperature),
        last=state.steps[-1] if state.steps else None,
        features=f.values if f is not None else None,
        draft_hidden=f.draft_hidden if f is not None else None,
        target_hidden=f.target_hidden if f is not None else None,
        top_p=float(request.sampling.top_p),
        lookup=found.tokens if wants_lookup else None,
        lookup_ngram=found.ngram,
        lookup_matches=found.matches,
        lookup_match_length=found.match_length,
    )
