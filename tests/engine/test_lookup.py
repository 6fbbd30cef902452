"""Lookup plans through the engine (``lookup:L/<verifier>``): greedy equality, the exact law, mixed with model steps."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from adaptive_spec.engine import SpecEngine
from adaptive_spec.engine.eagle import EagleConfig, EagleHead
from adaptive_spec.engine.logits import SamplingConfig
from adaptive_spec.planner.plan import Plan, StepResult, StepState, as_planner
from adaptive_spec.planner.sources import SourceRule, parse_source_rule
from adaptive_spec.rng import as_sampler
from adaptive_spec.trees.datastore import Datastore
from tests.helpers.laws import chi_square_pvalue, exact_law
from tests.helpers.tiny import perturbed, tiny_model

V = 8
SAMPLING = SamplingConfig(temperature=0.9, top_k=6, top_p=1.0)


class Alternate:
    """Lookup on even steps, the draft model on odd ones: pending tokens pile up in the draft's cache."""

    def __init__(self, model_plan: str, lookup_plan: str = "lookup:4/block") -> None:
        self.plans = [Plan.parse(lookup_plan), Plan.parse(model_plan)]

    def choose(self, state):
        return self.plans[state.step % 2]


def _eagle(target):
    cfg = EagleConfig.for_target(target.config, draft_vocab_size=target.config.vocab_size - 2, initializer_range=0.5)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(2)
    head = EagleHead(cfg).eval()
    head.set_vocabulary(torch.arange(2, target.config.vocab_size))
    return head


@pytest.mark.parametrize("draft", ["model", "eagle"])
@pytest.mark.parametrize(
    "plan",
    [
        "lookup:6/block",
        "lookup:3/token",
        "lookup:3x4/nss",
        "alternate",
        "source:chain:3/block",
        "hybrid:3:2/block",
        "lookup:1x4+2/nss",
        "lookup:0x4+2/greedy",
        "lookup:2x4+m3/nss",
        "lookup:1x4+2+m2/greedy",
        "lookup:2x4+m3x3/nss",
        "alternate-model-branch",
    ],
)
def test_greedy_equals_transformers(plan, draft) -> None:
    target = tiny_model("llama", vocab=8, hidden=16, eos=None, init_range=0.5, seed=11, layers=1)
    prompt = [3, 5, 2, 3, 5, 2, 3, 5]
    ref = target.generate(torch.tensor([prompt]), max_new_tokens=40, do_sample=False)[0, len(prompt) :].tolist()
    # a corpus of the target's greedy text after other prompts (and noise), for the plans that read one
    texts = [target.generate(torch.tensor([p]), max_new_tokens=30, do_sample=False)[0].tolist() for p in ([1, 4], [6])]
    store = Datastore.from_texts([*texts, [5, 2, 7, 7, 1]], 8)
    draft_model = perturbed(target, 0.3, 12) if draft == "model" else _eagle(target)
    engine = SpecEngine(target, draft_model, datastore=store if "+" in plan else None)
    # lookup steps (no draft forward) between steps whose trie has the draft's path: pending tokens pile up
    alternates = {"alternate": Alternate("chain:3/block"), "alternate-model-branch": Alternate("lookup:1x4+m3/nss")}
    out = engine.generate(prompt, max_new_tokens=40, temperature=0, plan=alternates.get(plan, plan))
    assert out.token_ids == ref
    assert sum(out.stats.accept_lengths) > 0  # looked-up tokens were accepted


@pytest.fixture(scope="module")
def engine():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    target = tiny_model("llama", vocab=V, hidden=16, eos=None, init_range=0.5, seed=11, layers=1)
    yield SpecEngine(target, perturbed(target, scale=0.3, seed=12))
    torch.set_num_threads(threads)


RUNS = 1000  # a law test through the engine; the exact tests by enumeration are the proof


@pytest.mark.parametrize(
    "plan",
    [
        "lookup:2/block",
        "lookup:2x2/nss",
        "alternate",
        "source",
        "hybrid:1:1/token",
        "hybrid-after-root",
        "corpus",
        "lookup:1x2+m2/nss",
        "lookup:1x2+m3x2/nss",
        "model-branch-after-root",
    ],
)
def test_lossless_lookup(engine, plan, monkeypatch) -> None:
    prompt = [3, 5, 3, 5]  # a repeat, so that the lookup proposes something
    if plan in ("lookup:2x2/nss", "lookup:1x2+m2/nss", "lookup:1x2+m3x2/nss", "model-branch-after-root"):
        prompt = [3, 5, 3, 6, 3]  # "3" recurs with two continuations: a trie 3 -> {6 3, 5 3}
    if plan == "corpus":  # the corpus's continuations of "6 3": a trie 3 -> {1 2, 4 4}, and the context's 3 -> 5 3
        monkeypatch.setattr(engine, "datastore", CORPUS)
        prompt, plan = [3, 5, 3, 6, 3], "lookup:1x2+2/nss"
    counts = torch.zeros(V, V, V, dtype=torch.long)
    proposed = 0
    for seed in range(RUNS):
        p = Alternate("wor:2x1/traversal", "lookup:2/block") if plan == "alternate" else plan
        p = SourceRule("wor:2x1/traversal", "lookup:2/block", min_ngram=1) if plan == "source" else p
        p = HybridWithFeatures() if plan == "hybrid-after-root" else p
        p = HybridWithFeatures("lookup:1x2+m2/nss") if plan == "model-branch-after-root" else p
        out = engine.generate(
            prompt, max_new_tokens=3, temperature=SAMPLING.temperature, top_k=SAMPLING.top_k, plan=p, seed=seed
        )
        counts[tuple(out.token_ids)] += 1
        proposed += out.stats.tree_sizes[0] > {"lookup:2x2/nss": 4, "lookup:1x2+2/nss": 6}.get(plan, 1)
    assert proposed == RUNS  # the first step always found "3 5 -> 3 5"
    assert chi_square_pvalue(counts, exact_law(engine.target, SAMPLING, prompt, V)) > 1e-3


CORPUS = Datastore.from_texts([[6, 3, 1, 2], [6, 3, 4, 4], [6, 3, 1, 7]], V)


def test_corpus_plans_need_a_datastore(engine) -> None:
    calls = []
    hook = engine.target.register_forward_hook(lambda *_: calls.append(1))
    try:  # a static plan is refused before the prompt is fed; a planner's choice at the step it makes it
        with pytest.raises(ValueError, match="drafts from a datastore and the engine has none") as err:
            engine.generate([3, 5, 3, 6, 3], max_new_tokens=3, plan="lookup:1x2+2/nss")
        assert "\n" not in str(err.value) and not calls
        with pytest.raises(ValueError, match="only lossless at temperature 0"):
            engine.generate([3, 5, 3, 6, 3], max_new_tokens=3, plan="chain:2/greedy", temperature=1.0)
        assert not calls
        with pytest.raises(ValueError, match="drafts from a datastore and the engine has none"):
            engine.generate([3, 5, 3, 6, 3], max_new_tokens=3, plan=HybridWithFeatures("lookup:1x2+2/nss"))
        assert calls  # the prefill ran: the planner chose the plan at the first step
    finally:
        hook.remove()
    with pytest.raises(ValueError, match="built for a vocabulary of 9 ids and the target has 8"):
        SpecEngine(engine.target, engine.draft, datastore=Datastore.from_texts([[1, 8]], 9))
    with pytest.raises(ValueError, match=r"^datastore nowhere\.npz not found"):
        SpecEngine(engine.target, engine.draft, datastore="nowhere.npz")


class HybridWithFeatures:
    """A hybrid plan (or another) played by a planner that asks for root features: the draft's first forward runs
    before the plan is chosen, and the lookup (or the draft's chain) goes on after it."""

    needs_features = True

    def __init__(self, plan: str = "hybrid:1:1/block") -> None:
        self.plan = Plan.parse(plan)

    def choose(self, state):
        assert state.features is not None
        return self.plan


def test_hybrid_plan_strings() -> None:
    plan = Plan.parse("hybrid:6:2/block")
    assert plan.source == "hybrid" and plan.lookup_depth == 6 and plan.shape.depth == 8
    assert str(plan) == "hybrid:6:2/block" and Plan.parse(str(plan)) == plan
    assert str(plan.truncated(5)) == "hybrid:4:1/block" and str(plan.truncated(1)) == "chain:1/block"
    for bad in ("hybrid:0:2/block", "hybrid:2:0/block", "hybrid:2/block", "hybrid:a:b/block"):
        with pytest.raises(ValueError, match="hybrid:A:B"):
            Plan.parse(bad)
    with pytest.raises(ValueError, match="is not lossless"):
        Plan.parse("hybrid:2:2/hsd")


def test_lookup_plan_strings() -> None:
    plan = Plan.parse("lookup:8/block")
    assert plan.source == "lookup" and plan.shape.depth == 8 and str(plan) == "lookup:8/block"
    assert str(plan.truncated(3)) == "lookup:3/block"
    # the draft's greedy chain as one more path of a trie: NSS by default, D <= L, cut with the trie
    plan = Plan.parse("lookup:3x8+2+m3")
    assert (plan.verifier, plan.shape.paths, plan.shape.depth) == ("nss", 6, 8)
    assert (plan.corpus_paths, plan.model_depth) == (2, 3)
    assert str(plan) == "lookup:3x8+2+m3/nss" and Plan.parse(str(plan)) == plan
    assert str(plan.truncated(2)) == "lookup:3x2+2+m2/nss" and str(Plan.parse("lookup:8+m4/nss")) == "lookup:1x8+m4/nss"
    assert str(Plan.parse("lookup:0x3+m3/greedy").truncated(1)) == "lookup:0x1+m1/greedy"
    for bad in ("lookup:3x4+m5/nss", "lookup:3x4+m0/nss", "lookup:3x4+mx/nss", "lookup:3x4+1+2+m1/nss"):
        with pytest.raises(ValueError, match=r"with \+mD for the draft model's greedy chain of 1 <= D <= L tokens"):
            Plan.parse(bad)
    with pytest.raises(ValueError, match="is not lossless"):
        Plan.parse("lookup:3x4+m2/block")
    # and the draft's top A tokens at the root, the first continued: one more path each
    plan = Plan.parse("lookup:3x8+2+m3x3")
    assert (plan.shape.paths, plan.model_depth, plan.model_width) == (8, 3, 3) and str(plan) == "lookup:3x8+2+m3x3/nss"
    assert Plan.parse(str(plan)) == plan and str(plan.truncated(2)) == "lookup:3x2+2+m3x2/nss"
    assert Plan.parse("lookup:3x8+m1x3") == Plan.parse("lookup:3x8+m3") and str(Plan.parse("lookup:0x2+m2x1")) == (
        "lookup:0x2+m2x1/nss"
    )
    for width in ("3", 0):  # a one-line error, not a TypeError from the paths' sum
        with pytest.raises(ValueError, match="model_width is the draft's top A >= 1 tokens"):
            dataclasses.replace(plan, model_width=width)
    for bad in ("lookup:3x4+m0x3/nss", "lookup:3x4+mx3/nss", "lookup:3x4+m2x5/nss"):
        with pytest.raises(ValueError, match=r"or \+mAxD for its top A tokens at the root"):
            Plan.parse(bad)
    with pytest.raises(ValueError, match="a chain of L >= 1 tokens"):
        Plan.parse("lookup:x/block")
    with pytest.raises(ValueError, match="is not lossless"):
        Plan.parse("lookup:4/hsd")


def _state(step: int, lookup: list[int], ngram: int) -> StepState:
    return StepState(step, 10, step, 50, 1.0, lookup=lookup, lookup_ngram=ngram)


def test_source_rule_choices() -> None:
    rule = as_planner("source:chain:2/block")
    assert isinstance(rule, SourceRule) and rule.needs_lookup and str(rule) == "source:chain:2/block"
    assert str(rule.choose(_state(0, [4, 5, 6], 2))) == "lookup:3/block"  # a recurring bigram: look it up
    assert str(rule.choose(_state(1, [4, 5, 6], 1))) == "chain:2/block"  # a repeated token only: the model
    assert str(rule.choose(_state(1, [], 0))) == "chain:2/block"
    long = [1] * 20
    assert str(rule.choose(_state(1, long, 3))) == "lookup:8/block"  # at most lookup_depth tokens
    # Looked-up tokens rejected twice: the running rate (1 -> 0.5 -> 0.25) falls below 0.3, so the model drafts.
    for _ in range(2):
        rule.observe(StepResult(Plan.parse("lookup:4/block"), 5, 0, (7,), False))
    assert rule.rate == pytest.approx(0.25)
    assert str(rule.choose(_state(2, [4, 5, 6], 3))) == "chain:2/block"
    assert str(rule.choose(_state(0, [4, 5, 6], 3))) == "lookup:3/block"  # a new generation starts afresh
    with pytest.raises(ValueError, match="must draft from the model"):
        as_planner("source:lookup:4/block")
    trie = as_planner("source:chain:2/block+lookup:3x6/nss")
    assert str(trie) == "source:chain:2/block+lookup:3x6/nss"
    assert str(trie.choose(_state(0, [4, 5], 2))) == "lookup:3x6/nss"  # the engine finds the trie's candidates
    hybrid = as_planner("source:chain:2/block+hybrid:6:2/block")
    assert str(hybrid.choose(_state(0, [4, 5, 6], 2))) == "hybrid:3:2/block"  # the run found, then 2 model tokens
    assert str(hybrid.choose(_state(1, [1] * 20, 3))) == "hybrid:6:2/block"
    hybrid.observe(StepResult(Plan.parse("hybrid:6:2/block"), 9, 8, (7,) * 9, False))  # all 6 looked up accepted
    assert hybrid.rate == 1.0
    with pytest.raises(ValueError, match="lookup plan must be"):
        as_planner("source:chain:2/block+chain:3/block")
    with pytest.raises(ValueError, match="not a source rule"):
        parse_source_rule("chain:2/block")
    # lookups match n-grams of at most 3 tokens: a longer min_ngram would never look up
    assert str(as_planner("source:chain:2/block?min_ngram=3").choose(_state(1, [4, 5], 3))) == "lookup:2/block"
    for bad in ("source:chain:2/block?min_ngram=4", "source:chain:2/block?min_ngram=0"):
        with pytest.raises(ValueError, match="min_ngram must be an integer from 1 to 3") as err:
            as_planner(bad)
        assert "\n" not in str(err.value)


def test_the_engine_shows_the_planner_the_lookup(engine) -> None:
    seen = []

    class Spy(SourceRule):
        def choose(self, state):
            seen.append((list(state.lookup or ()), state.lookup_ngram))
            return super().choose(state)

    out = engine.generate([3, 5, 2, 3, 5], max_new_tokens=4, temperature=0, plan=Spy("chain:2/block"))
    assert seen[0] == ([2, 3, 5], 2)  # "3 5" recurs: what followed it, to the end of the context
    assert str(out.steps[0].plan) == "lookup:3/block"


@pytest.mark.parametrize("inputs", [56, 48], ids=["embeddings-wider-than-head", "same-width"])
def test_prompt_ids_and_the_lm_head_width(inputs: int) -> None:
    """Prompt ids against a 48-wide LM head, with input embeddings as wide or wider (56).

    Wider: a prompt id past the head (50) is a valid input, and a lookup never drafts it (the
    target gives it probability 0; a draft row has no column for it): lookups, tries and hybrids
    decode as the target does, and sample without an IndexError. Same width: an id past both is
    refused in one line.
    """
    target = tiny_model("llama", vocab=48, eos=None, seed=5)
    if inputs != 48:
        torch.manual_seed(0)
        target.set_input_embeddings(torch.nn.Embedding(inputs, 32))
    engine = SpecEngine(target, perturbed(target, scale=0.1))
    assert (engine.vocab_size, engine.input_vocab_size) == (48, inputs)
    prompt = [0, 50, 7, 3, 0, 50, 7, 3, 0, 50]
    if inputs == 48:
        with pytest.raises(ValueError, match="50") as err:
            engine.generate(prompt, max_new_tokens=4, plan="lookup:3/block")
        assert "\n" not in str(err.value)
        prompt = [0, 40, 7, 3, 0, 40, 7, 3, 0, 40]  # within the vocabulary: looked up as usual
    want = engine.generate(prompt, max_new_tokens=10, temperature=0, plan="autoregressive").token_ids
    for plan in ("lookup:3/block", "lookup:2x3/nss", "hybrid:2:1/block", "source:chain:1/block+lookup:4/block"):
        out = engine.generate(prompt, max_new_tokens=10, temperature=0, plan=plan)
        assert out.token_ids == want, plan
        out = engine.generate(prompt, max_new_tokens=10, temperature=1.0, plan=plan, seed=0)  # no IndexError
        assert len(out.token_ids) == 10 and max(out.token_ids) < 48


# ---------------------------------------------------------------- negative controls
# Each wrong variant below must fail the chi-square test that the right one passes (same prompts,
# plans, runs, statistic and threshold as each other, and as test_lossless_lookup but for fewer
# runs): the test has the power to see these bugs. The wrongs are large: a few hundred runs do.
CONTROL_RUNS = 300


def law_pvalue(engine: SpecEngine, plan, prompt: list[int], runs: int) -> float:
    """The chi-square p-value of the first three tokens' law after ``prompt`` against the target's."""
    counts = torch.zeros(V, V, V, dtype=torch.long)
    for seed in range(runs):
        kw = {"temperature": SAMPLING.temperature, "top_k": SAMPLING.top_k, "seed": seed}
        counts[tuple(engine.generate(prompt, max_new_tokens=3, plan=plan, **kw).token_ids)] += 1
    return chi_square_pvalue(counts, exact_law(engine.target, SAMPLING, prompt, V))


def corrupt_rows(monkeypatch, looked_up: bool, drawn: bool) -> list[int]:
    """Make the verifier read rows the tokens were not drawn from: uniform rows at expanded nodes.

    ``looked_up``: at nodes whose children were looked up (whose right rows are the lookup's);
    ``drawn``: at nodes whose children the draft model drew. Returns a list counting the changed rows.
    """
    real = SpecEngine._draft
    changed: list[int] = []

    def wrong(self, run, plan, root, features):
        outcome = real(self, run, plan, root, features)
        rows = outcome.tree.draft_probs.clone()
        for node in range(rows.shape[0]):
            lookup_row = node < outcome.lookup_rows
            if rows[node].sum() > 0 and (looked_up if lookup_row else drawn):
                rows[node] = 1.0 / rows.shape[1]
                changed.append(node)
        outcome.tree = dataclasses.replace(outcome.tree, draft_probs=rows)
        return outcome

    monkeypatch.setattr(SpecEngine, "_draft", wrong)
    return changed


@pytest.mark.parametrize("wrong", [False, True], ids=["right", "wrong"])
@pytest.mark.parametrize("plan", ["lookup:2/block", "hybrid:1:1/token", "source"])
def test_negative_control_wrong_rows(engine, monkeypatch, plan, wrong) -> None:
    """Uniform rows over looked-up nodes (lookup, hybrid), or over every expanded node while switching sources."""
    changed = corrupt_rows(monkeypatch, looked_up=wrong, drawn=wrong and plan == "source")
    p = SourceRule("wor:2x1/traversal", "lookup:2/block", min_ngram=1) if plan == "source" else plan
    assert (law_pvalue(engine, p, [3, 5, 3, 5], CONTROL_RUNS) < 1e-3) == wrong
    assert bool(changed) == wrong


@pytest.mark.parametrize("wrong", [False, True], ids=["right", "wrong"])
@pytest.mark.parametrize("plan", ["lookup:2x2/nss", "lookup:0x2+2/nss", "lookup:1x2+m2/nss", "lookup:1x2+m3x2/nss"])
def test_negative_control_row_reading_verifier_on_a_trie(engine, monkeypatch, wrong, plan) -> None:
    """A lookup trie (in the context, in a corpus, or with the draft's greedy path) verified by traversal
    verification, which reads the trie's (uniform) rows as a draw's law."""
    import dataclasses

    import adaptive_spec.engine.step as step_module
    from adaptive_spec.verifiers import REGISTRY
    from adaptive_spec.verifiers.base import host_read

    played: list[int] = []

    def verifier(name, tree, target_probs, generator, ride=None, **kw):
        played.append(tree.num_nodes)
        checks = () if ride is None else tuple(host_read(tree, ride)[0])  # the engine's finite checks, passed back
        result = REGISTRY["traversal" if wrong else name].fn(tree, target_probs, as_sampler(generator))
        return dataclasses.replace(result, ride=checks)

    monkeypatch.setattr(step_module, "verify", verifier)
    # the corpus's continuations of "6 3" make the context's trie 3 -> {6 3, 5 3}, found in the corpus alone
    monkeypatch.setattr(engine, "datastore", Datastore.from_texts([[6, 3, 6, 3], [6, 3, 5, 3]], V))
    assert (law_pvalue(engine, plan, [3, 5, 3, 6, 3], CONTROL_RUNS) < 1e-3) == wrong
    assert max(played) > 3  # tries were drafted (a chain of two has 3 nodes)


def test_lossless_learned_gate(engine) -> None:
    """The learned source gate at T > 0: the law of the first three tokens is the target's.

    The gate reads the draft's root top-1 (so the draft's first forward runs before every choice,
    and a lookup step follows it) and the previous target top-1, so its choice of lookup, model or
    no draft varies with the sampled context.
    """
    from adaptive_spec.planner.gate import GATE_FEATURES, GATE_VERSION, GatedSource, SourceGate

    F = len(GATE_FEATURES)
    w = [[0.0] * F, [0.0] * F]
    w[0][GATE_FEATURES.index("draft_top1")] = w[1][GATE_FEATURES.index("target_top1")] = 1.0
    gate = SourceGate(
        {
            "version": GATE_VERSION,
            "features": list(GATE_FEATURES),
            "model_plan": "chain:2/block",
            "lookup_plan": "lookup:2/block",
            "mean": [0.0] * F,
            "scale": [1.0] * F,
            # lookup predicted good when the draft is confident at the root, the model when the target was
            "layers": [[w, [-0.5, -0.5]], [[[40.0, 0.0], [0.0, 40.0]], [-2.0, -2.0]]],
            "costs": {"model_s": 0.05, "lookup_s": 0.05, "per_token_s": 0.0, "plain_s": 0.06},
        }
    )
    planner = GatedSource(gate)
    assert planner.needs_features  # the draft's first forward runs before each choice
    prompt, runs = [3, 5, 3, 5], 400
    counts = torch.zeros(V, V, V, dtype=torch.long)
    played: set[tuple[str, bool]] = set()
    for seed in range(runs):
        kw = {"temperature": SAMPLING.temperature, "top_k": SAMPLING.top_k, "seed": seed}
        out = engine.generate(prompt, max_new_tokens=3, plan=planner, **kw)
        counts[tuple(out.token_ids)] += 1
        played |= {(s.plan.source, s.plan.shape.depth > 0) for s in out.steps}
    assert {("lookup", True), ("model", True), ("model", False)} <= played
    assert chi_square_pvalue(counts, exact_law(engine.target, SAMPLING, prompt, V)) > 1e-3


def test_from_pretrained_loads_the_shipped_datastore(monkeypatch, tmp_path) -> None:
    """``from_pretrained("smollm2")`` loads ``zoo/smollm2/datastore.npz`` unless told otherwise (``datastore=None``
    or a file); another name loads none."""
    import adaptive_spec.engine.engine as engine_module
    from adaptive_spec.engine.models import shipped_datastore

    target = tiny_model("llama", vocab=V, hidden=16, eos=None, seed=3, layers=1)
    monkeypatch.setattr(engine_module, "load_pair", lambda *a, **k: (target, perturbed(target, 0.1), None, None))
    shipped = tmp_path / "zoo" / "datastore.npz"
    CORPUS.save(shipped)
    monkeypatch.setattr(engine_module, "shipped_datastore", lambda name: shipped if name == "smollm2" else None)
    assert SpecEngine.from_pretrained("smollm2").datastore.tokens.tolist() == CORPUS.tokens.tolist()
    assert SpecEngine.from_pretrained("smollm2", datastore=None).datastore is None
    assert SpecEngine.from_pretrained("some/model").datastore is None
    mine = Datastore.from_texts([[1, 2, 3]], V)
    assert SpecEngine.from_pretrained("smollm2", datastore=mine).datastore is mine
    shipped.unlink()  # not built: none, and a +K plan then says so
    assert SpecEngine.from_pretrained("smollm2").datastore is None
    assert shipped_datastore("smollm2").name == "datastore.npz" and shipped_datastore("builtin") is None


@pytest.mark.parametrize("draft", ["model", "eagle"])
def test_the_draft_path_alone_plays_a_greedy_chain_step_for_step(draft) -> None:
    """``lookup:0xD+mD`` is the draft's greedy chain alone: at T = 0 it accepts what ``chain:D`` accepts, step for
    step, only if the draft's cache keeps the accepted share of the chain (and nothing else) after every step."""
    target = tiny_model("llama", vocab=8, hidden=16, eos=None, init_range=0.5, seed=11, layers=1)
    draft_model = perturbed(target, 0.3, 12) if draft == "model" else _eagle(target)
    engine = SpecEngine(target, draft_model)
    prompt = [3, 5, 2, 3, 5, 2, 3, 5]
    chain = engine.generate(prompt, max_new_tokens=40, temperature=0, plan="chain:3/block")
    alone = engine.generate(prompt, max_new_tokens=40, temperature=0, plan="lookup:0x3+m3/nss")
    assert alone.token_ids == chain.token_ids
    assert alone.stats.accept_lengths == chain.stats.accept_lengths
    assert 0 < sum(chain.stats.accept_lengths) < 3 * len(chain.stats.accept_lengths)  # some, not all, accepted


def test_the_draft_top_tokens_at_the_root_are_paths_of_the_trie(engine) -> None:
    """``lookup:0x1+mAx1``'s tree is the root and the draft's top A tokens there (a chain:1 step's draft row)."""
    trees = []
    engine.node_log = lambda tree, *_a, **_k: trees.append(tree)
    try:
        prompt = [3, 5, 2, 6]
        engine.generate(prompt, max_new_tokens=2, temperature=0, plan="chain:1/block")
        row = trees[0].draft_probs[0]  # the first step's: the draft's row at the root
        for width in (2, 3, 5):
            trees.clear()
            engine.generate(prompt, max_new_tokens=2, temperature=0, plan=f"lookup:0x1+m{width}x1/nss")
            tree = trees[0]
            assert tree.num_nodes == width + 1 and tree.children[0] == list(range(1, width + 1))
            assert tree.tokens[1:] == row.topk(width).indices.tolist()  # the chain's token first, then the others
            assert tree.tokens[1] == int(row.argmax())
    finally:
        engine.node_log = None


def test_the_root_leaves_never_repeat_the_chain_token_on_ties() -> None:
    """``lookup:WxL+mAxD``'s one-token paths are the draft's next best tokens after the chain's first (its argmax),
    even where the argmax ties with others and a top-k could rank it anywhere among them."""
    from adaptive_spec.engine.drafting.lookup import _root_leaves

    row = torch.tensor([0.25, 0.05, 0.25, 0.25, 0.2])  # four-way order among the tied tokens is the top-k's to pick
    first = row.argmax()[None]  # token 0, the chain's first token
    for k in (1, 2, 3, 4):
        leaves = _root_leaves(row, first, k).tolist()
        assert int(first) not in leaves and len(set(leaves)) == k
        assert sorted(row[leaves].tolist(), reverse=True) == sorted(row[1:].tolist(), reverse=True)[:k]
    assert sorted(_root_leaves(row, first, 2).tolist()) == [2, 3]
    # whichever of the tied tokens the chain took (argmax picks one, a top-k may rank another first), it is left out
    for tied in (2, 3):
        leaves = _root_leaves(row, torch.tensor([tied]), 3).tolist()
        assert tied not in leaves and sorted(leaves) == sorted({0, 2, 3, 4} - {tied})
