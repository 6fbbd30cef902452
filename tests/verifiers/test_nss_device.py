"""NSS on the rows' device (``verify_nss`` with a ``torch.Generator``) has NSS's law, with one host read.

The device path draws every node's ``Y ~ p`` at once (each node is visited at most once and its draw is
independent of the others', so drawing them all ahead leaves the walk's law unchanged) and walks the tree
on the host after one read. Its output frequencies on a fixed trie match the law computed exactly from the
rows; a variant that draws from the draft rows instead fails the same check; the enumeration sampler (the
host walk) still passes the exact tests (``test_exact.py``).
"""

from __future__ import annotations

import torch

from adaptive_spec.analysis.instances import random_instance
from adaptive_spec.rng import TorchSampler
from adaptive_spec.trees.draw import draw_tokens
from adaptive_spec.trees.lookup import lookup_trie, trie_with_path
from adaptive_spec.verifiers.nss import verify_nss
from tests.helpers.reads import counted_reads

RUNS = 6000


def _tv(a: dict, b: dict) -> float:
    return 0.5 * sum(abs(a.get(k, 0.0) - b.get(k, 0.0)) for k in set(a) | set(b))


def _exact(tree, target: torch.Tensor) -> dict:
    """NSS's output law on ``tree``: at each node draw y ~ p; follow the child holding y, else emit it."""
    out: dict = {}

    def walk(node: int, mass: float) -> None:
        for y, py in enumerate(target[node].tolist()):
            if py <= 0:
                continue
            child = tree.child_with_token(node, y)
            if child is None:
                key = (*tree.prefixes[node], y)
                out[key] = out.get(key, 0.0) + mass * py
            else:
                walk(child, mass * py)

    walk(0, 1.0)
    return out


def _case():
    inst = random_instance(3, 4, zero_frac=0.0)
    tree = lookup_trie([[1, 2, 0], [1, 3], [2, 2]], 4, 3)  # a trie: branching at the root and at node "1"
    target = torch.stack([inst.target_fn(c) for c in tree.prefixes]).float()
    return tree, target


def test_the_device_walk_has_nss_law_and_a_wrong_walk_fails() -> None:
    tree, target = _case()
    exact = _exact(tree, target)
    assert abs(sum(exact.values()) - 1.0) < 1e-6
    assert max(len(k) for k in exact) == 4  # some outputs run through the whole trie

    def frequencies(rows: torch.Tensor) -> dict:
        sampler, counts = TorchSampler(torch.Generator().manual_seed(0)), {}
        for _ in range(RUNS):
            r = verify_nss(tree, rows, sampler)
            counts[r.tokens] = counts.get(r.tokens, 0) + 1
            assert r.bonus and r.next_on_device is not None and int(r.next_on_device) == r.tokens[-1]
        return {k: v / RUNS for k, v in counts.items()}

    assert _tv(frequencies(target), exact) < 0.035
    assert _tv(frequencies(tree.draft_probs), exact) > 0.1  # the draft's rows in place of the target's


def test_the_device_walk_reads_the_host_once_with_the_ride() -> None:
    tree, target = _case()
    with counted_reads() as reads:
        r = verify_nss(tree, target, TorchSampler(torch.Generator().manual_seed(1)), ride=torch.tensor([7, 1]))
    assert len(reads) == 1 and r.ride == (7, 1)


def test_siblings_holding_one_token_walk_as_one_node_of_the_merged_trie() -> None:
    """A trie with a path drafted apart (``trie_with_path``: the path's "1" and the trie's "1" are siblings) has
    the NSS law of the merged trie: the walk takes the first sibling's draw and looks for the next token among
    both siblings' children. A walk that follows the first sibling alone has another law (the check has power)."""
    tree = trie_with_path([[1, 2, 0], [2, 2]], torch.tensor([1, 3]), 4, 3, "cpu")
    merged = lookup_trie([[1, 3], [1, 2, 0], [2, 2]], 4, 3)
    assert tree.num_nodes == merged.num_nodes + 1 and tree.children[0] == [1, 3, 6]  # "1" (the path), "1", "2"
    row = torch.tensor([0.1, 0.5, 0.3, 0.1])  # after any prefix: "1" then "2" (on the trie's "1" alone) is likely
    target = row.expand(tree.num_nodes, -1)
    exact = _exact(merged, row.expand(merged.num_nodes, -1))

    def frequencies(first_sibling_only: bool) -> dict:
        gen, counts = torch.Generator().manual_seed(0), {}
        for _ in range(RUNS):
            if first_sibling_only:
                draws, node = draw_tokens(target, 1, gen)[:, 0].tolist(), 0
                while (child := tree.child_with_token(node, draws[node])) is not None:
                    node = child
                out = (*tree.prefixes[node], draws[node])
            else:
                out = verify_nss(tree, target, TorchSampler(gen)).tokens
            counts[out] = counts.get(out, 0) + 1
        return {k: v / RUNS for k, v in counts.items()}

    assert _tv(frequencies(False), exact) < 0.035
    assert _tv(frequencies(True), exact) > 0.1
