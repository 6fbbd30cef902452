"""The registry refuses verifier/law pairs it cannot verify losslessly, with clear errors."""

from __future__ import annotations

import pytest
import torch

from adaptive_spec.trees import DraftLaw, TreeShape, sample_tree
from adaptive_spec.verifiers import REGISTRY, VERIFIER_NAMES, IncompatibleTreeError, verify

P = torch.tensor([0.2, 0.3, 0.5], dtype=torch.float64)
Q = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)


def _tree(shape):
    return sample_tree(shape, lambda c: Q, torch.Generator().manual_seed(0))


def test_every_named_verifier_is_registered():
    assert set(VERIFIER_NAMES) == {
        "token",
        "greedy",
        "block",
        "traversal",
        "specinfer",
        "rrsw",
        "spectr",
        "nss",
        "naive",
        "gbv",
        "hsd",
    }


@pytest.mark.parametrize(
    ("name", "shape"),
    [
        ("block", TreeShape.iid(2, 2)),
        ("token", TreeShape.delayed(1, 2, 2)),
        ("specinfer", TreeShape.without_replacement((2, 2))),
        ("spectr", TreeShape.without_replacement((2, 1))),
        ("gbv", TreeShape.without_replacement((2, 1))),
        ("hsd", TreeShape.iid(2, 2)),
    ],
    ids=str,
)
def test_incompatible_pairs_are_refused(name, shape):
    tree = _tree(shape)
    with pytest.raises(IncompatibleTreeError, match=f"'{name}' is not lossless for trees drafted as"):
        verify(name, tree, P.repeat(tree.num_nodes, 1), torch.Generator(), allow_lossy=True)


def test_error_names_the_verifiers_that_would_work():
    tree = _tree(TreeShape.without_replacement((2, 2)))
    with pytest.raises(IncompatibleTreeError, match="traversal"):
        verify("specinfer", tree, P.repeat(tree.num_nodes, 1), torch.Generator())


def test_hsd_is_registered_lossy_and_needs_allow_lossy():
    assert not REGISTRY["hsd"].lossless
    tree = _tree(TreeShape.chain(3))
    rows = P.repeat(tree.num_nodes, 1)
    with pytest.raises(IncompatibleTreeError, match="allow_lossy=True"):
        verify("hsd", tree, rows, torch.Generator())
    assert verify("hsd", tree, rows, torch.Generator(), allow_lossy=True).num_accepted <= 3


def test_unknown_verifier_lists_known_names():
    tree = _tree(TreeShape.chain(2))
    with pytest.raises(ValueError, match="known verifiers: token"):
        verify("nope", tree, P.repeat(tree.num_nodes, 1), torch.Generator())


def test_bad_target_rows_are_named():
    tree = _tree(TreeShape.chain(2))
    rows = P.repeat(tree.num_nodes, 1)
    with pytest.raises(ValueError, match="must be"):
        verify("block", tree, rows[:-1], torch.Generator())
    bad = rows.clone()
    bad[1, 0] = float("nan")
    with pytest.raises(ValueError, match="NaN or inf"):
        verify("block", tree, bad, torch.Generator())
    with pytest.raises(ValueError, match="probability distributions"):
        verify("block", tree, rows * 2, torch.Generator())


def test_a_generator_is_required():
    tree = _tree(TreeShape.chain(2))
    with pytest.raises(TypeError, match=r"torch\.Generator"):
        verify("block", tree, P.repeat(tree.num_nodes, 1), None)


def test_same_seed_same_result():
    tree = _tree(TreeShape.iid(3, 3))
    rows = P.repeat(tree.num_nodes, 1)
    for name, spec in REGISTRY.items():
        if DraftLaw.IID in spec.laws:
            a = [verify(name, tree, rows, torch.Generator().manual_seed(s)).tokens for s in range(10)]
            b = [verify(name, tree, rows, torch.Generator().manual_seed(s)).tokens for s in range(10)]
            assert a == b
