"""The learned plan selector: feature schema, model, training, ONNX export and runtime."""

from adaptive_spec.selector.features import SCHEMA, FeatureSchema

__all__ = ["SCHEMA", "FeatureSchema"]
