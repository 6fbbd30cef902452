"""The data contracts every layer shares, below everything that produces or consumes them.

- :mod:`~adaptive_spec.formats.features`: the feature schema (:data:`SCHEMA`), the one definition of
  feature order, dtypes and normalisation;
- :mod:`~adaptive_spec.formats.feature_log`: the online feature log (Parquet shards) and its writer,
  :class:`~adaptive_spec.formats.feature_log.FeatureLogger`;
- :mod:`~adaptive_spec.formats.label_table`: the label table ``label`` writes and the selector reads.

Importing this package loads only the feature schema (numpy); pyarrow loads on first use.
"""

from adaptive_spec.formats.features import SCHEMA, FeatureSchema

__all__ = ["SCHEMA", "FeatureSchema"]
