"""The verifier contract and shared numerics.

Vocabulary (as in vLLM's rejection sampler and the reference):

* **accepted** tokens: the drafted tokens on the path from the root to the accepted node;
* **recovered** token: drawn from a residual distribution at the accepted node, when the
  verifier rejected (some of) its children;
* **bonus** token: drawn from the target's own distribution at the accepted node (a leaf
  whose path was accepted whole, or a node left untouched).

A verifier is a pure function ``(tree, target_probs, sampler) -> VerifyResult``. It never
mutates its inputs. Row arithmetic runs in the rows' own dtype (float64 in the exact tests,
the model's float32 in the engine, where a float64 copy of a 128k row costs more than the
arithmetic), except where the reference asks for float64: traversal's Mb/Ms rows and GBV's
skewed law. Scalars (weights, ratios) are Python floats, i.e. float64, everywhere.
``target_probs`` is Tensor[num_nodes, V], row i the target's next-token distribution
after ``tree.prefixes[i]``; the draft's rows are on the tree.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from adaptive_spec.rng import accelerator_path


@dataclass(frozen=True)
class VerifyResult:
    """What a verifier decided for one draft tree.

    Attributes:
        node: index of the accepted node in the tree (0 = the root: nothing accepted).
        num_accepted: number of accepted draft tokens, the node's depth (τ).
        tokens: the accepted tokens followed by the recovered or bonus token (τ + 1 tokens).
        bonus: True when the last token is a bonus token (drawn from the target's row of an
            untouched node), False when it is a recovered token (drawn from a residual).
        ride: the values of the caller's ``ride`` tensor, read with the verifier's own host read
            (:func:`host_read`); empty when none was given.
        next_on_device: the last emitted token as a LongTensor[1] on the rows' device, when the verifier
            drew it there (the engine feeds it to the next step without copying it back); else None.
    """

    node: int
    num_accepted: int
    tokens: tuple[int, ...]
    bonus: bool
    ride: tuple[int, ...] = ()
    next_on_device: torch.Tensor | None = field(default=None, compare=False, repr=False)

    @property
    def accepted_tokens(self) -> tuple[int, ...]:
        return self.tokens[:-1]

    @property
    def next_token(self) -> int:
        """The recovered or bonus token, the last one emitted."""
        return self.tokens[-1]

    def as_tensor(self, device: torch.device | str | None = None) -> torch.Tensor:
        """LongTensor[τ + 1] of the emitted tokens."""
        return torch.tensor(self.tokens, dtype=torch.long, device=device)


def run_ahead(device: torch.device) -> bool:
    """Whether a verifier with two strategies computes its whole outcome ahead on the rows' device.

    Ahead (one host read, more work: traversal computes every edge's residual) pays on an accelerator,
    where the host queues that work while the target's forward still runs and a read would wait for it.
    On a CPU nothing overlaps and a read costs nothing, so the lazy strategy (a read per decision, only
    the residuals it needs) is faster there; :func:`adaptive_spec.rng.accelerator_path_on_cpu` makes a CPU run
    the accelerator's strategy (``bench overhead --syncs`` counts that path, and tests check its law on a CPU).
    """
    return accelerator_path(device)


@functools.lru_cache(maxsize=128)
def scalars(m: int, value: float, device: torch.device) -> torch.Tensor:
    """float64 [m, 1] of ``value``: a verifier's per-row scalars before any rejection, made once per size, value and
    device (no fill a step). Read only: every update makes a new tensor.
    """
    return torch.full((m, 1), value, dtype=torch.float64, device=device)


@functools.lru_cache(maxsize=128)
def positions(n: int, device: torch.device) -> torch.Tensor:
    """``arange(n)`` on ``device``, made once per size and device (no op a step). Read only."""
    return torch.arange(n, device=device)


def positive_part(x: torch.Tensor) -> torch.Tensor:
    """``(x)_+`` elementwise."""
    return x.clamp_min(0.0)


def normalized_or(weights: torch.Tensor, fallback: torch.Tensor) -> torch.Tensor:
    """``weights / sum(weights)``, or ``fallback`` when the weights are all zero.

    docs/algorithms.md §2 notes that an all-zero residual is never sampled by a correct
    verifier (it only arises with probability 0); the fallback keeps the code total.
    """
    total = float(weights.sum())
    if total > 0.0:
        return weights / total
    return fallback


def accept_prob(target: float, draft: float) -> float:
    """``min(1, target / draft)``, 0 when the draft probability is 0 (docs/algorithms.md §2)."""
    if draft <= 0.0:
        return 0.0
    return min(1.0, target / draft)


def result_for(
    tree, node: int, token: int, bonus: bool, ride: list[int] | tuple[int, ...] = (), on_device=None
) -> VerifyResult:
    """Build a :class:`VerifyResult` for ``node`` followed by ``token`` (``on_device``: that token, LongTensor[1])."""
    prefix = tree.prefix(node)
    return VerifyResult(node, len(prefix), prefix + (int(token),), bonus, tuple(ride), on_device)


def host_read(tree, *parts: torch.Tensor) -> list[list]:
    """One host read of ``parts`` (tensors on one device, read flat), as lists: integer and bool parts as ints,
    floating parts as floats (all read in float64 when any is floating).

    The tree's tokens (and a slot tree's validity flags) come back in the same read when they are still only on
    the device (a tree drafted there); they are handed to the tree, so that nothing reads them again.
    """
    parts_l = list(parts)
    lazy = tree.device_parts()
    parts_l += lazy
    if not parts_l:
        return []
    sizes = [t.numel() for t in parts_l]
    floats = [t.is_floating_point() for t in parts_l]
    dtype = torch.float64 if any(floats) else torch.long  # integers (token ids, flags) are exact in float64
    same = (dtype, torch.bool) if dtype is torch.long else (dtype,)  # cat promotes bool parts to long
    flat = [t if t.dtype in same else t.to(dtype) for t in parts_l]
    flat = [t if t.dim() == 1 else t.reshape(-1) for t in flat]
    flat = (torch.cat(flat) if len(flat) > 1 else flat[0]).tolist()  # the one host read
    out, i = [], 0
    for n, is_float, t in zip(sizes, floats, parts_l, strict=True):
        exact = is_float or (dtype is torch.long and t.dtype is not torch.bool)  # else floats or bools, as ints
        out.append(flat[i : i + n] if exact else [int(v) for v in flat[i : i + n]])
        i += n
    if lazy:
        tree.take_host(out[len(parts) :])
    return out[: len(parts)]


def edge_probs(tree, probs: torch.Tensor) -> list[float]:
    """``probs[parent(i), token(i)]`` for every node i (0.0 for the root), as floats.

    One gather and one host transfer for the whole tree.
    """
    if tree.num_nodes == 1:
        return [0.0]
    return [0.0] + edge_values(tree, probs).tolist()


def edge_values(tree, probs: torch.Tensor, parents: torch.Tensor | None = None) -> torch.Tensor:
    """``probs[parent(i), token(i)]`` for every node i but the root, float64 on the rows' device (no host read).

    ``parents``: LongTensor[N] to read the edges at instead of the tree's parents (a slot tree's parent slots).
    """
    par = (tree.parents_tensor(probs.device) if parents is None else parents)[1:]
    tok = tree.tokens_tensor(probs.device)[1:]
    return probs[par, tok].double()


def ride_first(tree, ride: torch.Tensor | None, verify_on_host: Callable[[], VerifyResult]) -> VerifyResult:
    """Read ``ride`` (with the tree's tokens, if still on the device) before a verifier that works on the host,
    then run it; its result carries the values read. No ``ride``: just run it.
    """
    if ride is None:
        return verify_on_host()
    rode = host_read(tree, ride)[0]
    return dataclasses.replace(verify_on_host(), ride=tuple(rode))
