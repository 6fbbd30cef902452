"""The engine and the verifiers on a CUDA device (``pytest -m gpu``; skipped without CUDA).

What runs here runs on the CPU elsewhere in the suite; these tests check that the CUDA paths
give the same results: tree logits, greedy decoding, the verifiers' sampling laws with a CUDA
generator, and the engine driven by the learned selector.
"""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from adaptive_spec.analysis.exact import fixed_tree_law, target_rows
from adaptive_spec.engine import SpecEngine
from adaptive_spec.engine.runner import ModelRunner
from adaptive_spec.trees import DraftLaw, TreeShape, ancestor_matrix, sample_tree
from adaptive_spec.verifiers import REGISTRY, verify
from tests.helpers.tiny import perturbed, tiny_model, tiny_tokenizer

pytestmark = pytest.mark.gpu
CUDA = torch.device("cuda")

# bf16 has 8 bits of mantissa: tree and sequential logits differ by rounding of the same order
# as the logits' own bf16 resolution. Bound: |Δ| <= BF16_ATOL + BF16_RTOL * |logit|.
BF16_ATOL, BF16_RTOL = 0.06, 0.02


def _sequential(model, ids: list[int]) -> torch.Tensor:
    with torch.inference_mode():
        return model(input_ids=torch.tensor([ids], device=CUDA)).logits[0, -1].float()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_tree_logits_match_sequential_on_cuda(dtype):
    V = 64
    model = tiny_model("llama", vocab=V).to(CUDA, dtype)
    runner = ModelRunner(model)
    g = torch.Generator().manual_seed(0)
    context = [0, 5, 9, 3, 17]
    uniform = torch.full((V,), 1.0 / V)
    with torch.inference_mode():
        runner.chain_forward(torch.tensor(context[:-1], device=CUDA), logits_to_keep=1)
        tree = sample_tree(TreeShape.parse("delayed:1x3x2"), lambda _p: uniform, g)
        n, N = len(context), tree.num_nodes
        ids = torch.tensor([context[-1], *tree.tokens[1:]], device=CUDA)
        pos = (n - 1 + torch.tensor(tree.depths)).to(CUDA)
        anc = ancestor_matrix(tree.parents).to(CUDA)
        logits = runner.block_forward(ids, pos, anc, logits_to_keep=N).float()
    for node in range(N):
        expected = _sequential(model, context + list(tree.prefixes[node]))
        if dtype == torch.float32:
            torch.testing.assert_close(logits[node], expected, atol=1e-4, rtol=1e-4)
        else:
            assert ((logits[node] - expected).abs() <= BF16_ATOL + BF16_RTOL * expected.abs()).all(), node


def test_greedy_equals_target_generate_on_cuda():
    V = 48
    target = tiny_model("llama", vocab=V, eos=None).to(CUDA)
    draft = perturbed(target, scale=0.3).to(CUDA)
    engine = SpecEngine(target, draft)
    for prompt in ([0, 5, 6], [0, 9, 3, 4, 11], [0, 17]):
        ids = torch.tensor([prompt], device=CUDA)
        expected = target.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=16)
        expected = expected[0, len(prompt) :].tolist()
        plans = ("chain:4/block", "delayed:1x3x2/traversal", "wor:2x2x1/rrsw", "conf-chain:6:0.3/block")
        # an EAGLE tree with i.i.d. children and a conf-delayed trunk (and paths that may stop): decided on the
        # device, as the chain above
        for plan in (
            *plans,
            "eagle:4:12:3:2/traversal",
            "conf-delayed:4:0.3:2/traversal",
            "conf-delayed:4:0.9:2:0.5/specinfer",
        ):
            out = engine.generate(prompt, max_new_tokens=16, temperature=0, plan=plan)
            assert out.token_ids == expected, plan


def _softmax_rows(vocab: int, seed: int):
    def row(model: int, c: tuple[int, ...]) -> torch.Tensor:
        g = torch.Generator().manual_seed(hash((seed, len(c), *c)) % (2**31))
        base = torch.randn(vocab, generator=g, dtype=torch.float64) * 2
        return torch.softmax(base + model * torch.randn(vocab, generator=g, dtype=torch.float64), 0)

    return (lambda c: row(0, c)), (lambda c: row(1, c))


SHAPES = {
    DraftLaw.CHAIN: TreeShape.chain(3),
    DraftLaw.IID: TreeShape.iid(3, 2),
    DraftLaw.DELAYED: TreeShape.delayed(1, 2, 2),
    DraftLaw.WITHOUT_REPLACEMENT: TreeShape.without_replacement((3, 2)),
}


@pytest.mark.parametrize("name", [n for n, s in REGISTRY.items() if s.lossless and not s.greedy_only])
def test_verifier_laws_on_cuda_tensors_with_a_cuda_generator(name):
    from scipy.stats import chisquare

    target_fn, draft_fn = _softmax_rows(10, seed=3)
    law = max((x for x in SHAPES if x in REGISTRY[name].laws), key=lambda x: SHAPES[x].max_nodes)
    tree = sample_tree(SHAPES[law], draft_fn, torch.Generator().manual_seed(1))
    rows = target_rows(tree, target_fn)
    exact = Counter()
    for (node, _), prob in fixed_tree_law(REGISTRY[name].fn, tree, rows).items():
        exact[node] += prob
    cuda_tree = type(tree)(
        tree.tokens, tree.parents, tree.depths, tree.draft_probs.float().to(CUDA), tree.child_draws, tree.shape
    )
    cuda_rows = rows.float().to(CUDA)
    gen = torch.Generator(device=CUDA).manual_seed(7)
    n = 4000
    counts = Counter(verify(name, cuda_tree, cuda_rows, gen, check_inputs=False).node for _ in range(n))
    assert set(counts) <= set(exact)
    keys = [k for k in exact if exact[k] * n >= 5]
    obs = [counts.get(k, 0) for k in keys] + [n - sum(counts.get(k, 0) for k in keys)]
    exp = [exact[k] * n for k in keys] + [n - sum(exact[k] * n for k in keys)]
    if exp[-1] < 1e-9:
        obs, exp = obs[:-1], exp[:-1]
    assert chisquare(obs, exp).pvalue > 1e-3


def test_engine_with_the_selector_on_cuda(tmp_path):
    from adaptive_spec.formats.features import SCHEMA
    from adaptive_spec.selector.export import export_net
    from adaptive_spec.selector.model import SelectorNet
    from adaptive_spec.selector.runtime import AdaptivePlanner

    V = 48
    actions = ["chain:1/block", "chain:3/block", "iid:2x2/traversal", "wor:2x1/rrsw"]
    torch.manual_seed(0)
    net = SelectorNet(SCHEMA.num_scalar, len(actions), hidden_sizes=(32,)).eval()
    net.set_standardisation(torch.zeros(SCHEMA.num_scalar), torch.full((SCHEMA.num_scalar,), 0.3))
    export_net(net, tmp_path / "sel.onnx", actions=actions)
    target = tiny_model("llama", vocab=V, eos=None).to(CUDA)
    engine = SpecEngine(target, perturbed(target, scale=0.3).to(CUDA), tokenizer=tiny_tokenizer(V))
    planner = AdaptivePlanner(str(tmp_path / "sel.onnx"))
    plain = engine.generate([0, 5, 6, 7], max_new_tokens=30, temperature=0, plan=None)
    res = engine.generate([0, 5, 6, 7], max_new_tokens=30, temperature=0, plan=planner)
    assert res.token_ids == plain.token_ids and len(res.steps) > 0
    sampled = engine.generate([0, 5, 6, 7], max_new_tokens=30, temperature=1.0, plan=planner, seed=1)
    # the budget spent, or the tokenizer's <eos> drawn (a draw of the sampled run's law, not of this code)
    assert len(sampled.token_ids) == 30 or sampled.token_ids[-1] in engine.eos_token_ids
    assert len(sampled.steps) > 0


# ---------------------------------------------------------------------- static caches and captured forwards
def _graph_pair(V: int = 48):
    target = tiny_model("llama", vocab=V, eos=None, max_positions=512).to(CUDA)
    return target, perturbed(target, scale=0.3).to(CUDA)


# Plans whose target blocks (pending root + drafted nodes) fall in every bucket: 1 (plain decoding),
# 2, 4, 8, 16, 32 (chains), 64 and 128 (without-replacement trees of 37 and 73 nodes).
BUCKET_PLANS = (
    "autoregressive",
    "lookup:2x4+m3/nss",  # a trie with the draft's greedy path beside it, its tokens left on the device
    "lookup:2x4+m2x3/nss",  # and the draft's next best tokens at the root
    "chain:1/block",
    "chain:3/block",
    "chain:7/block",
    "chain:15/block",
    "chain:31/block",
    "wor:6x5/traversal",
    "wor:8x8/traversal",
)


@pytest.mark.parametrize("attention", ["", "sdpa", "matmul"], ids=["timed", "sdpa", "matmul"])
def test_greedy_equals_transformers_in_every_bucket_with_cuda_graphs(attention, monkeypatch):
    """Whichever attention form a bucket keeps (timed: the faster), or each alone (ADAPTIVE_SPEC_ATTENTION)."""
    from adaptive_spec.engine.graphs import BUCKETS

    monkeypatch.setenv("ADAPTIVE_SPEC_ATTENTION", attention)
    target, draft = _graph_pair()
    engine = SpecEngine(target, draft)
    assert engine.cuda_graphs
    for prompt in ([0, 5, 6], [0, 9, 3, 4, 11, 12, 13]):
        ids = torch.tensor([prompt], device=CUDA)
        expected = target.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=40)
        expected = expected[0, len(prompt) :].tolist()
        for plan in BUCKET_PLANS:
            out = engine.generate(prompt, max_new_tokens=40, temperature=0, plan=plan)
            assert out.token_ids == expected, plan
    slot = engine._idle_slots["target"][0]
    assert slot.failed is None
    assert set(BUCKETS) <= set(slot.captured), slot.captured
    assert set(slot.times) == set(slot.captured) and all(t > 0 for t in slot.times.values())  # timed when captured
    assert engine._idle_slots["draft"][0].captured and engine._idle_slots["draft"][0].failed is None
    from adaptive_spec.engine.decoder import attention_forms, split_form

    forms = set(attention_forms())  # each attention form (or the one asked for), projections split and fused
    assert len(forms) == (2 if attention else 4)
    assert not slot.form_failed and all(set(t) == forms for t in slot.form_times.values()), slot.form_times
    if attention:
        assert {split_form(f)[0] for f in slot.forms.values()} == {attention}


@pytest.mark.parametrize("how", ["in place", "replaced"])
@pytest.mark.parametrize("linears", ["split", "fused"])
def test_weights_changed_between_requests_decode_as_the_new_weights(how, linears, monkeypatch):
    """Weights written in place after a request (the slot serves on, its fused copies written again in place) or
    replaced (every graph on the old tensors: a new slot, captured again): the next request decodes greedily as
    transformers does with the new weights."""
    monkeypatch.setenv("ADAPTIVE_SPEC_LINEARS", linears)
    target, draft = _graph_pair()
    engine = SpecEngine(target, draft)
    prompt = [0, 9, 3, 4]
    ids = torch.tensor([prompt], device=CUDA)
    first = engine.generate(prompt, max_new_tokens=24, temperature=0, plan="chain:3/block")
    slot = engine._idle_slots["target"][0]
    assert slot.captured and all(f.endswith("+fused") == (linears == "fused") for f in slot.forms.values())
    target.load_state_dict(perturbed(target, scale=1.0, seed=7).state_dict(), assign=how == "replaced")
    expected = target.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=24)
    assert expected[0, 4:].tolist() != first.token_ids  # the new weights decode otherwise
    out = engine.generate(prompt, max_new_tokens=24, temperature=0, plan="chain:3/block")
    assert out.token_ids == expected[0, 4:].tolist()
    assert (engine._idle_slots["target"][0] is slot) == (how == "in place") and engine._idle_slots["target"][0].captured


def _captured_and_eager(compiled: bool = False):
    """A runner over a captured slot and one over an eager slot of the same target, both fed a 5-token context;
    the slot, and a 3-row block's ancestors (a root with two children, the second a sibling of the first)."""
    from adaptive_spec.engine.graphs import ModelSlot

    target, _ = _graph_pair()
    slot = ModelSlot(target, 64, graphs=True, compiled=compiled)
    runner = ModelRunner(target, slot=slot)
    eager = ModelRunner(target, slot=ModelSlot(target, 64, graphs=False))
    with torch.inference_mode():
        for r in (runner, eager):
            r.chain_forward(torch.tensor([0, 5, 9, 3, 7], device=CUDA), logits_to_keep=1)
    anc = torch.tensor([[1, 0, 0], [1, 1, 0], [1, 0, 1]], dtype=torch.bool, device=CUDA)
    return runner, eager, slot, anc


def test_padding_rows_write_only_scratch_rows():
    runner, eager, slot, anc = _captured_and_eager()
    with torch.inference_mode():
        # A 4-row block first (bucket 4, no padding), rolled back: the graph's 4th input row now holds
        # a real token, which the next 3-row block's padding row reads.
        four = torch.ones(4, 4, dtype=torch.bool, device=CUDA).tril_()
        runner.block_forward(torch.tensor([11, 12, 13, 14], device=CUDA), torch.arange(5, 9, device=CUDA), four, 4)
        runner.rollback(5)
        keys = slot.kv.keys[0]
        before = keys.clone()
        pos = torch.tensor([5, 6, 6], device=CUDA)
        ids = torch.tensor([7, 8, 9], device=CUDA)
        got = runner.block_forward(ids, pos, anc, logits_to_keep=3)  # 3 rows: bucket 4, one padding row
        want = eager.block_forward(ids, pos, anc, logits_to_keep=3)
    assert 4 in slot.captured
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    cap = slot.kv.capacity
    torch.testing.assert_close(keys[:, :, :5], before[:, :, :5])  # committed rows untouched
    torch.testing.assert_close(keys[:, :, 8:cap], before[:, :, 8:cap])  # nothing past the block's rows
    assert not torch.equal(keys[:, :, cap:], before[:, :, cap:])  # the padding row wrote a scratch row


def test_eagle_head_forwards_are_captured():
    from adaptive_spec.engine.eagle import EagleConfig, EagleHead

    target = tiny_model("llama", vocab=48, eos=None, max_positions=512)
    head = EagleHead(EagleConfig.for_target(target.config, draft_vocab_size=40)).eval()
    head.set_vocabulary(torch.arange(40))
    head.bind(target)
    engine = SpecEngine(target.to(CUDA), head.to(CUDA))
    prompt = [0, 5, 6, 7]
    ids = torch.tensor([prompt], device=CUDA)
    expected = target.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=24)
    plans = ("chain:4/block", "eagle:4:8:3:2:wor/traversal", "eagle:4:12:3:2/specinfer")
    for plan in (*plans, "conf-chain:5:0.2/block", "conf-delayed:4:0.3:2/traversal"):  # rows undone after a stop
        out = engine.generate(prompt, max_new_tokens=24, temperature=0, plan=plan)
        assert out.token_ids == expected[0, len(prompt) :].tolist(), plan
    slot = engine._idle_slots["draft"][0]
    assert slot.failed is None and slot.captured
    assert slot.draft_failed is None and any(g.graph for g in slot._drafts.values())  # chain:4 in one replay


def test_a_captured_tree_read_after_its_pass_gives_the_same_tokens_on_cuda(monkeypatch):
    """A queued read gives the values it was queued behind, not waiting for later work; an EAGLE-style tree read after
    the target's pass is queued (the default) gives the tokens of the tree read first, seed for seed, at T = 1."""
    from adaptive_spec.engine.drafting import QueuedRead
    from adaptive_spec.engine.eagle import EagleConfig, EagleHead

    values = torch.arange(7, device=CUDA)
    read = QueuedRead(values)
    later = torch.randn(1024, 1024, device=CUDA)
    _ = later @ later  # queued after the copy
    assert read.tolist() == list(range(7))
    target = tiny_model("llama", vocab=48, eos=None, max_positions=512)
    head = EagleHead(EagleConfig.for_target(target.config, draft_vocab_size=40)).eval()
    head.set_vocabulary(torch.arange(40))
    head.bind(target)
    engine = SpecEngine(target.to(CUDA), head.to(CUDA))
    outs = {}
    for early in ("1", "0"):
        monkeypatch.setenv("ADAPTIVE_SPEC_EARLY_PASS", early)
        engine._idle_slots = {"target": [], "draft": []}  # fresh slots, which read the setting
        plan = "eagle:4:8:3:2:wor/traversal"
        outs[early] = [engine.generate([0, 5, 6, 7], 24, temperature=1.0, plan=plan, seed=s) for s in range(3)]
        outs[early] = [out.token_ids for out in outs[early]]
        slot = engine._idle_slots["draft"][0]
        assert slot.early_pass == (early == "1") and any(g.graph for g in slot._drafts.values())
    assert outs["1"] == outs["0"]


def _chain_runners(kind: str):
    """Two runners of one draft on CUDA, the first's chains captured (ModelSlot.draft_graph), the second's not."""
    from adaptive_spec.engine.eagle import EagleConfig, EagleHead, EagleRunner
    from adaptive_spec.engine.graphs import ModelSlot

    target, draft = _graph_pair()
    if kind == "eagle":
        draft = EagleHead(EagleConfig.for_target(target.config, draft_vocab_size=40)).eval()
        draft.set_vocabulary(torch.arange(3, 43))
        draft = draft.bind(target).to(CUDA)
        return [EagleRunner(draft, slot=ModelSlot(draft, 64, graphs=True, drafts=c)) for c in (True, False)], draft
    return [ModelRunner(draft, slot=ModelSlot(draft, 64, graphs=True, drafts=c)) for c in (True, False)], draft


def _captured_against_level_by_level(kind: str, draft_one) -> None:
    """``draft_one(runner, pending, probs_fn, generator)`` on a runner whose drafts are captured and on one whose are
    not, after 1 and 3 pending tokens (a padding row) from one generator state each: the same tree and rows, no
    committed row written, the first's drafts in one replay."""
    from adaptive_spec.engine.logits import ProbsFn

    (captured, eager), draft = _chain_runners(kind)
    probs_fn = ProbsFn([], 48, one_hot=False, token_ids=draft.token_ids if kind == "eagle" else None)
    with torch.inference_mode():
        for r in (captured, eager):
            if kind == "eagle":  # the context's target features (the root's unknown, as in a step)
                r.set_target_features(0, torch.randn(4, 32, generator=torch.Generator().manual_seed(0)).to(CUDA))
            r.chain_forward(torch.tensor([0, 5, 9, 3], device=CUDA), logits_to_keep=1)
        for pending in ([7], [4, 6, 8]):
            outs = []
            for r in (captured, eager):
                r.rollback(4)
                before = r.slot.kv.buffer[:, :, :4].clone()
                g = torch.Generator(device=CUDA).manual_seed(0)
                outs.append(draft_one(r, torch.tensor(pending, device=CUDA), probs_fn, g))
                assert torch.equal(r.slot.kv.buffer[:, :, :4], before)
            assert outs[0].tree.tokens == outs[1].tree.tokens and outs[0].tree.parents == outs[1].tree.parents
            torch.testing.assert_close(outs[0].tree.draft_probs, outs[1].tree.draft_probs, rtol=1e-4, atol=1e-5)
    assert captured.slot.draft_failed is None and captured.slot._drafts and not eager.slot._drafts


@pytest.mark.parametrize("kind", ["model", "eagle"])
def test_a_captured_chain_is_the_level_by_level_chain_on_cuda(kind):
    """At T = 0 a chain drafted in one replay of its CUDA graph is the level-by-level chain."""
    from adaptive_spec.engine.drafting import draft_tree

    _captured_against_level_by_level(kind, lambda r, ids, p, g: draft_tree(r, ids, TreeShape.chain(4), p, g, True))


@pytest.mark.parametrize("kind", ["model", "eagle"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_captured_eagle_tree_is_the_level_by_level_tree_on_cuda(kind, temperature):
    """An EAGLE-style tree without replacement grown in one replay of its CUDA graph is the tree grown level by level
    on the device from one generator state (the race's exponentials drawn a level a call, as that drafter draws
    them)."""
    from adaptive_spec.engine.drafting import draft_policy_tree
    from adaptive_spec.trees.policy import EagleTree

    policy = EagleTree(depth=4, budget=10, top_k=3, width=2, without_replacement=True)
    _captured_against_level_by_level(
        kind, lambda r, ids, p, g: draft_policy_tree(r, ids, policy, p, g, temperature == 0)
    )


@pytest.mark.parametrize("kind", ["model", "eagle"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("width", [2, 1])
def test_a_captured_eagle_tree_with_iid_children_is_the_level_by_level_tree_on_cuda(kind, temperature, width):
    """An EAGLE-style tree with i.i.d. children grown to its look in one replay of its CUDA graph (the torch code's
    bookkeeping) is the device drafter's tree (its fused kernel where Triton runs) from one generator state (the
    uniforms, or the race's exponentials for one child, drawn a level a call)."""
    from adaptive_spec.engine.drafting import draft_policy_tree
    from adaptive_spec.trees.policy import EagleTree

    policy = EagleTree(depth=4, budget=9, top_k=2, width=width, without_replacement=False)
    _captured_against_level_by_level(
        kind, lambda r, ids, p, g: draft_policy_tree(r, ids, policy, p, g, temperature == 0)
    )


@pytest.mark.parametrize("kind", ["model", "eagle"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("policy", ["conf-delayed:4:0.05:2", "conf-delayed:4:0.05:2:0.02"])
def test_a_captured_conf_delayed_tree_is_the_level_by_level_tree_on_cuda(kind, temperature, policy):
    """A ``conf-delayed`` tree in two replays of its CUDA graphs (the trunk's, read once, then the paths') is the tree
    the device drafts level by level from one generator state."""
    from adaptive_spec.engine.drafting import draft_policy_tree
    from adaptive_spec.trees.policy import parse_policy

    rule = parse_policy(policy)
    _captured_against_level_by_level(kind, lambda r, ids, p, g: draft_policy_tree(r, ids, rule, p, g, temperature == 0))


@pytest.mark.parametrize("kind", ["model", "eagle"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("plan", ["iid:3x4/specinfer", "delayed:1x3x2/traversal", "wor:2x2x1/rrsw"])
def test_a_captured_static_tree_is_the_level_by_level_tree_on_cuda(kind, temperature, plan):
    """A static tree drafted in one replay of its CUDA graph is the tree drafted level by level on the device from one
    generator state (the race's exponentials drawn a level a call, as that drafter draws them)."""
    from adaptive_spec.engine import Plan
    from adaptive_spec.engine.drafting import draft_tree

    shape = Plan.parse(plan).shape
    _captured_against_level_by_level(kind, lambda r, ids, p, g: draft_tree(r, ids, shape, p, g, temperature == 0))


@pytest.mark.parametrize("kind", ["model", "eagle"])
def test_a_captured_policy_chain_is_the_host_chain_of_the_policy_on_cuda(kind):
    """At T = 0 a policy chain drafted in one replay of its CUDA graph and cut at its stop is the chain the host path
    grows with the policy (the runner without draft graphs grows it there)."""
    from adaptive_spec.engine.drafting import draft_policy_tree
    from adaptive_spec.trees.policy import parse_policy

    policy = parse_policy("conf-chain:5:0.05")

    def draft_one(r, ids, p, g):  # the runner without draft graphs: the host path
        return draft_policy_tree(r, ids, policy, p, g, True, on_device=None if r.captures_drafts else False)

    _captured_against_level_by_level(kind, draft_one)


def test_the_engine_is_lossless_through_captured_drafts_on_cuda():
    """The joint law of the first 3 tokens is the target's (chi-square, 1000 seeded runs at T = 0.9, top-k 6 each) with
    every chain drafted in one replay of its CUDA graph, its uniforms from the request's CUDA generator, then with an
    EAGLE-style tree grown so, then with i.i.d. trees, then with policy chains cut at their stops, then with lookup
    tries beside the draft's greedy path."""
    from adaptive_spec.engine.logits import SamplingConfig
    from tests.helpers import laws

    target = tiny_model("llama", vocab=8, hidden=16, eos=None, init_range=0.5, seed=11, layers=1)
    draft = perturbed(target, scale=0.3, seed=12)
    law = laws.exact_law(target, SamplingConfig(temperature=0.9, top_k=6), [3], 8)  # on the CPU, before the move
    engine = SpecEngine(target.to(CUDA), draft.to(CUDA))
    counts = torch.zeros(8, 8, 8, dtype=torch.long)
    for seed in range(1000):
        out = engine.generate([3], max_new_tokens=3, temperature=0.9, top_k=6, plan="chain:2/block", seed=seed)
        counts[tuple(out.token_ids)] += 1
    slot = engine._idle_slots["draft"][0]
    assert slot.draft_failed is None and slot._drafts
    assert laws.chi_square_pvalue(counts, law) > 1e-3
    counts.zero_()  # and through an EAGLE-style tree without replacement grown in one replay, verified by traversal
    for seed in range(1000):
        out = engine.generate(
            [3], max_new_tokens=3, temperature=0.9, top_k=6, plan="eagle:2:4:1:2:wor/traversal", seed=seed
        )
        counts[tuple(out.token_ids)] += 1
    assert any(k[2][0] == "eagle" for k in slot._drafts) and slot.draft_failed is None
    assert laws.chi_square_pvalue(counts, law) > 1e-3
    counts.zero_()  # and through i.i.d. trees drafted in one replay, verified by SpecInfer
    for seed in range(1000):
        out = engine.generate([3], max_new_tokens=3, temperature=0.9, top_k=6, plan="iid:2x2/specinfer", seed=seed)
        counts[tuple(out.token_ids)] += 1
    assert any(k[2][0] == "slots" for k in slot._drafts) and slot.draft_failed is None
    assert laws.chi_square_pvalue(counts, law) > 1e-3
    counts.zero_()  # and through path-probability chains drafted in one replay and cut at their stops
    for seed in range(1000):
        out = engine.generate([3], max_new_tokens=3, temperature=0.9, top_k=6, plan="cum-chain:3:0.2/block", seed=seed)
        counts[tuple(out.token_ids)] += 1
    assert slot.draft_failed is None
    assert laws.chi_square_pvalue(counts, law) > 1e-3
    counts.zero_()  # and through lookup tries with the draft's greedy path (its chain's graph at T = 0), by NSS
    for seed in range(1000):
        out = engine.generate([3], max_new_tokens=3, temperature=0.9, top_k=6, plan="lookup:1x2+m2/nss", seed=seed)
        counts[tuple(out.token_ids)] += 1
    assert slot.draft_failed is None
    assert laws.chi_square_pvalue(counts, law) > 1e-3


def test_compiled_forwards_match_eager_ones_and_compile_only_the_small_buckets_used():
    from adaptive_spec.engine.graphs import bucket_for

    runner, eager, slot, anc = _captured_and_eager(compiled=True)
    with torch.inference_mode():
        for ids, pos, mask in (
            (torch.tensor([7], device=CUDA), torch.tensor([5], device=CUDA), torch.ones(1, 1, dtype=torch.bool)),
            (torch.tensor([7, 8, 9], device=CUDA), torch.tensor([5, 6, 6], device=CUDA), anc),
        ):
            got = runner.block_forward(ids, pos, mask.to(CUDA), logits_to_keep=len(ids))
            want = eager.block_forward(ids, pos, mask.to(CUDA), logits_to_keep=len(ids))
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
            runner.rollback(5)
            eager.rollback(5)
        slot._fastest = lambda n: slot._compiled[bucket_for(n)]  # the compiled graphs, whichever is faster
        for ids, pos, mask in ((torch.tensor([7], device=CUDA), torch.tensor([5], device=CUDA), anc[:1, :1]),):
            got = runner.block_forward(ids, pos, mask, logits_to_keep=1)
            want = eager.block_forward(ids, pos, mask, logits_to_keep=1)
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert slot.failed is None and slot.compile_failed is None
    assert set(slot.compile_s) == set(slot.compiled_times) == {1, 4}  # the 5-row prefill's 8 is not compiled
    assert all(s > 0 for s in slot.compile_s.values())


def test_engine_with_compiled_forwards_decodes_greedily_as_transformers():
    target, draft = _graph_pair()
    engine = SpecEngine(target, draft, compile_forwards=True)
    prompt = [0, 9, 3, 4]
    ids = torch.tensor([prompt], device=CUDA)
    expected = target.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=16)
    out = engine.generate(prompt, max_new_tokens=16, temperature=0, plan="chain:3/block")
    assert out.token_ids == expected[0, len(prompt) :].tolist()
    slot = engine._idle_slots["target"][0]
    assert slot.compile_on and slot.failed is None
    times = engine.compile_times()
    assert 4 in times["target"] and set(times["target"]) <= {1, 2, 4} and times["draft"]  # chain:3 blocks: 4 rows
