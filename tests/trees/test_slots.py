"""Slot trees (adaptive_spec.trees.slots): a static shape's fixed layout, and the merge after the host read.

- the layout of each static law: one slot per walker and level (branching at the trunk's end), or
  ``min(width, V)`` child slots per slot without replacement;
- a shape cut to a smaller depth takes its device tensors from the deeper layout's (slices equal to its own
  layout's, made with no copy from the host);
- several layouts put on the device in one copy hold what each would have copied itself;
- the merge: walkers that draw the same token at the same node share it (their draws kept with
  multiplicity, the walkers below continuing from it), a dropped draw takes its subtree with it, and
  the unused slots are in no node's draws;
- a slot tree reads its tokens, flags and structure in one host read, and only when used;
- the engine drafts every static shape with no host read at all, and its steps verify through one read
  (negative control: the counter sees a read planted in a level).
"""

from __future__ import annotations

import pytest
import torch

from adaptive_spec.bench.overhead import HostSyncCounter
from adaptive_spec.engine import SpecEngine
from adaptive_spec.trees import DraftTree, TreeShape
from adaptive_spec.trees.slots import build_layout, layouts_to_device, slot_layout
from tests.helpers.drafting import drafting_attr, patch_drafting
from tests.helpers.tiny import perturbed, tiny_model


def test_walker_layouts_branch_at_the_trunks_end():
    iid = slot_layout(TreeShape.iid(3, 2), 50)
    assert iid.parents == (-1, 0, 0, 0, 1, 2, 3) and iid.depths == (0, 1, 1, 1, 2, 2, 2)
    assert iid.levels == ((1, 4), (4, 7)) and iid.draws == (1, 1) and iid.spread == (True, False)
    assert iid.num_slots == TreeShape.iid(3, 2).max_nodes and iid.walkers
    delayed = slot_layout(TreeShape.delayed(2, 2, 1), 50)
    assert delayed.parents == (-1, 0, 1, 2, 2) and delayed.spread == (False, False, True)
    assert delayed.levels == ((1, 2), (2, 3), (3, 5))


def test_without_replacement_layout_has_a_slot_per_draw_clipped_to_the_vocabulary():
    wor = slot_layout(TreeShape.without_replacement((2, 3)), 50)
    assert wor.parents == (-1, 0, 0, 1, 1, 1, 2, 2, 2) and wor.draws == (2, 3) and not wor.walkers
    small = slot_layout(TreeShape.without_replacement((3, 1)), 2)  # only two tokens to draw from
    assert small.parents == (-1, 0, 0, 1, 2) and small.draws == (2, 1)
    with pytest.raises(ValueError, match="not a static tree"):
        slot_layout(TreeShape.chain(3), 50)


@pytest.mark.parametrize(
    "shape",
    [TreeShape.iid(3, 5), TreeShape.delayed(2, 3, 3), TreeShape.without_replacement((3, 2, 2, 1))],
    ids=str,
)
def test_a_truncated_shape_slices_the_deeper_layouts_tensors(shape, monkeypatch):
    slot_layout.cache_clear()  # laid out afresh, the deeper shape first
    cpu = torch.device("cpu")
    deep = slot_layout(shape, 50)
    deep.tensors(cpu), deep.parents_tensor(cpu), deep.candidates(cpu)
    cuts = [d for d in range(1, shape.depth) if shape.truncated(d).law is shape.law]
    assert cuts
    for d in cuts:
        cut = slot_layout(shape.truncated(d), 50)
        fresh = build_layout(shape.truncated(d), 50)
        assert cut._source is deep
        made = []
        with monkeypatch.context() as m:  # nothing copied from the host for the cut layout
            m.setattr(torch, "tensor", lambda *a, made=made, **k: made.append(a) or torch.as_tensor(*a, **k))
            got = [*cut.tensors(cpu), cut.parents_tensor(cpu), *cut.candidates(cpu)]
        assert not made
        want = [*fresh.tensors(cpu), fresh.parents_tensor(cpu), *fresh.candidates(cpu)]
        for g, w in zip(got, want, strict=True):
            assert g.dtype == w.dtype and torch.equal(g, w)
    slot_layout.cache_clear()  # a cut laid out before any deeper shape has its own tensors
    assert slot_layout(shape.truncated(cuts[0]), 51)._source is None


def test_layouts_put_on_the_device_together_equal_their_own_copies(monkeypatch):
    shapes = [TreeShape.delayed(t, 3, 4 - t) for t in range(4)] + [TreeShape.without_replacement((3, 2))]
    together = [build_layout(shape, 50) for shape in shapes]
    copies = []
    with monkeypatch.context() as m:
        m.setattr(torch, "tensor", lambda *a, **k: copies.append(a) or torch.as_tensor(*a, **k))
        layouts_to_device(together, torch.device("cpu"))
    assert len(copies) == 1
    cpu = torch.device("cpu")
    for lay, shape in zip(together, shapes, strict=True):
        alone = build_layout(shape, 50)
        got = [*lay.tensors(cpu), lay.parents_tensor(cpu), *lay.candidates(cpu)]
        want = [*alone.tensors(cpu), alone.parents_tensor(cpu), *alone.candidates(cpu)]
        for g, w in zip(got, want, strict=True):
            assert g.dtype == w.dtype and g.shape == w.shape and torch.equal(g, w)


def test_merge_shares_duplicate_draws_and_walkers_continue_from_the_shared_node():
    layout = slot_layout(TreeShape.iid(3, 2), 50)
    # walkers 1 and 3 draw token 5 at the root, walker 2 draws 6; below, walkers 1 and 3 draw 7 and 8
    tokens, valid = [-1, 5, 6, 5, 7, 9, 8], [1] * 7
    parents, draws = layout.merge(tokens, valid)
    assert draws[0] == [1, 2, 1]  # three draws at the root, token 5 twice (multiplicity)
    assert parents[4] == 1 and parents[6] == 1 and parents[5] == 2  # walker 3 continues from node 1
    assert draws[1] == [4, 6] and draws[2] == [5] and draws[3] == []  # slot 3 is unused
    # the same tokens, but walker 3 draws 7 below too: it merges into slot 4
    parents, draws = layout.merge([-1, 5, 6, 5, 7, 9, 7], valid)
    assert draws[1] == [4, 4] and draws[6] == []
    tree = DraftTree.from_slots(
        layout, torch.tensor([-1, 5, 6, 5, 7, 9, 7]), torch.ones(7, dtype=torch.bool), torch.zeros(7, 50)
    )
    assert tree.used == [True, True, True, False, True, True, False]
    assert tree.prefixes[4] == (5, 7) and tree.children[0] == [1, 2]


def test_merge_drops_a_draw_that_did_not_happen_with_its_subtree():
    layout = slot_layout(TreeShape.without_replacement((2, 1)), 50)  # slots: 1, 2 at depth 1; 3 under 1, 4 under 2
    parents, draws = layout.merge([-1, 4, 9, 3, 3], [1, 1, 0, 1, 1])  # the second root draw ran out of support
    assert draws[0] == [1] and draws[1] == [3] and draws[2] == [] and parents[4] == 2
    tree = DraftTree.from_slots(
        layout, torch.tensor([-1, 4, 9, 3, 3]), torch.tensor([1, 1, 0, 1, 1]).bool(), torch.zeros(5, 50)
    )
    assert tree.used == [True, True, False, True, False]
    with pytest.raises(ValueError, match="4 tokens and 5 flags for 5 slots"):
        layout.merge([-1, 4, 9, 3], [1] * 5)


def test_a_slot_tree_reads_tokens_flags_and_structure_once_when_first_used(monkeypatch):
    layout = slot_layout(TreeShape.iid(2, 1), 50)
    tree = DraftTree.from_slots(layout, torch.tensor([-1, 8, 8]), torch.ones(3, dtype=torch.bool), torch.zeros(3, 50))
    reads = []
    real = torch.Tensor.tolist
    monkeypatch.setattr(torch.Tensor, "tolist", lambda t: reads.append(t.numel()) or real(t))
    assert not tree.tokens_on_host and tree.num_nodes == 3 and reads == []
    assert tree.has_tensors("cpu", "tokens", "depths", "ancestors") and tree.device_parts()[1].dtype == torch.bool
    assert tree.child_draws == [[1, 1], [], []] and reads == [6]  # tokens and flags in one read
    assert tree.tokens == [-1, 8, 8] and tree.parents == [-1, 0, 0] and reads == [6] and tree.device_parts() == []
    assert tree.used == [True, True, False]
    handed = DraftTree.from_slots(layout, torch.tensor([-1, 8, 2]), torch.ones(3, dtype=torch.bool), torch.zeros(3, 50))
    handed.take_host([[-1, 8, 2], [1, 1, 1]])  # read by the caller with its own values
    assert handed.child_draws == [[1, 2], [], []] and reads == [6]
    with pytest.raises(ValueError, match="1 parts for 2"):
        DraftTree.from_slots(
            layout, torch.tensor([-1, 8, 2]), torch.ones(3, dtype=torch.bool), torch.zeros(3, 50)
        ).take_host([[1]])
    with pytest.raises(ValueError, match="only left out of a slot tree"):
        DraftTree([-1, 3], None, [0, 1], torch.zeros(2, 50), None, TreeShape.chain(1))


@pytest.mark.parametrize("plan", ["iid:3x2/specinfer", "delayed:1x2x2/traversal", "wor:2x2/rrsw", "wor:2x2x1/greedy"])
def test_the_engine_drafts_static_trees_without_a_host_read(plan):
    target = tiny_model("llama", vocab=48, seed=3, eos=None)
    draft = perturbed(target, 0.2, 4)
    engine = SpecEngine(target, draft)
    temperature = 0.0 if plan.endswith("greedy") else 1.0
    with HostSyncCounter(roles={"target": target, "draft": draft}) as counter:
        r = engine.generate([5, 6, 7], max_new_tokens=8, temperature=temperature, plan=plan, seed=0)
    sites = {site for (stage, _, _, site) in counter.sites if stage == "step"}
    assert r.stats.steps > 0 and not [s for s in sites if s.startswith("engine/drafting/")]
    assert counter.syncs["step", "engine", "tolist"] >= r.stats.steps  # the verifier's read brings the tree back
    assert max(r.stats.tree_sizes) == TreeShape.parse(plan.split("/")[0]).max_nodes  # every slot is scored


def test_a_read_planted_in_a_level_is_seen(monkeypatch):
    """Negative control for the test above: the counter sees a read inside the slot drafter."""

    real = drafting_attr("draw_children")

    def reading(*args, **kwargs):
        out = real(*args, **kwargs)
        out[0].tolist()
        return out

    patch_drafting(monkeypatch, "draw_children", reading)
    target = tiny_model("llama", vocab=48, seed=3, eos=None)
    engine = SpecEngine(target, perturbed(target, 0.2, 4))
    with HostSyncCounter(roles={"target": target}) as counter:
        engine.generate([5, 6, 7], max_new_tokens=4, temperature=1.0, plan="iid:3x2/specinfer", seed=0)
    assert any(site.startswith("engine/drafting/") for (stage, _, _, site) in counter.sites if stage == "step")


def test_the_commit_reads_an_accepted_path_off_the_ancestor_matrix_on_the_device(monkeypatch):
    from adaptive_spec.engine.drafting import DraftOutcome
    from adaptive_spec.engine.step import _path_nodes

    layout = slot_layout(TreeShape.iid(3, 2), 50)
    ancestors, _ = layout.tensors(torch.device("cpu"))
    tree = DraftTree.from_slots(
        layout, torch.tensor([-1, 5, 6, 5, 7, 9, 8]), torch.ones(7, dtype=torch.bool), torch.zeros(7, 50)
    )
    outcome = DraftOutcome(tree, ancestors, 1, 4)
    copies = []
    real = torch.tensor
    monkeypatch.setattr(torch, "tensor", lambda *a, **k: copies.append(a) or real(*a, **k))
    assert _path_nodes(outcome, [2, 5]).tolist() == [2, 5] and copies == []  # on the device, no copy
    # node 6 hangs under node 1 once merged; its slot path runs through slot 3, which holds the same prefix (5,)
    assert tree.parents[6] == 1 and _path_nodes(outcome, [1, 6]).tolist() == [3, 6]
    assert _path_nodes(outcome, [1]) == [1] and _path_nodes(outcome, []) == []  # a chain's prefix: in place
