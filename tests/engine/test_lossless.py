"""End-to-end losslessness: the joint law of the first 3 generated tokens is the target's law.

Tiny random models over V=8 tokens; the exact target law of (x1, x2, x3) is computed by
enumerating all V^2 two-token continuations in one batched forward. Each case runs the engine
a few thousand times with seeds 0..n-1 and applies a chi-square test (cells with small
expected counts pooled). Seeds are fixed, so the outcome is deterministic.
"""

from __future__ import annotations

import pytest
import torch

from adaptive_spec.engine import SpecEngine
from adaptive_spec.engine.logits import SamplingConfig
from adaptive_spec.trees import DraftLaw
from adaptive_spec.verifiers import REGISTRY
from tests.helpers import laws
from tests.helpers.drafting import patch_drafting
from tests.helpers.laws import chi_square_pvalue
from tests.helpers.tiny import perturbed, tiny_model

V = 8
PROMPT = [3]  # one token: no prefill, so each run is a few forwards
SHAPE_FOR_LAW = {
    DraftLaw.CHAIN: "chain:2",
    DraftLaw.IID: "iid:2x2",
    DraftLaw.DELAYED: "delayed:1x2x1",
    DraftLaw.WITHOUT_REPLACEMENT: "wor:2x2",
    # Policy-grown trees (adaptive_spec.trees.policy): their shape varies with the draft's confidence.
    DraftLaw.DYNAMIC_CHAIN: "conf-chain:3:0.35",
    DraftLaw.DYNAMIC_IID: "conf-delayed:3:0.5:2",
    DraftLaw.DYNAMIC_WOR: "eagle:2:4:1:2:wor",
    # Found in the context: a trie 3 -> {6 3, 5 3} after PROMPT_FOR_LAW's prompt.
    DraftLaw.DETERMINISTIC: "lookup:2x2",
}
# Laws that need more than PROMPT to draft their trees: "3" recurs with two continuations.
PROMPT_FOR_LAW = {DraftLaw.DETERMINISTIC: [3, 5, 3, 6, 3]}
ALL_CASES = [
    (name, law)
    for name, spec in REGISTRY.items()
    if spec.lossless and not spec.greedy_only
    for law in DraftLaw
    if law in spec.laws
]
# A quick subset (every law once) in the default run; the full sweep is marked slow.
FAST_CASES = [
    ("token", DraftLaw.CHAIN),
    ("traversal", DraftLaw.WITHOUT_REPLACEMENT),
    ("specinfer", DraftLaw.IID),
    ("gbv", DraftLaw.DELAYED),
    ("block", DraftLaw.DYNAMIC_CHAIN),
    ("traversal", DraftLaw.DYNAMIC_IID),
]
SLOW_CASES = [c for c in ALL_CASES if c not in FAST_CASES]
SAMPLING = SamplingConfig(temperature=0.9, top_k=6, top_p=1.0)


@pytest.fixture(scope="module")
def engine():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny models: threads only add overhead
    target = tiny_model("llama", vocab=V, hidden=16, eos=None, init_range=0.5, seed=11, layers=1)
    draft = perturbed(target, scale=0.3, seed=12)  # accepts about 2 tokens per step
    yield SpecEngine(target, draft)
    torch.set_num_threads(threads)


def exact_law(model, sampling: SamplingConfig, prompt: list[int] = PROMPT) -> torch.Tensor:
    """Tensor[V, V, V]: the target's law of the first three tokens after ``prompt`` under ``sampling``."""
    return laws.exact_law(model, sampling, prompt, V)


def run_case(engine: SpecEngine, verifier: str, law: DraftLaw, runs: int, shape: str | None = None) -> float:
    plan = f"{shape or SHAPE_FOR_LAW[law]}/{verifier}"
    prompt = PROMPT_FOR_LAW.get(law, PROMPT)
    counts = torch.zeros(V, V, V, dtype=torch.long)
    largest = 0
    for seed in range(runs):
        out = engine.generate(
            prompt, max_new_tokens=3, temperature=SAMPLING.temperature, top_k=SAMPLING.top_k, plan=plan, seed=seed
        )
        counts[tuple(out.token_ids)] += 1
        largest = max(largest, *out.stats.tree_sizes)
    if law is DraftLaw.DETERMINISTIC:
        assert largest > 3, "no trie was drafted (a chain of two has 3 nodes)"
    return chi_square_pvalue(counts, exact_law(engine.target, SAMPLING, prompt))


def test_autoregressive_baseline_is_the_target_law(engine: SpecEngine) -> None:
    counts = torch.zeros(V, V, V, dtype=torch.long)
    for seed in range(2000):
        counts[
            tuple(
                engine.generate(
                    PROMPT, max_new_tokens=3, temperature=0.9, top_k=6, seed=seed, plan="autoregressive"
                ).token_ids
            )
        ] += 1
    assert chi_square_pvalue(counts, exact_law(engine.target, SAMPLING)) > 1e-3


@pytest.mark.parametrize(("verifier", "law"), FAST_CASES, ids=[f"{v}-{law.value}" for v, law in FAST_CASES])
def test_lossless_end_to_end(engine: SpecEngine, verifier: str, law: DraftLaw) -> None:
    assert run_case(engine, verifier, law, runs=2000) > 1e-3


@pytest.mark.parametrize("law", [DraftLaw.WITHOUT_REPLACEMENT], ids=lambda x: x.value)
def test_lossless_end_to_end_traversal_ahead(engine: SpecEngine, law: DraftLaw) -> None:
    """Traversal's accelerator path (every weight computed ahead on the device, one read) through the engine
    (one law here: tests/verifiers/test_traversal_device.py holds its states to the exact test on every law).
    """
    from adaptive_spec.rng import accelerator_path_on_cpu

    with accelerator_path_on_cpu():
        assert run_case(engine, "traversal", law, runs=2000) > 1e-3


def test_lossless_end_to_end_eagle_iid_on_the_device(engine: SpecEngine, monkeypatch) -> None:
    """An EAGLE-style tree with i.i.d. children decided on the device (padding rows, merges and top-k there) and
    SpecInfer run on its draws table, every node at once: the accelerator's paths, through the engine."""
    from adaptive_spec.engine import drafting
    from adaptive_spec.rng import accelerator_path_on_cpu

    grown = []
    real = drafting.draft_eagle_iid_on_device
    patch_drafting(monkeypatch, "draft_eagle_iid_on_device", lambda *a: grown.append(1) or real(*a))
    with accelerator_path_on_cpu():
        assert run_case(engine, "specinfer", DraftLaw.DYNAMIC_IID, runs=2000, shape="eagle:2:5:2:3") > 1e-3
    assert len(grown) >= 2000


@pytest.mark.parametrize("plan", ["cum-chain:3:0.35/traversal", "learned"])  # block: the learned chain
def test_lossless_end_to_end_policy_chain_on_the_device(engine: SpecEngine, plan: str, monkeypatch) -> None:
    """A policy chain decided on the device (one read at its look: cut at its stop by then, else drafted to the
    depth): the accelerator's path, through the engine, both cases met."""
    from adaptive_spec.engine import Plan, drafting
    from adaptive_spec.rng import accelerator_path_on_cpu
    from adaptive_spec.trees.policy import LearnedChain
    from tests.helpers.dynamic_cases import TinyAcceptanceNet

    if plan == "learned":
        plan = Plan(LearnedChain(depth=3, cost_ratio=0.01, predictor=TinyAcceptanceNet(1)), "block")
    past = []
    real = drafting.draft_chain_on_device

    def counted(*a):
        out = real(*a)
        if a[2].depth > 1:  # a cut chain stops by its look, before the depth
            past.append(out.tree.num_nodes == a[2].depth + 1)
        return out

    patch_drafting(monkeypatch, "draft_chain_on_device", counted)
    counts = torch.zeros(V, V, V, dtype=torch.long)
    with accelerator_path_on_cpu():
        for seed in range(2000):
            out = engine.generate(PROMPT, max_new_tokens=3, temperature=0.9, top_k=6, plan=plan, seed=seed)
            counts[tuple(out.token_ids)] += 1
    assert 0 < sum(past) < len(past) >= 1000
    assert chi_square_pvalue(counts, exact_law(engine.target, SAMPLING)) > 1e-3


@pytest.mark.parametrize(
    ("verifier", "shape"), [("traversal", "conf-delayed:3:0.35:2"), ("specinfer", "conf-delayed:3:0.5:2:0.45")]
)
def test_lossless_end_to_end_conf_delayed_trunk_on_the_device(engine: SpecEngine, monkeypatch, verifier, shape) -> None:
    """A ``conf-delayed`` trunk decided on the device, read once at its look, then the paths in slots (with a
    branch threshold: paths that stop, flagged on the device): the accelerator's path, through the engine."""
    from adaptive_spec.engine import drafting
    from adaptive_spec.rng import accelerator_path_on_cpu

    looked, stopped = [], []
    real = drafting.draft_conf_delayed

    def counted(*a):
        out = real(*a)
        looked.append(a[-1])
        if out.tree.slots is not None:  # a path that stopped: a flagged slot
            stopped.append(not bool(out.tree.slots[1].all()))
        return out

    patch_drafting(monkeypatch, "draft_conf_delayed", counted)
    with accelerator_path_on_cpu():
        # the root's row has a top-1 of 0.39: a trunk at 0.35, which branches a node or two later; at 0.5 the paths
        # branch at the root (its top-1 is 0.42 at T = 0.9) and stop there at a branch threshold of 0.45 (a first
        # step's tree, of depth 2, has flagged slots; a request's later steps draft one level, cut at its end)
        assert run_case(engine, verifier, DraftLaw.DYNAMIC_IID, runs=2000, shape=shape) > 1e-3
    assert len(looked) >= 2000 and all(looked)
    assert any(stopped) == (shape.count(":") == 4)


@pytest.mark.slow
@pytest.mark.parametrize(("verifier", "law"), SLOW_CASES, ids=[f"{v}-{law.value}" for v, law in SLOW_CASES])
def test_lossless_end_to_end_all_verifiers(engine: SpecEngine, verifier: str, law: DraftLaw) -> None:
    # The sweep takes 700 runs a case (the exact tests by enumeration are the proof; this checks the wiring
    # through the engine, within make test's 15 minutes): the quick cases and the negative control keep 2000.
    assert run_case(engine, verifier, law, runs=700) > 1e-3


@pytest.mark.slow
def test_chi_square_detects_a_lossy_verifier(engine: SpecEngine) -> None:
    """Power check: the same test rejects ``hsd``, which the exact tests show to be lossy."""
    from adaptive_spec.engine import Plan
    from adaptive_spec.trees import TreeShape

    plan = Plan(TreeShape.chain(2), "hsd", allow_lossy=True)
    counts = torch.zeros(V, V, V, dtype=torch.long)
    for seed in range(2000):
        out = engine.generate(PROMPT, max_new_tokens=3, temperature=0.9, top_k=6, plan=plan, seed=seed)
        counts[tuple(out.token_ids)] += 1
    assert chi_square_pvalue(counts, exact_law(engine.target, SAMPLING)) < 1e-3


def test_lossless_learned_chain(engine: SpecEngine) -> None:
    """A chain grown by an acceptance model (a fixed random network here), block verification."""
    from adaptive_spec.engine import Plan
    from adaptive_spec.trees.policy import LearnedChain
    from tests.helpers.dynamic_cases import TinyAcceptanceNet

    plan = Plan(LearnedChain(depth=3, cost_ratio=0.1, predictor=TinyAcceptanceNet(3)), "block")
    counts = torch.zeros(V, V, V, dtype=torch.long)
    lengths = []
    for seed in range(2000):
        out = engine.generate(PROMPT, max_new_tokens=3, temperature=0.9, top_k=6, plan=plan, seed=seed)
        counts[tuple(out.token_ids)] += 1
        lengths.extend(out.stats.tree_sizes)
    assert len(set(lengths)) > 1, "the learned policy never varied the chain length"
    assert chi_square_pvalue(counts, exact_law(engine.target, SAMPLING)) > 1e-3
