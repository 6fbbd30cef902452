"""The target's block inputs (ids and positions) of a draft tree, from host lists or the tree's device tensors."""

from __future__ import annotations

import pytest
import torch


def test_block_inputs_from_lists_and_from_device_tensors_agree() -> None:
    """The block's ids and positions are the same whether the tree's tokens came as lists or device tensors."""
    from adaptive_spec.trees import DraftTree, TreeShape, block_inputs, block_positions

    def tree():
        shape = TreeShape.chain(2)
        return DraftTree([-1, 5, 6, 7], [-1, 0, 1, 0], [0, 1, 2, 1], torch.zeros(4, 9), [[1, 3], [2], [], []], shape)

    pending, base = [3, 4, 8], 10
    want_ids = [3, 4, 8, 5, 6, 7]
    want_pos = block_positions(base, 3, [0, 1, 2, 1]).tolist()
    assert want_pos == [10, 11, 12, 13, 14, 13]
    host = tree()
    ids, pos = block_inputs(pending, host, base, "cpu")
    assert ids.tolist() == want_ids and pos.tolist() == want_pos
    # the tree keeps device views of its tokens and depths for the verifiers
    assert host.has_tensors("cpu", "tokens", "depths")
    assert host.tokens_tensor().tolist() == [-1, 5, 6, 7] and host.depths_tensor().tolist() == [0, 1, 2, 1]
    on_device = tree()
    on_device.keep_tensors(tokens=torch.tensor([-1, 5, 6, 7]), depths=torch.tensor([0, 1, 2, 1]))
    ids, pos = block_inputs(pending, on_device, base, "cpu")
    assert ids.tolist() == want_ids and pos.tolist() == want_pos
    for t in (tree(), on_device):  # pending tokens already on the device
        ids, pos = block_inputs(torch.tensor(pending), t, base, "cpu")
        assert ids.tolist() == want_ids and pos.tolist() == want_pos
    with pytest.raises(ValueError, match="tokens/parents/depths"):
        on_device.keep_tensors(tokens=torch.tensor([1, 2]))


@pytest.mark.parametrize("n", [1, 2, 7, 8, 9, 17, 48])
def test_ancestor_bit_masks_unpack_to_the_ancestor_rows(n) -> None:
    """The bit masks of a random tree (parents before children), unpacked at once across byte boundaries, are its
    ancestor rows: node i and its ancestors (walked up from i through the parents), nothing else."""
    import random

    import numpy as np

    from adaptive_spec.trees.tree import ancestor_masks, ancestor_rows, unpack_masks

    rng = random.Random(n)
    parents = [-1, *(rng.randrange(i) for i in range(1, n))]
    matrix = unpack_masks(ancestor_masks(parents))
    walked = [[j in _path(parents, i) for j in range(n)] for i in range(n)]
    assert matrix.dtype == np.uint8 and matrix.shape == (n, n)
    assert matrix.astype(bool).tolist() == walked
    assert ancestor_rows(parents) == walked


def _path(parents: list[int], i: int) -> list[int]:
    out = []
    while i >= 0:
        out.append(i)
        i = parents[i]
    return out
