"""The top-down tree walk shared by the OT-based verifiers (docs/algorithms.md §5).

Start at the root and call the node-level solver on the node's candidates. If the token it
returns is a child, move there and repeat; otherwise stop and emit it. At a leaf, emit a
bonus token from p. Each solver outputs exactly p(·|node) when its candidates follow its
drafting contract, so the walk is lossless for that contract.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from adaptive_spec.rng import Sampler
from adaptive_spec.trees import DraftTree
from adaptive_spec.verifiers.base import VerifyResult, host_read, result_for

# (target row p, draft row q, candidate tokens, sampler) -> (token, drawn from unmodified p)
NodeSolver = Callable[[torch.Tensor, torch.Tensor, list[int], Sampler], tuple[int, bool]]


def top_down_walk(
    tree: DraftTree,
    target_probs: torch.Tensor,
    sampler: Sampler,
    solver: NodeSolver,
    *,
    distinct: bool,
) -> VerifyResult:
    """Walk the tree top-down with ``solver`` at each node.

    Args:
        tree: the draft tree.
        target_probs: Tensor[N, V].
        sampler: source of randomness.
        solver: the node-level solver.
        distinct: pass the distinct children in order of first appearance (without
            replacement) instead of every draw with multiplicity (i.i.d.).
    """
    node = 0
    while True:
        p = target_probs[node]
        if not tree.child_draws[node]:
            return result_for(tree, node, sampler.categorical(p), bonus=True)
        draws = tree.children[node] if distinct else tree.child_draws[node]
        candidates = [tree.tokens[c] for c in draws]
        token, from_target = solver(p, tree.draft_probs[node], candidates, sampler)
        child = tree.child_with_token(node, token)
        if child is None:
            return result_for(tree, node, token, bonus=from_target)
        node = child


def follow_choices(tree: DraftTree, choices: torch.Tensor, ride: torch.Tensor | None = None) -> VerifyResult:
    """Walk from the root to the child holding each node's chosen token; emit the choice where none does.

    Siblings that hold the same token (a tree with a path drafted apart from a trie's, ``lookup:WxL+mD``; an
    i.i.d. tree's repeated draws) stand for one prefix, so the walk treats them as one node of the merged trie:
    it takes the choice of the first of them (a rule of the tree alone: their rows are the same law, p after
    that prefix) and looks for the next token among all their children. A tree without such siblings walks
    child by child as before.

    ``choices``: LongTensor[N] on the rows' device, a token per node drawn from the target's row there
    (its argmax at T = 0, a sample for NSS), so the emitted token is a bonus. One host read brings back the
    choices, ``ride`` and the tree's tokens if they are still on the device; the next token stays on the
    device as well (the result's ``next_on_device``).
    """
    chosen, *rest = host_read(tree, choices, *([] if ride is None else [ride]))
    children, tokens = tree.children, tree.tokens
    group = [0]  # the nodes that stand for the walk's prefix: siblings holding one token are one trie node
    while True:
        node = group[0]  # whose choice is taken: fixed by the tree, never by the choices (every node's row is p there)
        token = chosen[node]
        group = [c for g in group for c in children[g] if tokens[c] == token]
        if not group:
            return result_for(tree, node, token, True, rest[0] if rest else (), choices[node : node + 1])
