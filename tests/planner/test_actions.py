"""The action space: YAML grids, validation, the default grid, indices and per-action structure."""

from __future__ import annotations

from pathlib import Path

import pytest

from adaptive_spec.planner import (
    DEFAULT_ACTIONS_PATH,
    ActionSpace,
    Plan,
    draft_level_sizes,
    parse_plans,
    plan_structure,
)
from adaptive_spec.trees import DraftLaw, TreeShape

ISSUE_VERIFIERS = {"token", "block", "traversal", "specinfer", "spectr", "gbv", "nss", "naive", "rrsw"}


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "space.yaml"
    path.write_text(text)
    return path


# ---------------------------------------------------------------------- default grid
def test_default_space_has_a_few_hundred_actions_over_every_family_and_verifier():
    space = ActionSpace.default()
    assert 200 <= len(space) <= 400
    # Every static family, and dynamic chains that decide while drafting (each kind of rule)
    assert set(space.laws) == {law for law in DraftLaw if not law.dynamic and law is not DraftLaw.DETERMINISTIC} | {
        DraftLaw.DYNAMIC_CHAIN
    }
    dynamic = [p for p in space if p.policy is not None]
    assert {str(p.policy).split(":")[0] for p in dynamic} == {"conf-chain", "cum-chain"}
    assert all(p.verifier == "block" and p.shape.law is DraftLaw.DYNAMIC_CHAIN for p in dynamic)
    assert set(space.verifiers) == ISSUE_VERIFIERS
    # Each family carries the verifiers the issue names for it.
    by_law: dict[DraftLaw, set[str]] = {}
    for p in space:
        by_law.setdefault(p.shape.law, set()).add(p.verifier)
    assert {"token", "block", "traversal"} <= by_law[DraftLaw.CHAIN]
    iid_verifiers = {"traversal", "specinfer", "spectr", "gbv", "nss", "naive"}
    assert by_law[DraftLaw.IID] == iid_verifiers
    assert by_law[DraftLaw.DELAYED] == iid_verifiers
    assert by_law[DraftLaw.WITHOUT_REPLACEMENT] == {"traversal", "rrsw"}
    # Sizes within the issue's ranges, trees capped.
    for p in space:
        s = p.shape
        if s.law is DraftLaw.IID:
            assert 2 <= s.paths <= 4 and 1 <= s.branch_len <= 8
        if s.law is DraftLaw.DELAYED:
            assert 1 <= s.trunk <= 8 and 2 <= s.paths <= 4 and 0 <= s.branch_len <= 8
    assert space.max_nodes <= 40
    assert len(set(space.names)) == len(space)


def test_default_space_loads_from_any_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert len(ActionSpace.default()) > 0
    assert ActionSpace.from_yaml(DEFAULT_ACTIONS_PATH) == ActionSpace.default()


def test_index_round_trip_over_the_default_space():
    space = ActionSpace.default()
    for i, plan in enumerate(space):
        assert space.index(plan) == i
        assert space.index(str(plan)) == i
        assert space[i] == plan
        assert Plan.parse(space.names[i]) == plan
    assert space.to_dict()["actions"] == list(space.names)
    assert ActionSpace.from_dict(space.to_dict()) == space


# ---------------------------------------------------------------------- parsing
def test_yaml_grid_expands_in_order_canonicalises_and_deduplicates(tmp_path):
    path = write(
        tmp_path,
        """
name: small
families:
  - law: chain
    length: 1-2
    verifiers: [token, block]
  - law: delayed
    trunk: [2]
    paths: [3]
    branch: [0, 1]          # branch 0 is chain:2
    verifiers: [traversal]
  - law: wor
    widths: ["2x1", [1, 1]]  # wor:1x1 is chain:2 again
    verifiers: [traversal]
actions: ["chain:1/token", "iid:2x2/gbv"]
""",
    )
    space = ActionSpace.from_yaml(path)
    assert space.name == "small"
    assert space.names == (
        "chain:1/token",
        "chain:1/block",
        "chain:2/token",
        "chain:2/block",
        "chain:2/traversal",
        "delayed:2x3x1/traversal",
        "wor:2x1/traversal",
        "iid:2x2/gbv",
    )
    assert space.index("delayed:2x3x0/traversal") == space.index("chain:2/traversal")
    assert "wor:1x1/traversal" in space and "chain:9/token" not in space and "not a plan" not in space


def test_max_nodes_drops_large_grid_points_but_not_explicit_actions(tmp_path):
    path = write(
        tmp_path,
        """
max_nodes: 9
families:
  - law: iid
    paths: [2, 4]
    length: [2, 4]
    verifiers: [specinfer]
actions: ["iid:4x4/specinfer"]
""",
    )
    space = ActionSpace.from_yaml(path)
    assert space.names == ("iid:2x2/specinfer", "iid:2x4/specinfer", "iid:4x2/specinfer", "iid:4x4/specinfer")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("families: [{law: chain, length: [2], verifiers: [bogus]}]", "unknown verifier 'bogus'"),
        ("families: [{law: iid, paths: 2, length: 2, verifiers: [block]}]", "verifiers for 'iid' trees: traversal"),
        ("families: [{law: wor, widths: [[2, 2]], verifiers: [gbv]}]", "not lossless for trees drafted as"),
        ("families: [{law: chain, length: 2, verifiers: [greedy]}]", "only at temperature 0"),
        ("families: [{law: chain, length: 2, verifiers: [hsd]}]", "is not lossless"),
        ("actions: ['chain:2/hsd']", "is not lossless"),
        ("actions: ['iid:2x2/token']", "actions[0]"),
        ("families: [{law: star, length: 2, verifiers: [token]}]", "unknown law 'star'"),
        ("families: [{law: iid, length: 2, verifiers: [traversal]}]", "missing keys ['paths']"),
        ("families: [{law: chain, length: 2, lenght: 3, verifiers: [token]}]", "unknown keys ['lenght']"),
        ("families: [{law: chain, length: '8-1', verifiers: [token]}]", "range must look like"),
        ("families: [{law: chain, length: [1.5], verifiers: [token]}]", "must be an integer"),
        ("families: [{law: chain, length: [-1], verifiers: [token]}]", "length must be an integer >= 0"),
        ("families: [{law: wor, widths: [[2, 0]], verifiers: [rrsw]}]", "width must be an integer >= 1"),
        ("families: [{law: chain, length: 2, verifiers: []}]", "non-empty list of verifier names"),
        ("max_nodes: 3\nfamilies: [{law: iid, paths: 4, length: 4, verifiers: [gbv]}]", "more than max_nodes=3"),
        ("max_nodes: one\nactions: ['chain:1/token']", "max_nodes must be an integer"),
        ("name: empty", "no actions"),
        ("actions: [3]", "must be a plan string"),
        ("grid: []\nactions: ['chain:1/token']", "unknown keys ['grid']"),
        ("[1, 2]", "expected a mapping"),
        ("families: [{law: chain", "not valid YAML"),
    ],
)
def test_invalid_grids_are_refused_with_a_clear_message(tmp_path, text, message):
    with pytest.raises(ValueError, match=None) as err:
        ActionSpace.from_yaml(write(tmp_path, text))
    assert message in str(err.value)
    assert "space.yaml" in str(err.value)


def test_missing_file_and_direct_construction_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        ActionSpace.from_yaml(tmp_path / "nope.yaml")
    with pytest.raises(ValueError, match="at least one plan"):
        ActionSpace([])
    with pytest.raises(ValueError, match="verifiers for 'without_replacement' trees: traversal"):
        ActionSpace(["wor:2x2/spectr"])
    with pytest.raises(ValueError, match="not in action space"):
        ActionSpace(["chain:2/token"]).index("chain:3/token")


def test_parse_plans_skips_blanks():
    assert [str(p) for p in parse_plans(" chain:2/token, ,iid:2x2 ")] == ["chain:2/token", "iid:2x2/traversal"]


# ---------------------------------------------------------------------- structure
@pytest.mark.parametrize(
    ("shape", "levels"),
    [
        ("chain:4", (1, 1, 1, 1)),
        ("iid:3x2", (3, 3)),
        ("delayed:2x3x2", (1, 1, 3, 3)),
        ("wor:3x2x1", (3, 6, 6)),
        ("chain:0", ()),
    ],
)
def test_level_sizes_add_up_to_the_largest_tree(shape, levels):
    s = TreeShape.parse(shape)
    assert draft_level_sizes(s) == levels
    st = plan_structure(s)
    assert 1 + sum(st.level_sizes) == s.max_nodes == st.num_nodes
    assert st.draft_forward_tokens == levels[:-1]
    assert st.target_tokens == s.max_nodes - 1
    assert st.depth == s.depth
    assert st.draft_forwards == (0 if s.depth == 0 else len(levels))


def test_engine_runs_one_draft_forward_per_level_as_the_structure_says():
    import torch

    from adaptive_spec.engine import SpecEngine
    from tests.helpers.tiny import perturbed, tiny_model

    target = tiny_model("llama", vocab=48, seed=3)
    engine = SpecEngine(target, perturbed(target, 0.2, seed=4), device="cpu")
    for text in ("chain:3/block", "delayed:2x3x2/traversal", "wor:3x2x1/rrsw", "iid:2x3/specinfer"):
        res = engine.generate(torch.tensor([5, 6, 7]), max_new_tokens=10, temperature=1.0, plan=text, seed=0)
        # One prefill forward, then per step the forwards of the plan it ran (cut to the budget at the end).
        assert len(res.steps) >= 2
        assert res.stats.draft_forwards == 1 + sum(plan_structure(st.plan).draft_forwards for st in res.steps)
        assert all(st.num_nodes <= plan_structure(st.plan).num_nodes for st in res.steps)
