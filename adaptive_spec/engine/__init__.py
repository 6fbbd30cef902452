"""The speculative-decoding engine over transformers models.

``SpecEngine(target, draft, tokenizer).generate(prompt, plan="delayed:2x3x3/traversal")``;
without a plan it plays the plan tuned for the loaded pair (checked by model fingerprints), else
``chain:2/block``; ``plan="autoregressive"`` (or None) is plain decoding with the target (the baseline).
"""

from adaptive_spec.engine.engine import SpecEngine
from adaptive_spec.engine.logits import SamplingConfig, build_logits_processor
from adaptive_spec.engine.metrics import GenerationStats
from adaptive_spec.engine.outputs import EngineState, GenerationResult
from adaptive_spec.planner.plan import Plan, Planner, StaticPlanner, StepResult, StepState

__all__ = [
    "EngineState",
    "GenerationResult",
    "GenerationStats",
    "Plan",
    "Planner",
    "SamplingConfig",
    "SpecEngine",
    "StaticPlanner",
    "StepResult",
    "StepState",
    "build_logits_processor",
]
