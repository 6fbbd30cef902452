"""The feature schema: one definition for online logging, training, ONNX export and runtime.

A planner sees a fixed-length float32 vector of *scalar* features taken at the root of each step,
before drafting, plus (optionally) the last hidden states of the draft and of the target, stored as
float16 and projected by the selector. Every producer and consumer goes through this module:

- the engine fills a ``dict[name, float]`` with exactly :data:`SCALAR_FEATURES`' names;
- the logger writes one Parquet float32 column per name (plus ``draft_hidden``/``target_hidden``);
- training reads the columns back in :attr:`FeatureSchema.names` order;
- the ONNX export stores :attr:`FeatureSchema.version` and :attr:`FeatureSchema.hash` as metadata,
  and the runtime refuses a model whose hash differs.

Change a name, its order or its meaning -> bump :data:`SCHEMA_VERSION` (the hash changes with it).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

SCHEMA_VERSION = 1


@dataclass(frozen=True)
class Feature:
    """One scalar feature: its column name, dtype and meaning."""

    name: str
    doc: str
    dtype: str = "float32"


# Order matters: it is the order of the selector's input vector.
SCALAR_FEATURES: tuple[Feature, ...] = (
    # The rows over the root token (the last committed token): the target's row, and the draft's
    # row at the same position. At temperature 0 both are plain softmaxes (T=1), since the one-hot
    # rows the greedy verifier uses carry no information.
    Feature("target_entropy", "entropy (nats) of the target's previous row, the one the root token came from"),
    Feature("draft_entropy", "entropy (nats) of the draft's row at the same position"),
    Feature("kl_target_draft", "KL(target || draft) between those two rows (nats)"),
    Feature("kl_draft_target", "KL(draft || target) between those two rows (nats)"),
    Feature("l1_target_draft", "sum |target - draft| over the vocabulary (0..2); 1 - l1/2 is the acceptance"),
    Feature("target_top1", "largest probability in the target's previous row"),
    # The draft's distribution for the first drafted token (after the root), known before drafting.
    Feature("draft_root_entropy", "entropy (nats) of the draft's root distribution"),
    Feature("draft_root_top1", "largest probability in the draft's root distribution"),
    # History of the generation.
    Feature("last_accepted", "accepted draft tokens (tau) in the previous step; 0 before the first"),
    Feature("accepted_ema", "exponential moving average of tau (weight 0.3 on the newest step)"),
    Feature("is_first_step", "1.0 on the first speculative step of a generation, else 0.0"),
    Feature("context_length", "committed tokens (prompt + generated)"),
    # Sampling settings.
    Feature("temperature", "sampling temperature (0 = greedy)"),
    Feature("top_p", "nucleus mass (1.0 = off)"),
    # The latency profile's estimates at this context length (milliseconds); 0 when no profile.
    Feature("draft_ms", "predicted one-token draft forward"),
    Feature("target_ms", "predicted one-token target forward"),
    Feature("target_ms_per_token", "predicted extra target time per additional scored token"),
)

# Optional float16 vectors; their widths depend on the models and are recorded in the manifest.
HIDDEN_FEATURES: tuple[str, ...] = ("draft_hidden", "target_hidden")


@dataclass(frozen=True)
class FeatureSchema:
    """Names, order, dtypes and version of the features; :attr:`hash` identifies them."""

    version: int
    features: tuple[Feature, ...]
    hidden: tuple[str, ...]

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(f.name for f in self.features)

    @property
    def num_scalar(self) -> int:
        return len(self.features)

    @property
    def hash(self) -> str:
        """First 16 hex digits of the SHA-256 of the version, names, dtypes and hidden columns."""
        blob = json.dumps(
            {"version": self.version, "scalar": [[f.name, f.dtype] for f in self.features], "hidden": self.hidden},
            sort_keys=True,
        )
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def to_dict(self) -> dict:
        return {"version": self.version, "hash": self.hash, "names": list(self.names), "hidden": list(self.hidden)}

    def vector(self, values: Mapping[str, float]) -> np.ndarray:
        """The float32 input vector from a name -> value mapping (exactly the schema's names)."""
        missing = [n for n in self.names if n not in values]
        extra = [n for n in values if n not in self.names]
        if missing or extra:
            raise ValueError(f"feature names differ from schema v{self.version}: missing {missing}, unexpected {extra}")
        return np.array([values[n] for n in self.names], dtype=np.float32)

    def check_compatible(self, version: int, hash_: str, *, what: str = "the model") -> None:
        """Raise a clear error if ``what`` was built for another schema."""
        if version != self.version or hash_ != self.hash:
            raise ValueError(
                f"{what} was built for feature schema v{version} (hash {hash_}), but this adaptive-spec uses "
                f"v{self.version} (hash {self.hash}); relabel and retrain the selector with this version"
            )


SCHEMA = FeatureSchema(SCHEMA_VERSION, SCALAR_FEATURES, HIDDEN_FEATURES)
