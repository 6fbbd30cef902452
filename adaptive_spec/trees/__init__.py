"""Draft trees and drafting laws."""

from adaptive_spec.trees.draw import DraftProbsFn, sample_policy_tree, sample_tree
from adaptive_spec.trees.masks import (
    additive_mask,
    ancestor_matrix,
    block_ancestors,
    block_inputs,
    block_positions,
    device_block,
    tree_attention_mask,
    tree_position_ids,
)
from adaptive_spec.trees.policy import DraftPolicy, NodeView, PolicyContext, parse_policy
from adaptive_spec.trees.shapes import DraftLaw, TreeShape
from adaptive_spec.trees.tree import DraftTree

__all__ = [
    "DraftLaw",
    "DraftPolicy",
    "DraftProbsFn",
    "DraftTree",
    "NodeView",
    "PolicyContext",
    "TreeShape",
    "additive_mask",
    "ancestor_matrix",
    "block_ancestors",
    "block_inputs",
    "block_positions",
    "device_block",
    "parse_policy",
    "sample_policy_tree",
    "sample_tree",
    "tree_attention_mask",
    "tree_position_ids",
]
