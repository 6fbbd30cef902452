"""Data of the adaptive system: online feature logs (Parquet shards), offline labels, datasets."""
