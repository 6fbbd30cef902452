from __future__ import annotations

import pytest
import torch

from adaptive_spec.trees import (
    DraftLaw,
    TreeShape,
    ancestor_matrix,
    sample_tree,
    tree_attention_mask,
    tree_position_ids,
)


def test_shape_constructors_are_canonical():
    assert TreeShape.iid(1, 3) == TreeShape.chain(3)
    assert TreeShape.delayed(0, 3, 2) == TreeShape.iid(3, 2)
    assert TreeShape.delayed(2, 1, 3) == TreeShape.chain(5)
    assert TreeShape.delayed(2, 3, 0) == TreeShape.chain(2)
    assert TreeShape.without_replacement((1, 1)) == TreeShape.chain(2)
    assert TreeShape.delayed(2, 3, 3).law is DraftLaw.DELAYED
    assert TreeShape.delayed(2, 3, 3).max_nodes == 1 + 2 + 9
    assert TreeShape.without_replacement((2, 3)).max_nodes == 1 + 2 + 6


@pytest.mark.parametrize("text", ["chain:4", "iid:3x2", "delayed:2x3x3", "wor:2x2x1"])
def test_shape_parse_round_trips(text):
    assert str(TreeShape.parse(text)) == text


@pytest.mark.parametrize("text", ["chain", "iid:3", "tree:2x2", "delayed:1x2", "chain:-1", "chain:x"])
def test_shape_parse_errors_are_clear(text):
    with pytest.raises(ValueError, match="tree shape"):
        TreeShape.parse(text)


def test_bad_sizes_are_refused():
    with pytest.raises(ValueError, match="paths must be an integer >= 1"):
        TreeShape.iid(0, 2)
    with pytest.raises(ValueError, match="width"):
        TreeShape.without_replacement((2, 0))


def _softmax_fn(vocab, seed):
    def fn(prefix):
        g = torch.Generator().manual_seed(hash((seed, len(prefix), *prefix)) % (2**31))
        return torch.softmax(torch.randn(vocab, generator=g, dtype=torch.float64), 0)

    return fn


def test_iid_tree_structure():
    tree = sample_tree(TreeShape.iid(3, 4), _softmax_fn(5, 0), torch.Generator().manual_seed(0))
    assert len(tree.child_draws[0]) == 3  # three paths start at the root
    assert tree.max_depth == 4
    leaves = [i for i in range(tree.num_nodes) if not tree.child_draws[i]]
    # Every draw at a node is one path through it; leaves sit at full depth.
    assert all(tree.depths[i] == 4 for i in leaves)
    for i in range(1, tree.num_nodes):
        through = tree.child_draws[tree.parents[i]].count(i)
        below = len(tree.child_draws[i])
        assert below in (0, through)
    assert tree.prefixes[0] == ()
    for i in range(1, tree.num_nodes):
        assert tree.prefixes[i] == tree.prefixes[tree.parents[i]] + (tree.tokens[i],)
    assert len(set(tree.prefixes)) == tree.num_nodes  # distinct prefixes


def test_a_nodes_prefix_alone_equals_its_entry_in_prefixes():
    for shape in (TreeShape.iid(3, 4), TreeShape.without_replacement((3, 2, 2))):
        fresh = sample_tree(shape, _softmax_fn(5, 0), torch.Generator().manual_seed(1))
        alone = [fresh.prefix(i) for i in range(fresh.num_nodes)]  # before prefixes is built
        assert "prefixes" not in fresh.__dict__
        assert alone == fresh.prefixes == [fresh.prefix(i) for i in range(fresh.num_nodes)]
        assert alone[0] == () and all(len(alone[i]) == fresh.depths[i] for i in range(fresh.num_nodes))


def test_delayed_tree_structure():
    tree = sample_tree(TreeShape.delayed(2, 3, 2), _softmax_fn(50, 1), torch.Generator().manual_seed(0))
    assert tree.child_draws[0] == [1] and tree.child_draws[1] == [2]  # the trunk
    assert len(tree.child_draws[2]) == 3
    assert tree.law is DraftLaw.DELAYED and tree.shape.branch_depth == 2


def test_without_replacement_children_are_distinct():
    tree = sample_tree(TreeShape.without_replacement((3, 2)), _softmax_fn(6, 2), torch.Generator().manual_seed(0))
    for draws in tree.child_draws:
        assert len(draws) == len(set(draws))
    assert len(tree.child_draws[0]) == 3 and tree.num_nodes == 1 + 3 + 6


def test_without_replacement_stops_at_the_support():
    q = torch.tensor([0.5, 0.5, 0.0, 0.0], dtype=torch.float64)
    tree = sample_tree(TreeShape.without_replacement((3,)), lambda c: q, torch.Generator().manual_seed(0))
    assert sorted(tree.tokens[1:]) == [0, 1]


def test_bad_draft_rows_are_named():
    with pytest.raises(ValueError, match="sum to"):
        sample_tree(TreeShape.chain(2), lambda c: torch.ones(3), torch.Generator())
    with pytest.raises(ValueError, match="NaN"):
        sample_tree(TreeShape.chain(2), lambda c: torch.tensor([float("nan"), 1.0]), torch.Generator())


def test_tree_mask_and_positions():
    # root(0) -> 1 -> 3 ; root -> 2
    parents = [-1, 0, 0, 1]
    anc = ancestor_matrix(parents)
    assert anc.tolist() == [
        [True, False, False, False],
        [True, True, False, False],
        [True, False, True, False],
        [True, True, False, True],
    ]
    mask = tree_attention_mask(parents, past_length=5, dtype=torch.float32)
    assert mask.shape == (1, 1, 4, 9)
    assert (mask[0, 0, :, :5] == 0).all()
    allowed = mask[0, 0, :, 5:] == 0
    assert torch.equal(allowed, anc)
    assert mask.min() == torch.finfo(torch.float32).min
    pos = tree_position_ids([0, 1, 1, 2], past_length=5)
    assert pos.tolist() == [[5, 6, 6, 7]]
    assert tree_attention_mask(parents, 0, dtype=torch.bfloat16).dtype == torch.bfloat16


def test_block_ancestors_and_positions():
    from adaptive_spec.trees import ancestor_matrix, block_ancestors, block_positions

    parents, depths = [-1, 0, 0, 1], [0, 1, 1, 2]
    anc = block_ancestors(3, ancestor_matrix(parents))  # 3 pending tokens (root last) + 3 nodes
    expected = torch.tensor([
        [1, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0],
        [1, 1, 1, 0, 0, 0],  # the root
        [1, 1, 1, 1, 0, 0],
        [1, 1, 1, 0, 1, 0],  # a sibling does not see node 1
        [1, 1, 1, 1, 0, 1],
    ], dtype=torch.bool)  # fmt: skip
    assert torch.equal(anc, expected)
    assert block_positions(10, 3, depths).tolist() == [10, 11, 12, 13, 13, 14]


def test_tokens_drawn_on_the_device_are_read_once_and_only_when_used(monkeypatch):
    from adaptive_spec.trees import DraftTree

    parents = [-1, 0, 0, 1]
    tree = DraftTree(
        torch.tensor([-1, 4, 2, 7]),
        parents,
        [0, 1, 1, 2],
        torch.zeros(4, 8),
        [[1, 2], [3], [], []],
        TreeShape.iid(2, 2),
    )
    reads = []
    real = torch.Tensor.tolist
    monkeypatch.setattr(torch.Tensor, "tolist", lambda t: reads.append(t.numel()) or real(t))
    assert not tree.tokens_on_host and tree.num_nodes == 4 and tree.has_tensors("cpu", "tokens") and reads == []
    assert tree.prefixes == [(), (4,), (2,), (4, 7)] and tree.tokens == [-1, 4, 2, 7] and reads == [4]
    handed = DraftTree(
        torch.tensor([-1, 4, 2, 7]), parents, [0, 1, 1, 2], torch.zeros(4, 8), tree.child_draws, tree.shape
    )
    handed.set_host_tokens([-1, 4, 2, 7])  # read by the caller with something else: no read of its own
    assert handed.tokens == [-1, 4, 2, 7] and reads == [4]
    with pytest.raises(ValueError, match="3 tokens for 4 nodes"):
        handed.set_host_tokens([-1, 4, 2])
    # the ancestor matrix: built once on the host (one copy), or handed over and checked
    assert torch.equal(tree.ancestors_tensor(), ancestor_matrix(parents))
    assert tree.ancestors_tensor().tolist()[3] == [True, True, False, True]
    with pytest.raises(ValueError, match="ancestors"):
        tree.keep_tensors(ancestors=torch.ones(3, 3, dtype=torch.bool))
