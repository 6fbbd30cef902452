"""draw_children: its batched paths (inverse CDF, the first distinct tokens of i.i.d. draws, the race) and its
one-at-a-time path have one law; the greedy and support rules."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from scipy.stats import chisquare

from adaptive_spec.analysis.exact import enumerate_law
from adaptive_spec.rng import TorchSampler
from adaptive_spec.trees.draw import _first_distinct, _race, draw_children

ROW = torch.tensor([0.4, 0.0, 0.3, 0.2, 0.1], dtype=torch.float64)


def _exact(k: int, distinct: bool) -> dict[tuple[int, ...], float]:
    """Exact law of the sequential path's children, by enumerating its choices."""

    def program(sampler) -> tuple[int, ...]:
        tokens, valid = draw_children(ROW[None], k, sampler, replace=not distinct)
        return tuple(t for t, ok in zip(tokens[0].tolist(), valid[0].tolist(), strict=True) if ok)

    return enumerate_law(program)


def _batched(k: int, distinct: bool, path: str):
    def draw(rows, g):
        if path == "draw_children":
            return draw_children(rows, k, g, replace=not distinct)
        if path == "draw_children_accelerator":
            from adaptive_spec.rng import accelerator_path_on_cpu

            with accelerator_path_on_cpu():
                return draw_children(rows, k, g, replace=not distinct)
        return (_race if path == "race" else _first_distinct)(rows, k, g)  # the accelerator's and the CPU's

    return draw


@pytest.mark.parametrize(
    ("k", "distinct", "path"),
    [
        (2, True, "draw_children"),
        (3, False, "draw_children"),
        (1, True, "draw_children"),
        (3, True, "race"),
        (1, True, "race"),  # a single draw on an accelerator: the race's argmax is a categorical draw
        (1, True, "draw_children_accelerator"),
        (3, True, "first_distinct"),
        (4, True, "first_distinct"),  # the whole support: a row short of 4 distinct tokens in 16 draws, often
    ],
)
def test_the_batched_paths_have_the_law_of_sequential_draws(k: int, distinct: bool, path: str) -> None:
    exact = _exact(k, distinct)
    assert sum(exact.values()) == pytest.approx(1.0)
    n = 20000
    g = torch.Generator().manual_seed(0)
    tokens, valid = _batched(k, distinct, path)(ROW.expand(n, -1).contiguous(), g)
    assert bool(valid.all())
    counts = Counter(tuple(r) for r in tokens.tolist())
    assert set(counts) <= set(exact)  # never a zero-probability token, never a repeat without replacement
    keys = sorted(exact)
    observed = [counts[key] for key in keys]
    expected = [exact[key] * n for key in keys]
    assert chisquare(observed, expected).pvalue > 1e-3


def test_draws_past_the_support_are_not_children() -> None:
    row = torch.tensor([[0.0, 0.75, 0.0, 0.25]])
    g = torch.Generator().manual_seed(1)
    for source in (g, TorchSampler(g)):
        tokens, valid = draw_children(row, 4, source, replace=False)
        assert valid.tolist() == [[True, True, False, False]]
        assert sorted(tokens[0, :2].tolist()) == [1, 3]


def test_greedy_takes_the_argmax_first_and_the_top_k_without_replacement() -> None:
    rows = torch.tensor([[0.1, 0.5, 0.4], [0.6, 0.1, 0.3]])
    g = torch.Generator().manual_seed(2)
    for source in (g, TorchSampler(g)):
        tokens, _ = draw_children(rows, 2, source, greedy=True)
        assert tokens.tolist() == [[1, 2], [0, 2]]
        tokens, _ = draw_children(rows, 1, source, replace=True, greedy=True)
        assert tokens.tolist() == [[1], [0]]
    # Later i.i.d. draws are still sampled: across many rows, not all second draws are the argmax.
    tokens, _ = draw_children(rows[:1].expand(200, -1), 2, g, replace=True, greedy=True)
    assert (tokens[:, 0] == 1).all() and (tokens[:, 1] != 1).any()


def test_a_lone_greedy_draw_consumes_no_randomness() -> None:
    g = torch.Generator().manual_seed(3)
    state = g.get_state()
    draw_children(ROW[None], 1, g, greedy=True)  # a lone walker at T=0: its argmax
    draw_children(ROW[None], 3, g, greedy=True)  # a without-replacement node at T=0: its top 3
    assert torch.equal(g.get_state(), state)
    draw_children(ROW[None], 1, g, replace=True)
    assert not torch.equal(g.get_state(), state)


def test_a_wrong_sampler_fails_the_law_check() -> None:
    """Negative control: draws from a slightly different row (one token's mass moved) fail the same check."""
    exact = _exact(2, True)
    n = 20000
    g = torch.Generator().manual_seed(0)
    skewed = torch.tensor([0.45, 0.0, 0.25, 0.2, 0.1], dtype=torch.float64)
    tokens, _ = draw_children(skewed.expand(n, -1).contiguous(), 2, g)
    counts = Counter(tuple(r) for r in tokens.tolist())
    keys = sorted(exact)
    assert chisquare([counts[key] for key in keys], [exact[key] * n for key in keys]).pvalue < 1e-3


def test_the_inverse_cdf_never_draws_a_token_of_weight_zero() -> None:
    rows = torch.tensor([[0.0, 0.5, 0.0, 0.0, 0.5, 0.0], [0.0, 0.0, 0.0, 0.0, 0.0, 1.0]] * 500)
    g = torch.Generator().manual_seed(4)
    tokens, valid = draw_children(rows, 3, g, replace=True)
    assert bool(valid.all())
    assert set(tokens[0::2].flatten().tolist()) == {1, 4} and set(tokens[1::2].flatten().tolist()) == {5}


def test_a_cpu_draws_as_an_accelerator_when_asked() -> None:
    """Without replacement an accelerator runs the race, a CPU the first distinct tokens of i.i.d. draws;
    ``accelerator_path_on_cpu`` makes a CPU take the accelerator's path (``bench overhead --syncs`` counts that one)."""
    from adaptive_spec.rng import accelerator_path_on_cpu

    rows = ROW.expand(8, -1).contiguous()
    with accelerator_path_on_cpu():
        on_accelerator = draw_children(rows, 3, torch.Generator().manual_seed(5))
    on_cpu = draw_children(rows, 3, torch.Generator().manual_seed(5))
    for mine, path in ((on_accelerator, _race), (on_cpu, _first_distinct)):
        want = path(rows, 3, torch.Generator().manual_seed(5))
        assert torch.equal(mine[0], want[0]) and torch.equal(mine[1], want[1])
    assert not torch.equal(on_accelerator[0], on_cpu[0])  # two paths, not one


def test_rows_with_a_small_support_draw_nothing_past_it_on_every_path() -> None:
    """Fewer positive tokens than k, with rows greedy and not: the draws past the support are not valid, and no
    valid draw repeats a token."""
    from adaptive_spec.rng import accelerator_path_on_cpu

    rows = torch.tensor(
        [[0.0, 0.75, 0.0, 0.0, 0.25]] * 6
    )  # the last token in the support: an exhausted draw lands there
    greedy = torch.tensor([True, False] * 3)
    for accelerator in (False, True):
        g = torch.Generator().manual_seed(6)
        if accelerator:
            with accelerator_path_on_cpu():
                tokens, valid = draw_children(rows, 4, g, greedy=greedy)
        else:
            tokens, valid = draw_children(rows, 4, g, greedy=greedy)
        assert valid.tolist() == [[True, True, False, False]] * 6
        assert all(sorted(r[:2]) == [1, 4] for r in tokens.tolist())


def test_draw_tokens_draws_what_draw_children_draws_on_every_path() -> None:
    """``draw_tokens`` (no validity ops) takes the same draws from the same generator state: with and without
    replacement, greedy rows mixed in, on a CPU's path and an accelerator's; the generators end in one state."""
    from adaptive_spec.rng import accelerator_path_on_cpu
    from adaptive_spec.trees.draw import draw_tokens

    rows = torch.softmax(torch.randn(5, 11, generator=torch.Generator().manual_seed(3)), -1)
    greedy_rows = torch.tensor([True, False, False, True, False])
    compared = 0
    for accelerator in (False, True):
        for k, replace, greedy in ((1, False, False), (3, True, False), (3, False, False), (4, False, greedy_rows)):
            ga, gb = torch.Generator().manual_seed(9), torch.Generator().manual_seed(9)
            if accelerator:
                with accelerator_path_on_cpu():
                    a, _ = draw_children(rows, k, ga, replace=replace, greedy=greedy)
                    b = draw_tokens(rows, k, gb, replace=replace, greedy=greedy)
            else:
                a, _ = draw_children(rows, k, ga, replace=replace, greedy=greedy)
                b = draw_tokens(rows, k, gb, replace=replace, greedy=greedy)
            assert torch.equal(a, b) and torch.equal(ga.get_state(), gb.get_state())
            compared += 1
    assert compared == 8
    a = draw_tokens(rows, 3, torch.Generator().manual_seed(9))
    assert not torch.equal(a, draw_tokens(rows, 3, torch.Generator().manual_seed(10)))  # the seed matters
