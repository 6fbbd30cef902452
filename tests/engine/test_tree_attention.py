"""Tree-attention logits equal sequential logits along every root-to-leaf path, across commits."""

from __future__ import annotations

import pytest
import torch

from adaptive_spec.engine.runner import ModelRunner
from adaptive_spec.trees import TreeShape, ancestor_matrix, sample_tree
from tests.helpers.tiny import ATTN, KINDS, tiny_model


def _sequential_logits(model, ids: list[int]) -> torch.Tensor:
    with torch.inference_mode():
        return model(input_ids=torch.tensor([ids])).logits[0, -1].float()


@pytest.mark.parametrize("attn", ATTN)
@pytest.mark.parametrize("kind", KINDS)
def test_tree_logits_match_sequential_after_commits(kind: str, attn: str) -> None:
    V = 40
    model = tiny_model(kind, vocab=V, attn=attn)
    runner = ModelRunner(model)
    g = torch.Generator().manual_seed(0)
    context = [0, 5, 9, 3, 17]
    uniform = torch.full((V,), 1.0 / V)
    with torch.inference_mode():
        runner.chain_forward(torch.tensor(context[:-1]), logits_to_keep=1)
        for step, text in enumerate(["delayed:1x3x2", "wor:3x2", "iid:2x3", "chain:3"]):
            shape = TreeShape.parse(text)
            tree = sample_tree(shape, lambda _prefix: uniform, g)
            n, N = len(context), tree.num_nodes
            ids = torch.tensor([context[-1], *tree.tokens[1:]])
            pos = n - 1 + torch.tensor(tree.depths)
            logits = runner.block_forward(ids, pos, ancestor_matrix(tree.parents), logits_to_keep=N).float()
            for node in range(N):  # every node, so every root-to-leaf path
                expected = _sequential_logits(model, context + list(tree.prefixes[node]))
                torch.testing.assert_close(logits[node], expected, atol=1e-4, rtol=1e-4, msg=f"step {step} node {node}")
            # Commit a deepest path (the accepted path) and append a "bonus" token.
            leaf = max(range(N), key=lambda i: tree.depths[i])
            path = tree.path(leaf)[1:]
            runner.commit(n, torch.tensor([n - 1 + a for a in path]))
            context += [tree.tokens[a] for a in path] + [7 + step]
            assert runner.cached == runner.cache_length() == len(context) - 1
