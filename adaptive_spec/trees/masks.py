"""Tree attention masks and position ids for scoring a whole draft tree in one forward pass.

The tree's nodes are fed to the model as one block of ``N`` tokens after ``past_length``
cached tokens. Node i may attend to every cached token and to its own ancestors (itself
included), never to siblings or cousins. Its position id is ``past_length + depth``, the
position it would have in sequential decoding.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

import torch

from adaptive_spec.trees.tree import ancestor_rows

if TYPE_CHECKING:
    from adaptive_spec.trees.tree import DraftTree


def ancestor_matrix(parents: torch.Tensor | list[int]) -> torch.Tensor:
    """BoolTensor[N, N]: entry (i, j) is True when node j is node i or one of its ancestors.

    Args:
        parents: LongTensor[N] (or list) of parent indices, -1 for the root; every parent
            index is smaller than its child's.
    """
    device = parents.device if isinstance(parents, torch.Tensor) else None
    par = parents.tolist() if isinstance(parents, torch.Tensor) else list(parents)
    return torch.tensor(ancestor_rows(par), dtype=torch.bool, device=device).reshape(len(par), len(par))


def block_ancestors(pending: int, tree_ancestors: torch.Tensor) -> torch.Tensor:
    """BoolTensor[p - 1 + N, p - 1 + N]: the ancestor rows of one step's block.

    A block is the ``pending`` committed tokens not yet in the model's cache (a causal chain,
    the tree's root last) followed by the tree's other ``N - 1`` nodes; every node sees all
    pending tokens and its own ancestors (``tree_ancestors``, BoolTensor[N, N], node 0 = root).
    """
    p, n = pending, tree_ancestors.shape[0]
    if p == 1 and tree_ancestors.dtype == torch.bool:  # the root alone: the tree's own rows
        return tree_ancestors
    m = p - 1 + n
    anc = torch.zeros(m, m, dtype=torch.bool, device=tree_ancestors.device)
    anc[:p, :p] = torch.ones(p, p, dtype=torch.bool, device=tree_ancestors.device).tril_()
    anc[p - 1 :, : p - 1] = True
    anc[p - 1 :, p - 1 :] = tree_ancestors
    return anc


def block_positions(
    base: int, pending: int, depths: list[int] | torch.Tensor, device: torch.device | str | None = None
) -> torch.Tensor:
    """LongTensor[p - 1 + N]: positions of a block (see :func:`block_ancestors`) after ``base`` cached
    tokens: the pending tokens in order, then each node at its root's position plus its depth.

    ``depths`` as a device tensor: built there, nothing copied from the host.
    """
    root = base + pending - 1
    if isinstance(depths, torch.Tensor):
        if root == base:  # the root alone pending
            return depths + root
        return torch.cat([torch.arange(base, root, device=depths.device), depths + root])
    return torch.tensor([*range(base, root), *(root + d for d in depths)], dtype=torch.long, device=device)


def additive_mask(allowed: torch.Tensor, past_length: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """4-D additive float mask ``[1, 1, n, past_length + m]`` from a block's allowed pairs.

    Args:
        allowed: BoolTensor[n, m]; entry (i, j) says whether new token i may attend to block
            token j (the last ``n`` of the ``m`` block tokens are the ones being fed).
        past_length: cached tokens before the block; every new token attends to all of them.
        dtype: the model's dtype. Allowed positions hold 0, masked ones the dtype's most
            negative finite value, as transformers expects of a custom 4-D mask.
    """
    n, m = allowed.shape
    if past_length:  # every new token sees the cached rows
        allowed = torch.nn.functional.pad(allowed, (past_length, 0), value=True)
    zero, lowest = _mask_values(dtype, allowed.device)
    return torch.where(allowed, zero, lowest).view(1, 1, n, past_length + m)  # three ops (kernel launches on a GPU)


@functools.lru_cache(maxsize=16)
def _mask_values(dtype: torch.dtype, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """0 and the dtype's most negative finite value as 0-dim tensors on ``device`` (made once)."""
    return torch.zeros((), dtype=dtype, device=device), torch.tensor(torch.finfo(dtype).min, dtype=dtype, device=device)


def tree_attention_mask(
    parents: torch.Tensor | list[int],
    past_length: int,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """4-D additive float mask ``[1, 1, N, past_length + N]`` for the tree block.

    Allowed positions hold 0, masked ones the dtype's most negative finite value, as
    transformers expects of a custom 4-D mask.
    """
    return additive_mask(ancestor_matrix(parents).to(device), past_length, dtype)  # [1, 1, N, past+N]


def tree_position_ids(
    depths: torch.Tensor | list[int], past_length: int, device: torch.device | str | None = None
) -> torch.Tensor:
    """LongTensor[1, N]: position ``past_length + depth`` for every node."""
    depths = torch.as_tensor(depths, dtype=torch.long, device=device)
    return (past_length + depths)[None]


def device_block(
    pending: torch.Tensor, tokens: torch.Tensor, depths: torch.Tensor, base: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The target's block from tensors on its device, nothing read or copied: ids (``pending``, root last, then the
    tree's ``tokens`` past the root) and positions (:func:`block_positions` of the tree's ``depths``).
    """
    return torch.cat([pending, tokens[1:]]), block_positions(base, len(pending), depths)


def block_inputs(
    pending: list[int] | torch.Tensor, tree: DraftTree, base: int, device: torch.device | str
) -> tuple[torch.Tensor, torch.Tensor]:
    """The target's block for ``tree``: ids (the pending tokens, root last, then the drafted nodes) and
    positions (:func:`block_positions`), on ``device``.

    ``pending`` already on the device and a tree drawn there (its tokens and depths handed over with
    ``keep_tensors``) copy nothing; otherwise what is on the host goes over in one copy, and the tree keeps
    the device views of its tokens and depths for the verifiers.
    """
    p = len(pending)
    on_device = isinstance(pending, torch.Tensor)
    if tree.has_tensors(device, "tokens", "depths"):
        head = pending if on_device else torch.tensor(pending, dtype=torch.long, device=device)
        return device_block(head, tree.tokens_tensor(device), tree.depths_tensor(device), base)
    root = base + p - 1  # the root's position
    host = [] if on_device else list(pending)
    n = len(host) + tree.num_nodes - 1  # ids copied
    both = torch.tensor(
        [*host, *tree.tokens[1:], *range(base, root), *(root + d for d in tree.depths)],
        dtype=torch.long,
        device=device,
    )  # what is on the host of the ids, and the positions, in one copy
    ids, pos = both[:n], both[n:]
    if on_device:
        ids = torch.cat([pending, ids])
    no_token = torch.full((1,), -1, dtype=torch.long, device=device)
    tree.keep_tensors(tokens=torch.cat([no_token, ids[p:]]), depths=pos[p - 1 :] - root)
    return ids, pos
