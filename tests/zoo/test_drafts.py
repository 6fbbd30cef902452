"""The drafts' training pieces: the unrolled head is the head as the engine drafts with it."""

from __future__ import annotations

import pytest
import torch

from adaptive_spec.engine.eagle import EagleConfig, EagleHead, EagleRunner
from adaptive_spec.zoo.drafts import unroll_masks, unrolled_hidden
from tests.helpers.tiny import tiny_model


@pytest.mark.parametrize("depth", [1, 2, 3])
def test_unrolled_pass_k_is_the_engines_depth_k_draft(depth) -> None:
    """Pass k of the training unroll at position j gives the row the engine drafts at depth k below root j - k + 1."""
    target = tiny_model("llama", vocab=48, hidden=32, seed=3, eos=None)
    cfg = EagleConfig.for_target(target.config, draft_vocab_size=40, initializer_range=0.3)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    head = EagleHead(cfg).eval()
    head.set_vocabulary(torch.arange(8, 48))
    head.bind(target)
    ids = torch.tensor([[5, 9, 11, 4, 30, 7, 21, 13, 40, 6]])
    L = ids.shape[1]
    seen = []
    hook = target.lm_head.register_forward_pre_hook(lambda _m, a: seen.append(a[0]))
    with torch.inference_mode():
        target(input_ids=ids)
    hook.remove()
    f = seen[0][0]  # [L, H] target features
    prev = torch.cat([torch.zeros(1, f.shape[1]), f[:-1]])[None]
    with torch.inference_mode():
        hs = unrolled_hidden(head, ids, prev, torch.arange(L)[None], unroll_masks(L, depth))
        want = head.lm_head(hs[-1][0])  # [L, N]
    for j in range(depth + 1, L):
        r = j - depth + 1  # the root: the last committed token
        runner = EagleRunner(head)
        with torch.inference_mode():
            runner.set_target_features(0, f[:r])
            runner.chain_forward(ids[0, :r], logits_to_keep=1)
            logits = runner.block_forward(ids[0, r : r + 1], torch.tensor([r]), torch.ones(1, 1, dtype=torch.bool), 1)
            for d in range(1, depth):  # the drafted chain below the root: the sequence's own tokens
                anc = torch.ones(1, d + 1, dtype=torch.bool)
                logits = runner.block_forward(ids[0, r + d : r + d + 1], torch.tensor([r + d]), anc, 1)
        assert torch.allclose(logits[0], want[j], atol=1e-4), (j, depth)


def test_a_continued_build_knows_which_shard_seeds_the_committed_builds_used(tmp_path) -> None:
    import json

    from adaptive_spec.zoo.drafts import reused_seeds, unused_seed

    assert reused_seeds(tmp_path, 0, 40) == [] and unused_seed(tmp_path) == 0
    first = {"seed": 0, "conversations": {"shards": 22}}
    (tmp_path / "build_info.json").write_text(
        json.dumps({"seed": 1000, "conversations": {"shards": 10}, "continued_from": first})
    )
    assert reused_seeds(tmp_path, 0, 40) == list(range(22))
    assert reused_seeds(tmp_path, 1005, 40) == list(range(1005, 1010))
    assert reused_seeds(tmp_path, 2000, 40) == []
    assert unused_seed(tmp_path) == 2000


class _Tok:
    """The tokenizer ``generate_conversations`` reads before its shards (the shards themselves are stubbed)."""

    padding_side = "right"

    def convert_tokens_to_ids(self, token):
        return 0


def _stub_shards(monkeypatch, seen) -> None:
    """Stub ``selfdistill._one_shard``: each shard calls ``seen(seed, requests)`` and writes one conversation."""
    import json

    from adaptive_spec.zoo import selfdistill

    def one_shard(model, tokenizer, eos, batch, request_tokens, answer_tokens, temperature, seed, requests):
        seen(seed, requests)
        return [json.dumps({"answer_ids": [1, 2], "seed": seed})], 1, 2

    monkeypatch.setattr(selfdistill, "_one_shard", one_shard)


def test_shards_named_first_are_written_first_so_a_stopped_build_has_a_held_out_shard(tmp_path, monkeypatch) -> None:
    import time

    from adaptive_spec.zoo import selfdistill
    from adaptive_spec.zoo.drafts import HELD_OUT, held_out

    written = []

    def seen(seed, requests):
        written.append(seed)
        if len(written) == 3:  # the budget runs out after the third shard
            monkeypatch.setattr(time, "time", lambda: float("inf"))

    _stub_shards(monkeypatch, seen)
    got = selfdistill.generate_conversations(
        torch.nn.Linear(1, 1),
        _Tok(),
        tmp_path,
        shards=40,
        seed=100,
        progress=False,
        deadline=time.time() + 3600,
        first=[HELD_OUT - 1],
    )
    assert written == [100 + HELD_OUT - 1, 100, 101]  # shard i keeps seed + i whatever the order
    assert got["shards"] == 3
    shards = sorted(int(p.stem.split("-")[1]) for p in tmp_path.glob("conv-*.jsonl"))
    assert shards == [0, 1, HELD_OUT - 1] and [s for s in shards if held_out(s)] == [HELD_OUT - 1]


@pytest.mark.parametrize("repeat", [True, False])
def test_prompt_shards_repeat_the_prompts_only_when_asked(tmp_path, monkeypatch, repeat) -> None:
    """Odd shards take the next batch of the user prompts; used up, they start again or are self-written."""
    from adaptive_spec.zoo import selfdistill

    given = {}
    _stub_shards(monkeypatch, given.__setitem__)
    prompts = [f"p{i}" for i in range(5)]
    selfdistill.generate_conversations(
        torch.nn.Linear(1, 1),
        _Tok(),
        tmp_path,
        shards=8,
        batch=2,
        progress=False,
        user_prompts=prompts,
        repeat_prompts=repeat,
    )
    assert [given[i] for i in (0, 2, 4, 6)] == [None] * 4  # even shards: self-written
    assert given[1] == ["p0", "p1"] and given[3] == ["p2", "p3"]
    assert given[5] == (["p4", "p0"] if repeat else ["p4"])  # the last of them: a short batch
    assert given[7] == (["p1", "p2"] if repeat else None)  # used up: again, or self-written
