"""Property tests over degenerate rows (docs/algorithms.md §9)."""

from __future__ import annotations

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from adaptive_spec.trees import DraftLaw, TreeShape, sample_tree
from adaptive_spec.verifiers import REGISTRY, verify

KINDS = ["random", "equal", "disjoint", "onehot_p", "onehot_q", "sparse"]

SHAPES = [
    TreeShape.chain(3),
    TreeShape.iid(3, 2),
    TreeShape.iid(2, 3),
    TreeShape.delayed(1, 3, 2),
    TreeShape.without_replacement((2, 2)),
    TreeShape.without_replacement((3, 1, 1)),
]


def _rows(kind: str, vocab: int, seed: int, context: tuple[int, ...]):
    g = torch.Generator().manual_seed(hash((seed, len(context), *context)) % (2**31))
    p = torch.rand(vocab, generator=g, dtype=torch.float64) + 1e-3
    q = torch.rand(vocab, generator=g, dtype=torch.float64) + 1e-3
    if kind == "equal":
        q = p.clone()
    elif kind == "disjoint":
        half = max(1, vocab // 2)
        p[half:] = 0
        q[:half] = 0
    elif kind == "onehot_p":
        p = torch.zeros(vocab, dtype=torch.float64)
        p[int(torch.randint(vocab, (1,), generator=g))] = 1
    elif kind == "onehot_q":
        q = torch.zeros(vocab, dtype=torch.float64)
        q[int(torch.randint(vocab, (1,), generator=g))] = 1
    elif kind == "sparse":
        p = p * (torch.rand(vocab, generator=g) < 0.4)
        q = q * (torch.rand(vocab, generator=g) < 0.4)
        p[0] += 1e-9 if p.sum() == 0 else 0
        q[-1] += 1e-9 if q.sum() == 0 else 0
    return p / p.sum(), q / q.sum()


def _check(name: str, tree, rows: torch.Tensor, gen: torch.Generator) -> None:
    res = verify(name, tree, rows, gen, allow_lossy=True)
    vocab = rows.shape[1]
    assert len(res.tokens) == res.num_accepted + 1
    assert tree.prefixes[res.node] == res.accepted_tokens
    assert all(0 <= t < vocab for t in res.tokens)
    # Never emit a token the target gives probability zero at its context.
    for i, t in enumerate(res.tokens):
        ctx_node = tree.path(res.node)[i]
        assert float(rows[ctx_node, t]) > 0, (name, res)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    kind=st.sampled_from(KINDS),
    vocab=st.integers(2, 7),
    seed=st.integers(0, 10**6),
    shape=st.sampled_from(SHAPES),
)
def test_degenerate_rows_never_break_a_verifier(kind, vocab, seed, shape):
    def draft(c):
        return _rows(kind, vocab, seed, c)[1]

    def target(c):
        return _rows(kind, vocab, seed, c)[0]

    gen = torch.Generator().manual_seed(seed)
    tree = sample_tree(shape, draft, gen)
    rows = torch.stack([target(pre) for pre in tree.prefixes])
    for name, spec in REGISTRY.items():
        if shape.law not in spec.laws or spec.greedy_only:
            continue
        for _ in range(3):
            _check(name, tree, rows, gen)
    _check("greedy", tree, rows, gen)


def test_duplicate_draws_are_merged_with_multiplicity():
    q = torch.tensor([0.0, 1.0, 0.0], dtype=torch.float64)
    p = torch.tensor([0.2, 0.5, 0.3], dtype=torch.float64)
    tree = sample_tree(TreeShape.iid(3, 2), lambda c: q, torch.Generator().manual_seed(0))
    assert tree.num_nodes == 3  # one distinct path
    assert tree.child_draws[0] == [1, 1, 1]
    rows = p.repeat(tree.num_nodes, 1)
    gen = torch.Generator().manual_seed(1)
    for name in ["specinfer", "spectr", "traversal", "gbv", "naive", "nss", "rrsw"]:
        for _ in range(20):
            res = verify(name, tree, rows, gen)
            assert res.tokens[: res.num_accepted] == (1,) * res.num_accepted


def test_long_chains_underflow_gracefully():
    vocab, length = 5, 300
    q = torch.tensor([0.96, 0.01, 0.01, 0.01, 0.01], dtype=torch.float64)
    p = torch.tensor([0.30, 0.30, 0.2, 0.1, 0.1], dtype=torch.float64)
    tree = sample_tree(TreeShape.chain(length), lambda c: q, torch.Generator().manual_seed(0))
    rows = p.repeat(tree.num_nodes, 1)
    gen = torch.Generator().manual_seed(0)
    for name in ["token", "block", "traversal", "gbv", "hsd", "specinfer", "spectr", "nss", "naive", "rrsw"]:
        for _ in range(5):
            res = verify(name, tree, rows, gen, allow_lossy=True)
            assert 0 <= res.next_token < vocab
            assert res.num_accepted <= length


def test_all_rejected_uses_the_residual():
    # q puts all its mass where p has none: every child is rejected, the token comes from p's support.
    p = torch.tensor([0.0, 0.0, 0.5, 0.5], dtype=torch.float64)
    q = torch.tensor([0.5, 0.5, 0.0, 0.0], dtype=torch.float64)
    gen = torch.Generator().manual_seed(0)
    for shape in SHAPES:
        tree = sample_tree(shape, lambda c: q, gen)
        rows = p.repeat(tree.num_nodes, 1)
        for name, spec in REGISTRY.items():
            if shape.law in spec.laws and spec.lossless:
                res = verify(name, tree, rows, gen)
                assert res.num_accepted == 0 and res.next_token in (2, 3)
                if name in ("nss", "greedy"):  # drawn from the target's own row
                    assert res.bonus


def test_p_equal_q_accepts_everything_on_a_chain():
    p = torch.tensor([0.1, 0.2, 0.3, 0.4], dtype=torch.float64)
    tree = sample_tree(TreeShape.chain(5), lambda c: p, torch.Generator().manual_seed(0))
    rows = p.repeat(tree.num_nodes, 1)
    gen = torch.Generator().manual_seed(0)
    for name in ["token", "block", "traversal", "gbv", "specinfer", "spectr", "rrsw", "naive"]:
        for _ in range(10):
            res = verify(name, tree, rows, gen)
            assert res.num_accepted == 5 and res.bonus, name


def test_law_tags_are_canonical():
    assert TreeShape.iid(1, 4).law is DraftLaw.CHAIN
    assert TreeShape.delayed(0, 3, 2) == TreeShape.iid(3, 2)


def test_verifiers_never_mutate_their_inputs():
    vocab = 6

    def row(model, c):
        g = torch.Generator().manual_seed(hash((model, len(c), *c)) % (2**31))
        return torch.softmax(torch.randn(vocab, generator=g, dtype=torch.float64) * 2, 0)

    gen = torch.Generator().manual_seed(0)
    for shape in SHAPES:
        tree = sample_tree(shape, lambda c: row(1, c), gen)
        rows = torch.stack([row(0, pre) for pre in tree.prefixes])
        draft_before, rows_before = tree.draft_probs.clone(), rows.clone()
        for name, spec in REGISTRY.items():
            if shape.law in spec.laws:
                for _ in range(10):
                    verify(name, tree, rows, gen, allow_lossy=True)
        assert torch.equal(tree.draft_probs, draft_before)
        assert torch.equal(rows, rows_before)
