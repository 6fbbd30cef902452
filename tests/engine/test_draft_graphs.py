"""Whole drafts in one captured replay (ModelSlot.draft_graph, ModelRunner.captured_draft): chains and EAGLE-style
trees without replacement, on a CPU with the stand-in graph of tests/helpers/graphs.py: the draft the level-by-level
drafter draws, the engine's greedy tokens and its law (with negative controls), and the fallbacks. The CUDA graphs
themselves: tests/engine/test_cuda.py."""

from __future__ import annotations

import dataclasses
import itertools
import logging

import pytest
import torch

from adaptive_spec.engine import SpecEngine, drafting, runner
from adaptive_spec.engine.drafting import draft_tree
from adaptive_spec.engine.eagle import EagleConfig, EagleHead, EagleRunner
from adaptive_spec.engine.graphs import DRAFT_DEPTH, ModelSlot
from adaptive_spec.engine.logits import ProbsFn, SamplingConfig, build_logits_processor
from adaptive_spec.engine.runner import ModelRunner
from adaptive_spec.trees import TreeShape
from tests.helpers import laws
from tests.helpers.drafting import drafting_attr, patch_drafting
from tests.helpers.graphs import record_eagerly, record_ops, slots_as_on_cuda
from tests.helpers.tiny import perturbed, tiny_model

V = 48


def _head(target, init: float | None = None) -> EagleHead:
    kw = {} if init is None else {"initializer_range": init}  # larger weights: rows far from uniform
    head = EagleHead(EagleConfig.for_target(target.config, draft_vocab_size=40, **kw)).eval()
    head.set_vocabulary(torch.arange(3, 43))  # a reduced vocabulary: ids 0-2 and 43-47 have draft probability 0
    return head.bind(target)


def _runners(kind: str, monkeypatch, init: float | None = None, record=record_ops):
    """(captured, eager): two runners of one draft, the first's slot capturing as on CUDA with the stand-in ``record``
    (``init``: the head's initializer range)."""
    slots_as_on_cuda(monkeypatch, record=record)
    target = tiny_model("llama", vocab=V, eos=None)
    if kind == "eagle":
        head = _head(target, init)
        made = [EagleRunner(head, slot=ModelSlot(head, 64, drafts=c)) for c in (True, False)]
        token_ids = head.token_ids
    else:
        draft = perturbed(target, scale=0.3)
        made = [ModelRunner(draft, slot=ModelSlot(draft, 64, drafts=c)) for c in (True, False)]
        token_ids = None
    return made, token_ids


def _probs_fn(temperature: float, token_ids, top_k: int = 0) -> ProbsFn:
    sampling = SamplingConfig(temperature=temperature, top_k=top_k)
    return ProbsFn(build_logits_processor(sampling.generation_config()), V, one_hot=False, token_ids=token_ids)


def _commit_chain(
    runners, kind: str, feats, context: list[int], tokens: list[int], accept: int, depth: int, bonus: int
):
    """Commit the pending tokens and ``accept`` drafted ones of a chain of ``depth`` as the engine does (a model keeps
    the accepted nodes' rows that were fed, the leaf never is; an EAGLE head only the context's, handed the target's
    features of the new positions: the accepted nodes are fed again, with them); the context after it."""
    for r in runners:
        if kind == "eagle":
            r.set_target_features(r.cached, feats[r.cached : len(context) + accept])
            r.commit(len(context), None)
        else:
            r.commit(len(context), torch.arange(len(context), len(context) + min(accept, depth - 1)))
    return context + tokens[1 : accept + 1] + [bonus]


@pytest.mark.parametrize("kind", ["model", "eagle"])
@pytest.mark.parametrize(("temperature", "top_k"), [(0.0, 0), (1.0, 0), (0.8, 5)])
def test_a_captured_chain_is_the_level_by_level_chain(monkeypatch, kind, temperature, top_k) -> None:
    """The same tokens (from one generator state), rows, finite flag and cache rows as the chain drafted level by level,
    over steps whose pending rows fall in buckets 1, 2 and 4 (a padding row), with commits between; committed rows are
    never written, and every step is one replay."""
    (captured, eager), token_ids = _runners(kind, monkeypatch)
    probs_fn = _probs_fn(temperature, token_ids, top_k)
    feats = torch.randn(40, 32, generator=torch.Generator().manual_seed(3))
    prompt = torch.tensor([0, 5, 9, 3, 7, 11])
    with torch.inference_mode():
        for r in (captured, eager):
            if kind == "eagle":
                r.set_target_features(0, feats[:5])
            r.chain_forward(prompt[:3], logits_to_keep=1)  # 3 pending tokens for the first step: a padding row
        context = prompt.tolist()
        for step, (depth, accept) in enumerate([(4, 2), (3, 0), (5, 3), (1, 1), (6, 0)]):
            pending = torch.tensor(context[captured.cached :])
            outcomes = []
            for r in (captured, eager):
                before = r.slot.kv.buffer[:, :, : r.cached].clone()
                g = torch.Generator().manual_seed(step)
                outcomes.append(draft_tree(r, pending, TreeShape.chain(depth), probs_fn, g, temperature == 0))
                assert torch.equal(r.slot.kv.buffer[:, :, : r.cached], before)  # committed rows untouched
            (a, b), block = outcomes, slice(captured.cached, captured.length)
            assert captured.length == eager.length == captured.cached + len(pending) + depth - 1
            assert a.tree.tokens == b.tree.tokens and a.tree.parents == b.tree.parents
            torch.testing.assert_close(a.tree.draft_probs, b.tree.draft_probs, rtol=1e-5, atol=1e-6)
            assert bool(a.ok) and bool(b.ok) and a.pending_fed == b.pending_fed == len(pending)
            kv_a, kv_b = (r.slot.kv.buffer[:, :, block] for r in (captured, eager))
            torch.testing.assert_close(kv_a, kv_b, rtol=1e-5, atol=1e-5)  # the block's rows, as the eager ones
            assert sum(g.graph.replays for g in captured.slot._drafts.values()) == step + 1
            context = _commit_chain((captured, eager), kind, feats, context, a.tree.tokens, accept, depth, step + 20)
    assert captured.slot.draft_failed is None
    # per depth, every depth below it and every bucket its steps can leave: a model's 1 or 2 pending tokens (3 on the
    # first step: bucket 4), an EAGLE head's up to depth + 1
    buckets = {k[0] for k in captured.slot._drafts}
    assert buckets == ({1, 2, 4, 8} if kind == "eagle" else {1, 2, 4})
    assert not eager.slot._drafts


def test_an_eagle_block_cannot_be_extended_after_a_captured_chain(monkeypatch) -> None:
    """A captured chain's features stay in its graph, so a further forward of the step is refused (none is made by
    the engine: a chain's step feeds nothing after it); a rollback opens the next step."""
    (captured, _), token_ids = _runners("eagle", monkeypatch)
    probs_fn = _probs_fn(1.0, token_ids)
    with torch.inference_mode():
        captured.set_target_features(0, torch.randn(3, 32))
        captured.chain_forward(torch.tensor([0, 5, 9]), logits_to_keep=1)
        draft_tree(captured, torch.tensor([4]), TreeShape.chain(3), probs_fn, torch.Generator().manual_seed(0), False)
        with pytest.raises(RuntimeError, match="cannot be extended"):
            captured.block_forward(torch.tensor([6]), torch.tensor([6]), None, logits_to_keep=1)
        captured.rollback(3)
        captured.block_forward(torch.tensor([4]), torch.tensor([3]), None, logits_to_keep=1)


def test_chains_are_drafted_level_by_level_where_a_graph_cannot_keep_the_processors(monkeypatch) -> None:
    """A processor outside ProbsFn.CAPTURABLE (its state may hold tensors a graph would read after they are gone)
    and hidden states kept (root features) each draft the chain level by level: no chain graph."""
    from transformers import LogitsProcessorList
    from transformers.generation.logits_process import MinPLogitsWarper

    (captured, _), _ = _runners("model", monkeypatch)
    with torch.inference_mode():
        captured.chain_forward(torch.tensor([0, 5, 9]), logits_to_keep=1)
        min_p = ProbsFn(LogitsProcessorList([MinPLogitsWarper(0.1)]), V, one_hot=False)
        assert min_p.graph_key() is None and _probs_fn(0.7, None, 3).graph_key() is not None
        g = torch.Generator().manual_seed(0)
        draft_tree(captured, torch.tensor([4]), TreeShape.chain(3), min_p, g, False)
        assert not captured.slot._drafts and captured.length == captured.cached + 3
        captured.rollback(3)
        captured.keep_hidden = True
        draft_tree(captured, torch.tensor([4]), TreeShape.chain(3), _probs_fn(1.0, None), g, False)
        assert not captured.slot._drafts
        captured.rollback(3)
        captured.keep_hidden = False
        draft_tree(captured, torch.tensor([4]), TreeShape.chain(3), _probs_fn(1.0, None), g, False)
        # the first chain of a depth captures every depth below (the budget's cuts) after 1 and 2 pending rows (the
        # most a model's step leaves): 6 graphs of one key
        assert {k[:2] for k in captured.slot._drafts} == {(c, d) for c in (1, 2) for d in (1, 2, 3)}


def test_a_failed_chain_capture_logs_one_line_and_drafts_level_by_level(monkeypatch, caplog) -> None:
    """A chain capture that fails logs one line; that chain and every later one are drafted level by level, with
    the eager chain's tokens, and nothing is captured again."""
    (captured, eager), _ = _runners("model", monkeypatch)
    calls = []

    def broken(self, *args):
        calls.append(1)
        raise RuntimeError("operation not permitted when stream is capturing\nmore")

    monkeypatch.setattr(ModelSlot, "_capture_draft_forms", broken)
    probs_fn = _probs_fn(1.0, None)
    with torch.inference_mode(), caplog.at_level(logging.WARNING, logger="adaptive_spec.engine"):
        for r in (captured, eager):
            r.chain_forward(torch.tensor([0, 5, 9]), logits_to_keep=1)
        for depth in (3, 4):
            a, b = (
                draft_tree(r, torch.tensor([4]), TreeShape.chain(depth), probs_fn, torch.Generator().manual_seed(1), 0)
                for r in (captured, eager)
            )
            assert a.tree.tokens == b.tree.tokens
            for r in (captured, eager):
                r.rollback(3)
    assert len(calls) == 1 and captured.slot.draft_failed.startswith("RuntimeError: operation not permitted")
    lines = [r.getMessage() for r in caplog.records if "whole draft" in r.getMessage()]
    assert len(lines) == 1 and "drafting level by level" in lines[0] and "\n" not in lines[0]


TREES = ("eagle:4:8:3:2:wor/traversal", "eagle:5:16:4:3:wor/greedy")


@pytest.mark.parametrize("kind", ["model", "eagle"])
def test_the_engine_decodes_greedily_as_transformers_through_captured_chains(monkeypatch, kind) -> None:
    """Greedy tokens equal transformers' with every chain drafted in one replay: the target itself as the draft (every
    node accepted, so pending rows of one and of two tokens) and an EAGLE head; chains cut at the budget's end too, one
    deeper than DRAFT_DEPTH (drafted level by level), and EAGLE-style trees without replacement."""
    slots_as_on_cuda(monkeypatch)
    target = tiny_model("llama", vocab=V, eos=None, max_positions=512)
    draft = _head(target) if kind == "eagle" else target
    engine = SpecEngine(target, draft)
    prompt = [0, 9, 3, 4, 11, 12, 13]
    ids = torch.tensor([prompt])
    expected = target.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=23)
    for plan in ("chain:1/block", "chain:4/greedy", "chain:6/block", f"chain:{DRAFT_DEPTH + 1}/block", *TREES):
        out = engine.generate(prompt, max_new_tokens=23, temperature=0, plan=plan)
        assert out.token_ids == expected[0, len(prompt) :].tolist(), plan
        if kind == "model" and plan.startswith("chain"):
            assert max(out.stats.accept_lengths) == int(plan.split(":")[1].split("/")[0])  # the whole chain accepted
    slot = engine._idle_slots["draft"][0]
    assert slot.draft_failed is None and sum(g.graph.replays for g in slot._drafts.values()) > 10
    assert max(k[1] for k in slot._drafts) <= DRAFT_DEPTH  # the deeper chain: level by level
    assert {k[2][0] for k in slot._drafts} == {"chain", "eagle"}  # the trees in one replay too
    info = engine.draft_graphs()  # as bench e2e reports them
    assert len(info["graphs"]) == len(slot._drafts) and info["capture_s"] > 0 and info["failed"] is None
    assert all(g["greedy"] and g["kept"] in g["ms"] for g in info["graphs"])
    assert {g["kind"] for g in info["graphs"]} == {"chain", "eagle"}


_LAW_V = 8


def _law_engine(monkeypatch) -> SpecEngine:
    slots_as_on_cuda(monkeypatch)
    target = tiny_model("llama", vocab=_LAW_V, hidden=16, eos=None, init_range=0.5, seed=11, layers=1)
    return SpecEngine(target, perturbed(target, scale=0.3, seed=12))


def _chi_square(engine: SpecEngine, plan: str, runs: int) -> float:
    sampling = SamplingConfig(temperature=0.9, top_k=6)
    counts = torch.zeros(_LAW_V, _LAW_V, _LAW_V, dtype=torch.long)
    for seed in range(runs):
        out = engine.generate([3], max_new_tokens=3, temperature=0.9, top_k=6, plan=plan, seed=seed)
        counts[tuple(out.token_ids)] += 1
    slot = engine._idle_slots["draft"][0]
    assert sum(g.graph.replays for g in slot._drafts.values()) >= runs  # every step's chain in one replay
    return laws.chi_square_pvalue(counts, laws.exact_law(engine.target, sampling, [3], _LAW_V))


def test_the_engine_is_lossless_through_captured_chains(monkeypatch) -> None:
    """The joint law of the first 3 tokens is the target's (chi-square, 2000 seeded runs) with chains drafted in one
    replay and verified by the block verifier."""
    assert _chi_square(_law_engine(monkeypatch), "chain:2/block", 2000) > 1e-3


def test_the_captured_chain_law_test_fails_for_draws_off_their_rows(monkeypatch) -> None:
    """The negative control: a captured chain whose tokens are not drawn from the rows it reports (each uniform
    cubed) makes the engine's law wrong, and the same test says so."""
    real = drafting_attr("inverse_cdf_from")
    patch_drafting(monkeypatch, "inverse_cdf_from", lambda rows, u: real(rows, u**3))
    assert _chi_square(_law_engine(monkeypatch), "chain:2/block", 2000) < 1e-6


# ---------------------------------------------------------------------- EAGLE-style trees without replacement


def _trees_against_level_by_level(
    monkeypatch, kind, temperature, draft_one, accepts, init=None, tol=1e-5, padded=False, accelerator=True, replays=1
) -> None:
    """``draft_one(runner, pending, probs_fn, generator, greedy)`` on the captured runner and the level-by-level one
    over steps whose pending rows fall in several buckets, each from one generator state on the accelerator's path
    (whose race both take), a path of ``accepts[step]`` nodes down the first children committed between: the same
    tree (tokens, parents, child draws, rows, ancestors, the fed nodes' cache rows) and the same block rows in the
    cache; committed rows never written; every step one replay. ``padded``: the drafts feed padding rows too (more
    block rows than fed nodes); ``accelerator`` False: the CPU's path (its draws: inverse-CDF uniforms); ``replays``: a
    step's (a ``conf-delayed`` tree's two)."""
    import contextlib

    from adaptive_spec.rng import accelerator_path_on_cpu

    (captured, eager), token_ids = _runners(kind, monkeypatch, init)
    probs_fn = _probs_fn(temperature, token_ids)
    feats = torch.randn(60, 32, generator=torch.Generator().manual_seed(3))
    prompt = torch.tensor([0, 5, 9, 3, 7, 11])
    with torch.inference_mode(), accelerator_path_on_cpu() if accelerator else contextlib.nullcontext():
        for r in (captured, eager):
            if kind == "eagle":
                r.set_target_features(0, feats[:5])
            r.chain_forward(prompt[:3], logits_to_keep=1)
        context = prompt.tolist()
        for step, accept in enumerate(accepts):
            pending = torch.tensor(context[captured.cached :])
            outcomes = []
            for r in (captured, eager):
                before = r.slot.kv.buffer[:, :, : r.cached].clone()
                g = torch.Generator().manual_seed(step)
                outcomes.append(draft_one(r, pending, probs_fn, g, temperature == 0))
                assert torch.equal(r.slot.kv.buffer[:, :, : r.cached], before)
            a, b = outcomes
            assert a.tree.tokens == b.tree.tokens and a.tree.parents == b.tree.parents
            assert a.tree.child_draws == b.tree.child_draws and a.fed_nodes == b.fed_nodes
            nodes = range(a.tree.num_nodes)
            assert [a.draft_row(i) for i in nodes] == [b.draft_row(i) for i in nodes]
            torch.testing.assert_close(a.tree.draft_probs, b.tree.draft_probs, rtol=tol, atol=tol / 10)
            assert torch.equal(a.ancestors, b.ancestors) and all(o.ok is None or bool(o.ok) for o in (a, b))
            if a.cache_rows_tensor is not None or b.cache_rows_tensor is not None:
                assert torch.equal(a.cache_rows_tensor, b.cache_rows_tensor)
            assert captured.length == eager.length >= captured.cached + len(pending) + a.fed_nodes - 1
            if not padded:
                assert captured.length == captured.cached + len(pending) + a.fed_nodes - 1
            block = torch.arange(captured.cached, captured.length)
            if padded:  # the pending rows and the fed nodes' (a padding row's are never read)
                root = captured.cached + len(pending) - 1
                block = torch.tensor([*block[: len(pending)].tolist(), *(root + j for j in a.cache_rows.values())])
            kv_a, kv_b = (r.slot.kv.buffer[:, :, block] for r in (captured, eager))
            torch.testing.assert_close(kv_a, kv_b, rtol=1e-5, atol=1e-5)
            assert sum(g.graph.replays for g in captured.slot._drafts.values()) == replays * (step + 1)
            # commit a path of `accept` nodes from the root down its first children (EAGLE: context rows only)
            path, node = [], 0
            while len(path) < accept and a.tree.child_draws[node]:
                node = a.tree.child_draws[node][0]
                path.append(node)
            new = [a.tree.tokens[i] for i in path] + [step + 20]
            for r in (captured, eager):
                if kind == "eagle":
                    r.set_target_features(r.cached, feats[r.cached : len(context) + len(path)])
                    r.commit(len(context), None)
                else:
                    fed = [a.draft_row(i) for i in path if a.draft_row(i) is not None]
                    r.commit(len(context), torch.tensor([len(context) - 1 + f for f in fed], dtype=torch.long))
            context += new
    assert captured.slot.draft_failed is None and not eager.slot._drafts


@pytest.mark.parametrize("kind", ["model", "eagle"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_captured_eagle_tree_is_the_level_by_level_tree(monkeypatch, kind, temperature) -> None:
    """An EAGLE-style tree without replacement grown in one replay is the tree grown level by level with its one
    read (:func:`_trees_against_level_by_level`)."""
    from adaptive_spec.engine.drafting import draft_policy_tree
    from adaptive_spec.trees.policy import EagleTree

    policy = EagleTree(depth=4, budget=10, top_k=3, width=2, without_replacement=True)

    def draft_one(r, pending, probs_fn, g, greedy):
        return draft_policy_tree(r, pending, policy, probs_fn, g, greedy)

    _trees_against_level_by_level(monkeypatch, kind, temperature, draft_one, [2, 0, 3, 1])


@pytest.mark.parametrize("kind", ["model", "eagle"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("width", [2, 1])
def test_a_captured_eagle_tree_with_iid_children_is_the_level_by_level_tree(monkeypatch, kind, temperature, width):
    """An EAGLE-style tree with i.i.d. children grown to its look in one replay is the device drafter's tree, padding
    rows and all (:func:`_trees_against_level_by_level`), at a look before the policy's depth (trees cut there) and at
    its depth (a past tree's stop put in the history), each look a graph of its own depth."""
    from adaptive_spec.engine.drafting import draft_policy_tree
    from adaptive_spec.trees.policy import EagleTree

    policy = EagleTree(depth=4, budget=9, top_k=2, width=width, without_replacement=False)
    looks = []

    def draft_one(r, pending, probs_fn, g, greedy):
        if len(looks) in (4, 5):  # the third step: as if a past tree had been cut at its look, to the depth
            r.chain_look[str(policy)].append(policy.depth)
        out = draft_policy_tree(r, pending, policy, probs_fn, g, greedy)
        looks.append(out.policy_levels)
        return out

    init = 0.3 if kind == "eagle" else None  # peaked rows: draws that merge
    _trees_against_level_by_level(monkeypatch, kind, temperature, draft_one, [2, 0, 3, 1, 1, 0], init, padded=True)
    if width > 1:  # one child a node never merges: every tree is grown to the policy's depth
        assert looks[:2] == [3, 3] and looks[4:6] == [4, 4], looks


#: per family drafted on the captured path: plans, and the kinds of graph they replay
_GREEDY_FAMILIES = {
    "eagle-iid": (("eagle:4:9:2:2/specinfer", "eagle:3:6:3:1/greedy"), {"eagle-iid"}),
    "conf-delayed": (("conf-delayed:4:0.3:2/traversal", "conf-delayed:3:0.2:3:0.1/greedy"), {"trunk", "slots"}),
    "lookup-path": (
        ("lookup:2x4+m3/nss", "lookup:1x4+m2/greedy", "lookup:2x4+m2x3/nss"),
        {"chain"},
    ),  # the draft's greedy chain, replayed
}


def _greedy_through(monkeypatch, kind: str, plans) -> tuple[SpecEngine, int]:
    """Greedy tokens equal transformers' with ``plans`` on the accelerator's path, drafts captured (a model close to
    the target, or a head with peaked rows): the engine and the steps taken."""
    from adaptive_spec.rng import accelerator_path_on_cpu

    slots_as_on_cuda(monkeypatch)
    target = tiny_model("llama", vocab=V, eos=None, max_positions=512)
    draft = _head(target, 0.3) if kind == "eagle" else perturbed(target, scale=0.05, seed=2)
    engine = SpecEngine(target, draft)
    prompt = [0, 9, 3, 4, 11, 12, 13]
    ids = torch.tensor([prompt])
    expected = target.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=23)
    steps = 0
    with accelerator_path_on_cpu():
        for plan in plans:
            out = engine.generate(prompt, max_new_tokens=23, temperature=0, plan=plan)
            assert out.token_ids == expected[0, len(prompt) :].tolist(), plan
            steps += len(out.stats.accept_lengths)
    return engine, steps


@pytest.mark.parametrize("kind", ["model", "eagle"])
@pytest.mark.parametrize("family", list(_GREEDY_FAMILIES))
def test_the_engine_decodes_greedily_as_transformers_through_captured_policy_trees(monkeypatch, kind, family) -> None:
    """Greedy tokens equal transformers' with EAGLE-style trees with i.i.d. children grown in one replay (looks before
    the depth and at it), ``conf-delayed`` trees in two and lookup tries beside the draft's greedy chain in one, on the
    accelerator's path (cut at the budget's end too): every draft replayed, no capture failed."""
    plans, graphs = _GREEDY_FAMILIES[family]
    engine, steps = _greedy_through(monkeypatch, kind, plans)
    slot = engine._idle_slots["draft"][0]
    kinds = {k[2][0] for k in slot._drafts}
    assert slot.draft_failed is None and kinds == graphs, (slot.draft_failed, kinds)
    # every step a replay (two for conf-delayed) but each request's last, whose one token left needs no draft
    assert sum(g.graph.replays for g in slot._drafts.values()) >= steps - len(plans)


def test_the_engine_is_lossless_through_captured_lookup_paths(monkeypatch) -> None:
    """The same with lookup tries beside the draft's greedy path, its chain replayed at temperature 0 from its graph
    whatever the step's temperature, verified by NSS, on the accelerator's path."""
    from adaptive_spec.rng import accelerator_path_on_cpu

    with accelerator_path_on_cpu():
        assert _chi_square(_law_engine(monkeypatch), "lookup:1x2+m2/nss", 2000) > 1e-3


def test_the_engine_is_lossless_through_captured_eagle_trees(monkeypatch) -> None:
    """The joint law of the first 3 tokens is the target's (chi-square, 2000 seeded runs) with an EAGLE-style tree
    without replacement grown in one replay and verified by traversal, on the accelerator's path."""
    from adaptive_spec.rng import accelerator_path_on_cpu

    with accelerator_path_on_cpu():
        assert _chi_square(_law_engine(monkeypatch), "eagle:2:4:1:2:wor/traversal", 2000) > 1e-3


def test_the_engine_is_lossless_through_captured_iid_eagle_trees(monkeypatch) -> None:
    """The same with an EAGLE-style tree with i.i.d. children grown to its look in one replay and verified by
    SpecInfer on its draws table."""
    from adaptive_spec.rng import accelerator_path_on_cpu

    with accelerator_path_on_cpu():
        assert _chi_square(_law_engine(monkeypatch), "eagle:2:4:2:2/specinfer", 2000) > 1e-3


@pytest.mark.parametrize(
    "plan",
    ["eagle:2:4:1:2:wor/traversal", "iid:2x2/specinfer", "eagle:2:4:2:2/specinfer", "conf-delayed:2:0.3:2/traversal"],
)
def test_the_captured_tree_law_test_fails_for_draws_off_their_rows(monkeypatch, plan) -> None:
    """The negative control: uniforms to the fourth where the race needs exponentials or the inverse CDF uniforms
    (the children are then not draws from the rows reported) make the engine's law wrong through captured EAGLE-style
    trees (without replacement and with i.i.d. children) and static trees, and the same test says so."""
    from adaptive_spec.rng import accelerator_path_on_cpu

    real = runner.ModelRunner.captured_draft

    def uniform_noise(self, pending, depth, key, make, fill, block, cuts=True):
        spoiled = None if fill is None else (lambda e: e.uniform_().pow_(4))
        return real(self, pending, depth, key, make, spoiled, block, cuts)

    monkeypatch.setattr(runner.ModelRunner, "captured_draft", uniform_noise)
    with accelerator_path_on_cpu():
        assert _chi_square(_law_engine(monkeypatch), plan, 2000) < 1e-6


@pytest.mark.parametrize("early", ["1", "0"])
def test_a_tree_with_a_child_of_probability_zero_is_grown_again_on_the_host(monkeypatch, early) -> None:
    """Rows with fewer positive entries than a node's width (a top-k processor) make the captured tree differ from
    the host path's: it is drawn again there from the same generator state, and the run's tokens are those of the
    engine without draft graphs, seed for seed. With the tree read after the target's pass is queued (``early``,
    the default), that pass is made again over the host's tree."""
    from adaptive_spec.rng import accelerator_path_on_cpu

    monkeypatch.setenv("ADAPTIVE_SPEC_EARLY_PASS", early)
    slots_as_on_cuda(monkeypatch)
    target = tiny_model("llama", vocab=V, eos=None, max_positions=512)
    engine = SpecEngine(target, perturbed(target, scale=0.2, seed=4))
    plan = "eagle:3:9:3:3:wor/traversal"
    real, made = drafting_attr("captured_eagle_tree"), []

    def grown(*args, **kwargs):
        out = real(*args, **kwargs)
        if isinstance(out, drafting.DeferredTree):  # what its read gives
            assert early == "1"

            def finish():
                made.append(out.finish())
                return made[-1]

            return dataclasses.replace(out, finish=finish)
        made.append(out)
        return out

    patch_drafting(monkeypatch, "captured_eagle_tree", grown)
    with accelerator_path_on_cpu():
        outs = []
        for on in (True, False):
            monkeypatch.setenv("ADAPTIVE_SPEC_DRAFT_GRAPHS", "1" if on else "0")
            engine._idle_slots = {"target": [], "draft": []}  # fresh slots, which read the setting
            outs.append([engine.generate([0, 9, 3], 16, temperature=1.0, top_k=2, plan=plan, seed=s) for s in range(3)])
    assert [o.token_ids for o in outs[0]] == [o.token_ids for o in outs[1]]
    # with draft graphs each run's first tree is grown again on the host, which then grows the rest; without, no tree
    # is tried in a replay (the level-by-level device drafter meets the same child, as before)
    assert [type(m).__name__ for m in made] == ["EagleTree"] * 3


# ---------------------------------------------------------------------- policy chains (conf-, cum-, learned-chain)

# per rule, the policy for the model's rows and for the head's (peaked): chains that stop and chains to the depth
_POLICY_CHAINS = {
    "conf": {"model": "conf-chain:5:0.12", "eagle": "conf-chain:5:0.9"},
    "cum": {"model": "cum-chain:5:0.0005", "eagle": "cum-chain:5:0.3"},
    "learned": {"model": "learned-chain:4:0.05", "eagle": "learned-chain:4:0.2"},
}


def _policy(rule: str, kind: str):
    from adaptive_spec.engine import Plan

    return Plan.parse(f"{_POLICY_CHAINS[rule][kind]}/block").policy  # learned-chain: the installed acceptance model


@pytest.mark.parametrize("kind", ["model", "eagle"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("rule", _POLICY_CHAINS)
def test_a_captured_policy_chain_is_the_host_chain_of_the_policy(monkeypatch, kind, temperature, rule) -> None:
    """From one generator state: the chain the host path grows with the policy itself (tokens, rows, fed nodes,
    levels; the look is the deepest), drafted in one replay and cut at the stop with one host read; the draft cache
    holds the pending rows and the fed nodes only (the rows past the stop dropped), its block rows the host path's;
    over steps with commits between, chains that stop and chains that run to the depth."""
    from adaptive_spec.engine.drafting import draft_policy_tree
    from tests.helpers.reads import counted_reads

    (captured, eager), token_ids = _runners(kind, monkeypatch, init=0.3)
    probs_fn = _probs_fn(temperature, token_ids)
    policy = _policy(rule, kind)
    feats = torch.randn(80, 32, generator=torch.Generator().manual_seed(3))
    prompt = torch.tensor([0, 5, 9, 3, 7, 11])
    depths = []
    with torch.inference_mode():
        for r in (captured, eager):
            if kind == "eagle":
                r.set_target_features(0, feats[:5])
            r.chain_forward(prompt[:3], logits_to_keep=1)
        context = prompt.tolist()
        for step in range(8):
            pending = torch.tensor(context[captured.cached :])
            g = [torch.Generator().manual_seed(step) for _ in range(2)]
            with counted_reads() as reads:
                a = draft_policy_tree(captured, pending, policy, probs_fn, g[0], temperature == 0, on_device=True)
            b = draft_policy_tree(eager, pending, policy, probs_fn, g[1], temperature == 0, on_device=False)
            assert reads == ([1] if policy.depth > 1 else [])  # the stop's one read
            assert a.tree.tokens == b.tree.tokens and a.tree.parents == b.tree.parents
            torch.testing.assert_close(a.tree.draft_probs, b.tree.draft_probs, rtol=1e-5, atol=1e-6)
            assert (a.fed_nodes, a.policy_levels, a.pending_fed) == (b.fed_nodes, b.policy_levels, len(pending))
            assert captured.length == eager.length == captured.cached + len(pending) + a.fed_nodes - 1
            block = slice(captured.cached, captured.length)
            kv_a, kv_b = (r.slot.kv.buffer[:, :, block] for r in (captured, eager))
            torch.testing.assert_close(kv_a, kv_b, rtol=1e-5, atol=1e-5)
            assert sum(g.graph.replays for g in captured.slot._drafts.values()) == step + 1
            depth = a.tree.num_nodes - 1
            depths.append(depth)
            accept = min(depth, step % 3)
            context = _commit_chain((captured, eager), kind, feats, context, a.tree.tokens, accept, depth, step + 20)
    assert captured.slot.draft_failed is None and not eager.slot._drafts
    if temperature > 0:  # both cases met: chains cut at a stop, and chains to the depth
        assert min(depths) < policy.depth and policy.depth in depths, depths


def test_the_engine_is_lossless_through_captured_policy_chains(monkeypatch) -> None:
    """The joint law of the first 3 tokens is the target's (chi-square, 2000 seeded runs) with a path-probability
    chain drafted in one replay and cut at its stop (a third are: the first node's draft probability decides), verified
    by the block verifier, on the accelerator's path."""
    from adaptive_spec.rng import accelerator_path_on_cpu

    real, cuts = runner.ModelRunner.cut_block, []
    monkeypatch.setattr(runner.ModelRunner, "cut_block", lambda self, rows: cuts.append(rows) or real(self, rows))
    with accelerator_path_on_cpu():
        assert _chi_square(_law_engine(monkeypatch), "cum-chain:3:0.2/block", 2000) > 1e-3
    assert len(cuts) > 400


def test_the_captured_policy_chain_law_test_fails_for_draws_off_their_rows(monkeypatch) -> None:
    """The negative control: the same captured path-probability chains with tokens not drawn from the rows they report
    (each uniform cubed) make the engine's law wrong, and the same test says so."""
    from adaptive_spec.rng import accelerator_path_on_cpu

    real = drafting_attr("inverse_cdf_from")
    patch_drafting(monkeypatch, "inverse_cdf_from", lambda rows, u: real(rows, u**3))
    with accelerator_path_on_cpu():
        assert _chi_square(_law_engine(monkeypatch), "cum-chain:3:0.2/block", 2000) < 1e-6


@pytest.mark.parametrize("kind", ["model", "eagle"])
def test_the_engine_decodes_greedily_as_transformers_through_captured_policy_chains(monkeypatch, kind) -> None:
    """Greedy tokens equal transformers' with policy chains drafted in one replay and cut at their stops (the draft
    cache keeps the fed nodes only), on the accelerator's path: the target itself as the draft and an EAGLE head."""
    from adaptive_spec.rng import accelerator_path_on_cpu

    slots_as_on_cuda(monkeypatch)
    target = tiny_model("llama", vocab=V, eos=None, max_positions=512)
    draft = _head(target, 0.3) if kind == "eagle" else perturbed(target, scale=0.05, seed=2)
    engine = SpecEngine(target, draft)
    real, cuts = runner.ModelRunner.cut_block, []
    monkeypatch.setattr(runner.ModelRunner, "cut_block", lambda self, rows: cuts.append(rows) or real(self, rows))
    prompt = [0, 9, 3, 4, 11, 12, 13]
    ids = torch.tensor([prompt])
    expected = target.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=30)
    with accelerator_path_on_cpu():
        plans = ("conf-chain:5:0.2/block", "conf-chain:5:0.9/block", "cum-chain:6:0.01/greedy", "cum-chain:6:0.3/block")
        for plan in (*plans, "learned-chain:4:0.1/block"):  # thresholds for the model's rows and the head's
            out = engine.generate(prompt, max_new_tokens=30, temperature=0, plan=plan)
            assert out.token_ids == expected[0, len(prompt) :].tolist(), plan
    slot = engine._idle_slots["draft"][0]
    assert slot.draft_failed is None and sum(g.graph.replays for g in slot._drafts.values()) > 10
    assert cuts  # some chains stopped before their depth


# ---------------------------------------------------------------------- hybrid drafts (a looked-up run, then a chain)


@pytest.mark.parametrize("kind", ["model", "eagle"])
def test_hybrid_drafts_capture_their_chain_after_the_looked_up_run(monkeypatch, kind) -> None:
    """A model's hybrid step feeds its looked-up run as pending tokens of the chain's replay (buckets past a model's 2
    pending rows); an EAGLE-style head's takes the run one token at a time (no target features for them) in the
    chain's replay, the run's tokens carried in the graph's noise (one graph per run length). Greedy tokens equal
    transformers', and a sampled run's tokens and accepted lengths are those of the engine without draft graphs,
    seed for seed (the chain's uniforms are the level-by-level drafter's)."""
    slots_as_on_cuda(monkeypatch)
    target = tiny_model("llama", vocab=V, eos=None, max_positions=512)
    engine = SpecEngine(target, _head(target, 0.3) if kind == "eagle" else perturbed(target, scale=0.05, seed=2))
    prompt = [0, 9, 3, 4, 11, 12, 13, 9, 3, 4, 11, 12, 13, 9, 3]  # repeats: the lookup finds runs
    ids = torch.tensor([prompt])
    expected = target.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=24)
    out = engine.generate(prompt, max_new_tokens=24, temperature=0, plan="hybrid:4:2/block")
    assert out.token_ids == expected[0, len(prompt) :].tolist()
    if kind == "eagle":
        runs = {k[2][1] for k in engine._idle_slots["draft"][0]._drafts if k[2][0] == "hybrid"}
        assert runs and max(runs) > 1, runs  # looked-up runs of several lengths, each its graph
    sampled = []
    for on in (True, False):
        monkeypatch.setenv("ADAPTIVE_SPEC_DRAFT_GRAPHS", "1" if on else "0")
        engine._idle_slots = {"target": [], "draft": []}  # fresh slots, which read the setting
        sampled.append([engine.generate(prompt, 24, temperature=1.0, plan="hybrid:4:2/block", seed=s) for s in (0, 1)])
        slot = engine._idle_slots["draft"][0]
        if not on:
            assert not slot._drafts
        elif kind == "eagle":
            hybrid = sum(g.graph.replays for k, g in slot._drafts.items() if k[2][0] == "hybrid")
            assert slot.draft_failed is None and hybrid >= 2, slot.draft_failed
        else:  # the looked-up runs fed in the chain's replay: more pending rows than a chain step's
            assert slot.draft_failed is None and max(k[0] for k in slot._drafts) >= 4
            assert sum(g.graph.replays for g in slot._drafts.values()) >= sum(o.stats.steps for o in sampled[0]) // 2
    assert [o.token_ids for o in sampled[0]] == [o.token_ids for o in sampled[1]]
    assert [o.stats.accept_lengths for o in sampled[0]] == [o.stats.accept_lengths for o in sampled[1]]


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_an_eagle_heads_captured_hybrid_draft_is_the_level_by_level_draft(monkeypatch, temperature) -> None:
    """An EAGLE-style head's hybrid draft in one replay (the looked-up run fed a token at a time, then the chain) is
    the level-by-level draft from one generator state: looked-up runs of 4, 3, 2 and 1 tokens and none, the same tree,
    rows and block rows (:func:`_trees_against_level_by_level`, on the CPU's path: the captured chain's uniforms are
    its draws)."""
    from adaptive_spec.engine.drafting import draft_hybrid
    from adaptive_spec.trees.lookup import NgramIndex

    contexts = [[5, 9, 3, 7, 11, 5, 9], [5, 9, 3, 5, 9], [3, 6, 3], [1, 2, 3, 4, 5, 6, 7, 1, 2], [8, 6], [3, 8, 3]]
    contexts = [NgramIndex(c) for c in contexts]
    calls = []

    def draft_one(r, pending, probs_fn, g, greedy):
        calls.append(1)
        return draft_hybrid(r, pending, contexts[(len(calls) - 1) // 2], 4, 2, probs_fn, g, greedy)

    _trees_against_level_by_level(
        monkeypatch, "eagle", temperature, draft_one, [2, 0, 5, 1, 0, 3], 0.3, accelerator=False
    )


# ---------------------------------------------------------------------- conf-delayed (a confident trunk, then paths)

_CONF_DELAYED = [  # policies for the model's rows and the head's (peaked): paths that go on, and that may stop
    ("model", "conf-delayed:4:0.12:2"),
    ("model", "conf-delayed:4:0.12:2:0.1"),
    ("eagle", "conf-delayed:4:0.6:2"),
]


@pytest.mark.parametrize(("kind", "plan"), _CONF_DELAYED)
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_captured_conf_delayed_tree_is_the_level_by_level_tree(monkeypatch, kind, plan, temperature) -> None:
    """A ``conf-delayed`` tree in two replays (its trunk to the look, read once, then the paths after the trunk fed
    again) is the level-by-level drafter's tree on the accelerator's path (:func:`_trees_against_level_by_level`):
    trunks of several lengths, paths that go on and paths that may stop (a branch threshold)."""
    from adaptive_spec.engine.drafting import draft_policy_tree
    from adaptive_spec.trees.policy import parse_policy

    policy = parse_policy(plan)
    trunks = []

    def draft_one(r, pending, probs_fn, g, greedy):
        out = draft_policy_tree(r, pending, policy, probs_fn, g, greedy)
        trunks.append(out.policy_levels - 1)
        return out

    init = 0.3 if kind == "eagle" else None
    _trees_against_level_by_level(monkeypatch, kind, temperature, draft_one, [2, 0, 3, 1, 1, 0, 2, 1], init, replays=2)
    assert len(set(trunks)) > 1, trunks


def test_the_engine_is_lossless_through_captured_conf_delayed_trees(monkeypatch) -> None:
    """The joint law of the first 3 tokens is the target's with ``conf-delayed`` trees in two replays, verified by
    traversal."""
    from adaptive_spec.rng import accelerator_path_on_cpu

    with accelerator_path_on_cpu():
        assert _chi_square(_law_engine(monkeypatch), "conf-delayed:2:0.3:2/traversal", 2000) > 1e-3


# ---------------------------------------------------------------------- what a CUDA graph cannot record


@pytest.mark.parametrize("unrecordable", ["item", "multinomial", "mask", "tolist", "factory"])
def test_the_stand_in_graph_refuses_what_a_cuda_graph_cannot_record(monkeypatch, unrecordable) -> None:
    """The stand-in graph runs every recorded function under tests.helpers.graphs.CaptureGuard, so that the tests of
    this file fail where a real capture would: a chain core that reads the host, draws, or indexes by a boolean mask
    fails to capture (one logged line, the chain drafted level by level), where the real core captures (asserted
    throughout: ``draft_failed is None``)."""
    real = drafting_attr("inverse_cdf_from")

    def spoiled(rows, u):
        if unrecordable == "item":
            u = u * float(rows.amax().item())
        elif unrecordable == "multinomial":
            torch.multinomial(rows, 1)
        elif unrecordable == "mask":
            u = u + rows[rows > 2.0].sum()
        elif unrecordable == "factory":  # on CUDA a host tensor
            u = u + torch.zeros(1, dtype=u.dtype)
        else:
            u = u + sum(rows[0, :1].tolist())
        return real(rows, u)

    (captured, _), _ = _runners("model", monkeypatch)
    patch_drafting(monkeypatch, "inverse_cdf_from", spoiled)
    with torch.inference_mode():
        captured.chain_forward(torch.tensor([0, 5, 9]), logits_to_keep=1)
        g = torch.Generator().manual_seed(0)
        out = draft_tree(captured, torch.tensor([4]), TreeShape.chain(3), _probs_fn(1.0, None), g, False)
    assert "a CUDA graph cannot record it" in captured.slot.draft_failed and not captured.slot._drafts
    assert out.tree.num_nodes == 4  # drafted level by level


def test_the_stand_in_replays_the_recorded_ops_with_the_values_they_were_recorded_with() -> None:
    """As a CUDA graph's kernels: a Python value the recorded function read is baked in, and the tensors it read and
    wrote are the same tensors at every replay (written in place, they are read afresh; replaced by a new tensor, the
    replay still reads the old one, and refuses once nothing else keeps it, where a graph would read freed memory).
    The other stand-in, which runs the function again, reads both afresh."""
    from types import SimpleNamespace

    from adaptive_spec.bench import stand_in

    slot = SimpleNamespace(kv=SimpleNamespace(attention_form="sdpa"))
    # after recording, then after each of two replays: the cache and the output. The recorded ops' recording runs the
    # function twice (a warm-up, as a capture's on CUDA, then the recorded call), the other stand-in once.
    want = {stand_in.record_ops: [([2.0, 2.0, 0.0], 8.0), ([5.0, 5.0, 0.0], 20.0), ([8.0, 8.0, 0.0], 32.0)]}
    want[stand_in.record_eagerly] = [([1.0, 1.0, 0.0], 4.0), ([31.0, 31.0, 0.0], 124.0), ([531.0, 531.0, 0.0], 2124.0)]
    for record, (recorded, *after) in want.items():
        state, cache = {"scale": 1.0, "x": torch.ones(2)}, torch.zeros(3)

        def run(state=state, cache=cache):
            cache[:2].add_(state["x"] * state["scale"])
            return (cache.sum()[None] * 2,)

        graph, (out,) = record(slot, run)
        assert (cache.tolist(), out.item()) == recorded, record
        state["x"].fill_(3.0)  # written in place: every replay reads it
        state["scale"] = 10.0  # a Python value: baked into the recorded ops
        graph.replay()
        assert (cache.tolist(), out.item()) == after[0], record
        kept, state["x"] = state["x"], torch.full((2,), 50.0)  # a new tensor: the recorded ops read the old one
        graph.replay()
        assert (cache.tolist(), out.item()) == after[1], record
        del kept  # the old tensor freed: a graph would read its freed memory, the recorded ops refuse to
        if record is stand_in.record_ops:
            with pytest.raises(AssertionError, match="a tensor a captured function read is gone"):
                graph.replay()


@pytest.mark.parametrize("record", ["ops", "eagerly"])
def test_a_draft_core_reading_the_hosts_state_differs_from_level_by_level_only_when_the_ops_replay(
    monkeypatch, record
) -> None:
    """The negative control of the recorded ops: a chain core that takes its positions from the runner's length (a
    Python int the host moves each step, which a CUDA graph bakes in at its capture) instead of the graph's inputs
    drafts rows other than the level-by-level drafter's after the first step, where its graph replays the recorded
    ops, and the same rows where the stand-in runs the function again (which would hide it)."""
    real = runner.ModelRunner.root_stage

    def spoiled(self, ids, pos, mask, extra, rows, last):
        pos = torch.arange(pos.numel(), device=pos.device) + self.length  # the host's length at the replay
        return real(self, ids, pos, mask, extra, rows, last)

    monkeypatch.setattr(runner.ModelRunner, "root_stage", spoiled)
    (captured, eager), _ = _runners("model", monkeypatch, record=record_ops if record == "ops" else record_eagerly)
    probs_fn = _probs_fn(1.0, None)
    same = []
    with torch.inference_mode():
        for r in (captured, eager):
            r.chain_forward(torch.tensor([0, 5, 9]), logits_to_keep=1)
        context = [0, 5, 9, 3]
        for step in range(4):
            pending = torch.tensor(context[captured.cached :])
            a, b = (
                draft_tree(r, pending, TreeShape.chain(3), probs_fn, torch.Generator().manual_seed(step), False)
                for r in (captured, eager)
            )
            same.append(torch.allclose(a.tree.draft_probs, b.tree.draft_probs, rtol=1e-5, atol=1e-6))
            context = _commit_chain((captured, eager), "model", None, context, a.tree.tokens, 1, 3, step + 20)
    assert sum(g.graph.replays for g in captured.slot._drafts.values()) == 4 and captured.slot.draft_failed is None
    assert same[0]  # the capture's own step: the baked length is this step's
    assert all(same) == (record == "eagerly")


# ---------------------------------------------------------------------- static trees (i.i.d., delayed, wor)

_STATIC = (
    "iid:3x4/specinfer",
    "delayed:1x3x2/traversal",
    "wor:2x2x1/rrsw",
    "delayed:2x2x2/specinfer",
    "iid:2x10/traversal",
)


@pytest.mark.parametrize("kind", ["model", "eagle"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("plan", _STATIC)
def test_a_captured_static_tree_is_the_level_by_level_tree(monkeypatch, kind, temperature, plan) -> None:
    """A static tree drafted in one replay is the tree drafted level by level (:func:`_trees_against_level_by_level`;
    a head with peaked rows, whose rows agree to 1e-4)."""
    from adaptive_spec.engine import Plan

    shape = Plan.parse(plan).shape

    def draft_one(r, pending, probs_fn, g, greedy):
        return draft_tree(r, pending, shape, probs_fn, g, greedy)

    _trees_against_level_by_level(monkeypatch, kind, temperature, draft_one, [2, 0, 1, 2], init=0.3, tol=1e-4)


@pytest.mark.parametrize("kind", ["model", "eagle"])
def test_the_engine_decodes_greedily_as_transformers_through_captured_static_trees(monkeypatch, kind) -> None:
    """Greedy tokens equal transformers' with static trees drafted in one replay (cut at the budget's end too)."""
    engine, _ = _greedy_through(monkeypatch, kind, _STATIC)
    slot = engine._idle_slots["draft"][0]
    assert slot.draft_failed is None and sum(g.graph.replays for g in slot._drafts.values()) > 10
    assert {k[2][0] for k in slot._drafts} == {"slots", "chain"}  # a delayed tree cut at the budget: a chain
    assert max(k[1] for k in slot._drafts) == 10 > DRAFT_DEPTH  # a static tree deeper than a chain's graphs go


def test_the_engine_is_lossless_through_captured_static_trees(monkeypatch) -> None:
    """The joint law of the first 3 tokens is the target's (chi-square, 2000 seeded runs) with i.i.d. trees drafted in
    one replay and verified by SpecInfer, then trees without replacement verified by traversal, on the accelerator's
    path."""
    from adaptive_spec.rng import accelerator_path_on_cpu

    with accelerator_path_on_cpu():
        engine = _law_engine(monkeypatch)
        assert _chi_square(engine, "iid:2x2/specinfer", 2000) > 1e-3
        assert _chi_square(engine, "wor:2x2/traversal", 2000) > 1e-3


def test_a_captured_tree_is_read_after_the_target_pass_is_queued(monkeypatch) -> None:
    """With ``early_pass`` (the default) an EAGLE-style tree grown in one replay is read after the target's pass over
    it is queued, so that on a GPU the pass runs while the host reads and builds the tree; the tokens are those of
    the same engine reading first (``ADAPTIVE_SPEC_EARLY_PASS=0``), seed for seed, at both temperatures."""
    from adaptive_spec.rng import accelerator_path_on_cpu

    slots_as_on_cuda(monkeypatch)
    target = tiny_model("llama", vocab=V, eos=None, max_positions=512)
    engine = SpecEngine(target, _head(target, 0.3))
    events: list[str] = []
    real_read, real_block = drafting_attr("eagle_outcome"), runner.ModelRunner.block_forward

    def read(*args, **kwargs):  # the tree's read and the host's work on it
        events.append("read")
        return real_read(*args, **kwargs)

    def block(self, *args, **kwargs):
        if not isinstance(self, EagleRunner):  # the target's pass (the head's levels are in its replay)
            events.append("pass")
        return real_block(self, *args, **kwargs)

    patch_drafting(monkeypatch, "eagle_outcome", read)
    monkeypatch.setattr(runner.ModelRunner, "block_forward", block)
    outs, orders = {}, {}
    with accelerator_path_on_cpu():
        for early in ("1", "0"):
            monkeypatch.setenv("ADAPTIVE_SPEC_EARLY_PASS", early)
            engine._idle_slots = {"target": [], "draft": []}  # fresh slots, which read the setting
            events.clear()
            outs[early] = [
                engine.generate([0, 9, 3], 20, temperature=t, plan="eagle:4:8:3:2:wor/traversal", seed=s).token_ids
                for t in (0.0, 1.0)
                for s in range(2)
            ]
            orders[early] = list(events)
    assert outs["1"] == outs["0"]
    early_order, late_order = orders["1"], orders["0"]
    assert early_order.count("read") > 8 and early_order[:2] == ["pass", "read"]
    assert all(a == "pass" for a, b in itertools.pairwise(early_order) if b == "read")
    assert late_order.count("read") == early_order.count("read") and late_order[:2] == ["read", "pass"]
