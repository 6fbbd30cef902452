"""Batched tree drafting with the draft model: one forward per depth level.

The tree is grown level by level. At depth d every node that will be expanded has just been
fed to the draft model (one forward over the whole level, under the tree attention mask),
so its next-token distribution is a row of that forward's output; children for the whole
level are then drawn with a few torch ops from the caller's generator:

* chain / trunk: one *walker* draws one token per level;
* i.i.d. rollouts (``iid``, the branches of ``delayed``): K walkers, each drawing one token
  per level from the row of the slot it stands on (inverse CDF, with replacement);
  walkers that draw the same token from the same node share one node once the tree is read,
  and the draw is kept with multiplicity in ``child_draws``;
* without replacement: every frontier slot draws ``widths[d]`` distinct children, the law of
  sequential draws without replacement (Plackett-Luce), tokens of probability zero excluded: by
  the exponential race (Gumbel-top-k, ``argsort(probs / Exp(1))``) on an accelerator, from inverse-CDF
  draws on a CPU (:func:`~adaptive_spec.trees.draw.draw_children`).

Static shapes are drafted into fixed slots (:mod:`adaptive_spec.trees.slots`): no level reads the host,
and the tree's structure is merged from the tokens after the engine's one read. Policies decide on the
host, one read per level, except: EAGLE-style trees without replacement, whose counts per level are known in
advance, decided on the device with one read per tree (:func:`draft_eagle_on_device`); with
i.i.d. children, on an accelerator, each level has its most frontier rows, padding after the fed ones
(:func:`draft_eagle_iid_on_device`, one read per tree, which ends at a *look* level chosen from the past
trees); policy chains
(``conf-chain``, ``cum-chain``, ``learned-chain``), on an accelerator, decided on the device and read once, at a
*look* level chosen from the past stops (:func:`draft_chain_on_device`); and ``conf-delayed`` trees, whose trunk
is read level by level on a CPU and once at its look on an accelerator, then the paths drafted into a static
shape's slots (:func:`draft_conf_delayed`; paths that may stop are flagged on the device). This is the
law of :func:`adaptive_spec.trees.sample_tree` (which draws rollout
by rollout, depth first): rows are a function of the prefix only, draws are independent given the rows,
and walkers are processed in rollout order at each level, so each node's ``child_draws`` has the same
order. Only the node numbering differs (here breadth first, by slot). Leaves (depth ``shape.depth``) are
never fed to the draft model.

At temperature 0 (``deterministic=True``) single-walker draws take the argmax and
without-replacement draws the top-w tokens (deterministic top-k, fine for greedy
verification, docs/algorithms.md §2), while i.i.d. rollouts are still sampled so that they differ.

The first draft forward of a step, over the *pending* context tokens (those not yet in the
draft cache, the root last), does not depend on the tree shape: :func:`draft_root` runs it on
its own (the engine does so before the planner chooses, when root features are wanted, since
its last row is the draft's root distribution) and :func:`draft_tree` continues from it.

The package, a module a family (each imports only those above it):

* :mod:`.base`: what every drafter gives and shares: :class:`DraftOutcome`, the step's first draft forward
  (:func:`draft_root`, :class:`DraftRoot`), the finite check, and a tree's one host read queued behind the
  target's pass (:class:`QueuedRead`, :class:`DeferredTree`);
* :mod:`.static`: static shapes: chains and the slot trees (``iid``, ``delayed``, ``wor``), level by level or
  in one captured replay (:func:`draft_tree`);
* :mod:`.lookup`: trees looked up in the context or a datastore, alone, beside the draft's path, or as a
  hybrid's trunk (:func:`lookup_outcome`, :func:`draft_lookup_model`, :func:`draft_hybrid`);
* :mod:`.chains`: policy chains (``conf-chain``, ``cum-chain``, ``learned-chain``) decided on the device;
* :mod:`.delayed`: ``conf-delayed`` trees, a trunk then paths in slots;
* :mod:`.eagle_tree` and :mod:`.eagle_iid`: EAGLE-style trees grown on the device, children without
  replacement and i.i.d.;
* :mod:`.policy`: :func:`draft_policy_tree`, which picks one of those paths for a policy, else grows the tree
  on the host, one read a level.
"""

from adaptive_spec.engine.drafting.base import (
    DeferredTree,
    DraftOutcome,
    DraftRoot,
    QueuedRead,
    check_finite,
    draft_root,
    sample_categorical,
)
from adaptive_spec.engine.drafting.chains import captured_policy_chain, chain_on_device, draft_chain_on_device
from adaptive_spec.engine.drafting.delayed import captured_conf_delayed, delayed_on_slots, draft_conf_delayed
from adaptive_spec.engine.drafting.eagle_iid import captured_eagle_iid_tree, draft_eagle_iid_on_device
from adaptive_spec.engine.drafting.eagle_tree import (
    captured_eagle_tree,
    draft_eagle_on_device,
    eagle_iid_slots,
    eagle_levels,
    eagle_on_device,
)
from adaptive_spec.engine.drafting.lookup import draft_hybrid, draft_lookup_model, lookup_outcome
from adaptive_spec.engine.drafting.policy import draft_policy_tree
from adaptive_spec.engine.drafting.static import captured_chain, captured_slots, draft_tree, slots_grow

__all__ = [
    "DeferredTree",
    "DraftOutcome",
    "DraftRoot",
    "QueuedRead",
    "captured_chain",
    "captured_conf_delayed",
    "captured_eagle_iid_tree",
    "captured_eagle_tree",
    "captured_policy_chain",
    "captured_slots",
    "chain_on_device",
    "check_finite",
    "delayed_on_slots",
    "draft_chain_on_device",
    "draft_conf_delayed",
    "draft_eagle_iid_on_device",
    "draft_eagle_on_device",
    "draft_hybrid",
    "draft_lookup_model",
    "draft_policy_tree",
    "draft_root",
    "draft_tree",
    "eagle_iid_slots",
    "eagle_levels",
    "eagle_on_device",
    "lookup_outcome",
    "sample_categorical",
    "slots_grow",
]
