"""Draft trees and drafting laws."""

from adaptive_spec.trees.masks import additive_mask, ancestor_matrix, tree_attention_mask, tree_position_ids
from adaptive_spec.trees.sampling import DraftProbsFn, sample_tree
from adaptive_spec.trees.shapes import DraftLaw, TreeShape
from adaptive_spec.trees.tree import DraftTree

__all__ = [
    "DraftLaw",
    "DraftProbsFn",
    "DraftTree",
    "TreeShape",
    "additive_mask",
    "ancestor_matrix",
    "sample_tree",
    "tree_attention_mask",
    "tree_position_ids",
]
