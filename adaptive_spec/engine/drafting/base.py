"""What every drafter gives and shares: the drafted tree and where its nodes sit in the draft's cache
(:class:`DraftOutcome`), the step's first draft forward over the pending tokens (:func:`draft_root`), the finite
check of a draft's logits, and a tree's one host read queued behind the target's pass (:class:`QueuedRead`,
:class:`DeferredTree`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from adaptive_spec.engine.logits import ProbsFn, finite_flag
from adaptive_spec.engine.runner import ModelRunner
from adaptive_spec.trees import DraftTree
from adaptive_spec.trees.draw import draw_tokens
from adaptive_spec.trees.policy import EagleTree


@dataclass
class DraftOutcome:
    """A drafted tree and where its nodes sit in the draft model's cache.

    Attributes:
        tree: the draft tree (nodes numbered level by level).
        ancestors: BoolTensor[N, N] on the model's device, ``ancestor_matrix(tree.parents)``.
        pending_fed: number of pending context tokens fed before the tree (0 when the draft
            model was not run, i.e. a depth-0 tree).
        fed_nodes: tree nodes ``0 .. fed_nodes - 1`` have KV rows in the draft cache, at row
            ``cached + pending_fed - 1 + node`` (node 0 is the last pending token); for a
            policy-grown tree, the number of fed nodes, whose rows ``cache_rows`` gives.
        cache_rows: policy-grown trees: fed node -> offset of its row after the root (feed order).
        lookup_rows: nodes ``0 .. lookup_rows - 1`` have rows made by a lookup (one-hot, or a trie's
            uniform rows: the law their children were found under), not by the draft model; 0 for a
            model-drafted tree. Their children were looked up, not drawn from the draft.
        model_rows: of those nodes, the ones the draft model was run on -> its own row there
            (Tensor[V]), for features (:meth:`model_row`); the verifier reads the tree's rows.
        ok: 0-dim bool tensor, whether the draft's logits were finite, when that is not checked yet (a tree
            drafted without a host read: the engine checks it with the verifier's read); None once checked.
        cache_rows_tensor: ``cache_rows`` on the device, LongTensor[N] (-1: not fed), when the drafter made it
            there: the accepted path's draft rows are then gathered without a copy.
    """

    tree: DraftTree
    ancestors: torch.Tensor
    pending_fed: int
    fed_nodes: int
    cache_rows: dict[int, int] | None = None
    policy_levels: int = 0
    policy_decision_s: float = 0.0
    lookup_rows: int = 0
    model_rows: dict[int, torch.Tensor] = field(default_factory=dict)
    ok: torch.Tensor | None = None
    cache_rows_tensor: torch.Tensor | None = None

    def draft_row(self, node: int) -> int | None:
        """Offset of ``node``'s KV row after the root in the draft cache, or None if it was never fed.

        Static trees feed nodes ``0 .. fed_nodes - 1`` in order; a policy-grown tree feeds them
        in the order of ``cache_rows``.
        """
        if self.cache_rows is None:
            return node if node < self.fed_nodes else None
        return self.cache_rows.get(node)

    def model_row(self, node: int) -> torch.Tensor | None:
        """The draft model's own row over ``node`` (Tensor[V]), or None when the model gave none there.

        The tree's row, except at a node whose children were looked up: there the tree's row is
        the lookup's (what the verifier reads), and the model's row is the one it output when
        the node was fed to it, if that row was kept (:func:`~.lookup.draft_hybrid`'s ``keep_rows``).
        Features and logs of the draft's distribution read this, never a lookup's row.
        """
        if node < self.lookup_rows:
            return self.model_rows.get(node)
        return self.tree.draft_probs[node] if self.draft_row(node) is not None else None

    def drawn_from_model(self) -> list[bool]:
        """Per node, whether its token was drawn from the draft model's row at its parent (not: the root, looked up,
        or an unused slot).
        """
        used = self.tree.used
        return [i > 0 and parent >= self.lookup_rows and used[i] for i, parent in enumerate(self.tree.parents)]


@dataclass
class DraftRoot:
    """The first draft forward of a step: the pending tokens fed as a causal chain.

    Attributes:
        pending: number of pending tokens fed (the root is the last).
        base: the draft cache's committed length before the forward.
        probs: Tensor[keep, V], the processed rows of the last ``keep`` pending tokens; the last
            row is the draft's root distribution (over the first drafted token).
        ok: 0-dim bool tensor, whether the logits were finite (checked at the first host sync).
        hidden: Tensor[keep, H], the draft's last hidden states at those rows, when the runner
            keeps hidden states; else None.
    """

    pending: int
    base: int
    probs: torch.Tensor
    ok: torch.Tensor
    hidden: torch.Tensor | None = None


def draft_root(runner: ModelRunner, pending: torch.Tensor, probs_fn: ProbsFn, keep: int = 1) -> DraftRoot:
    """Feed the ``pending`` tokens (LongTensor[p], root last) to the draft; keep the last ``keep`` rows.

    The rows stay in the draft cache as block rows ``0 .. p - 1``; :func:`~.static.draft_tree` grows
    the tree after them, and the caller commits or rolls back.
    """
    p = int(pending.numel())
    if p < 1:
        raise ValueError("draft_root needs at least the root token")
    base = runner.cached
    causal = None if p == 1 else torch.ones(p, p, dtype=torch.bool, device=runner.device).tril_()  # None: no mask
    positions = torch.arange(base, base + p, device=runner.device)
    logits = runner.block_forward(pending, positions, causal, logits_to_keep=min(keep, p))  # [keep, V']
    probs = probs_fn(logits)
    return DraftRoot(p, base, probs, finite_flag(logits, probs), runner.hidden)


def check_finite(ok: torch.Tensor | bool, who: str) -> None:
    """Raise a ValueError when a forward pass returned NaN or inf logits (a host sync if ``ok`` is a tensor)."""
    if not bool(ok):
        raise ValueError(
            f"the {who} model returned NaN or inf logits; check the model weights and dtype "
            "(fp16 overflows are common: try dtype=torch.bfloat16 or float32)"
        )


def sample_categorical(probs: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """One draw per row of ``probs`` (Tensor[W, V]) by the inverse CDF (:func:`draw_tokens` with ``k = 1``).

    Same law as ``torch.multinomial(probs, 1)``, without its per-row setup cost and host sync.
    """
    return draw_tokens(probs, 1, generator)[:, 0]  # [W]


class QueuedRead:
    """A device tensor's values brought to the host behind the work queued so far, without waiting for what is
    queued after: on CUDA a copy into pinned memory and an event, so that the work queued next (the target's pass)
    runs while the host waits for the copy and reads it (:meth:`tolist`); elsewhere the values are read then.
    The pinned memory comes from torch's caching host allocator, which keeps a block from reuse until its copy ends.
    """

    def __init__(self, values: torch.Tensor) -> None:
        self._values, self._event = values, None
        if values.device.type == "cuda":
            self._values = torch.empty(values.shape, dtype=values.dtype, pin_memory=True)
            self._values.copy_(values, non_blocking=True)
            self._event = torch.cuda.Event()
            self._event.record(torch.cuda.current_stream(values.device))  # the copy's stream (its device's)

    def tolist(self) -> list:
        """The values, as ``Tensor.tolist`` gives them (waiting for the copy only, on CUDA)."""
        if self._event is not None:
            self._event.synchronize()
        return self._values.tolist()


@dataclass(frozen=True)
class DeferredTree:
    """A tree grown on the device whose one host read waits until the target's pass over it is queued
    (:func:`~.eagle_tree.captured_eagle_tree` with ``defer``; the engine's step). The pass needs only the tensors here,
    so on a GPU the read and the host's work on the tree overlap the pass instead of leaving the GPU idle before it.

    ``finish()`` reads it: the :class:`DraftOutcome`, or the policy when a drawn child had probability 0, which
    ``redraw(policy)`` then draws on the host (:func:`~.policy.draft_policy_tree` sets it). :meth:`read` does both.
    """

    tokens: torch.Tensor  # [N] the nodes' tokens (the root's -1), on the device
    depths: torch.Tensor  # [N] their depths
    ancestors: torch.Tensor  # [N, N] bool
    num_nodes: int
    finish: Callable[[], DraftOutcome | EagleTree]
    redraw: Callable[[EagleTree], DraftOutcome] | None = None

    def read(self) -> tuple[DraftOutcome, bool]:
        """``(the outcome, whether it was drawn again on the host)``: then the target's pass was over another tree."""
        out = self.finish()
        if isinstance(out, DraftOutcome):
            return out, False
        return self.redraw(out), True
