"""One ``generate`` call's arguments, checked and resolved once into a frozen :class:`GenerationRequest`.

:func:`build_request` applies transformers' precedence (explicit arguments, then a
``GenerationConfig`` argument, then the target's own ``generation_config``,
:func:`~adaptive_spec.engine.settings.resolve_generation`), turns the prompt or chat into token
ids, resolves ``plan="auto"`` and cuts the budget to the context window. Every bad argument
fails here with one line, before any forward runs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from adaptive_spec.engine.logits import SamplingConfig, check_logits_processors
from adaptive_spec.engine.pretrained import eos_ids
from adaptive_spec.engine.prompts import chat_prompt, prompt_ids
from adaptive_spec.engine.settings import as_int, resolve_generation
from adaptive_spec.engine.stopping import check_stopping_criteria, split_stop
from adaptive_spec.planner.plan import Planner, as_planner

if TYPE_CHECKING:
    from adaptive_spec.engine.engine import SpecEngine

AUTO = "auto"  # generate()'s default plan: the engine's planner, else the tuned plan for this pair, else a default


@dataclass(frozen=True)
class GenerationRequest:
    """What one :meth:`~adaptive_spec.engine.SpecEngine.generate` call asks for, after every check.

    Attributes:
        prompt_ids: the prompt's token ids (a chat already rendered).
        max_new_tokens: the budget asked for.
        budget: ``max_new_tokens`` cut to the room left in the context window.
        sampling: temperature, top-k and top-p.
        processors: extra row-wise logits processors, applied after the sampling warpers.
        planner: the planner of every step; None for plain autoregressive decoding.
        seed: the generator's seed (None: random).
        eos: token ids that end generation (EOS and stop token ids).
        stop_strings: generation ends once the decoded output contains one.
        criteria: transformers stopping criteria that read only the token ids.
        streamer: a transformers-style streamer, or None.
    """

    prompt_ids: tuple[int, ...]
    max_new_tokens: int
    budget: int
    sampling: SamplingConfig
    processors: tuple[Any, ...]
    planner: Planner | None
    seed: int | None
    eos: frozenset[int]
    stop_strings: tuple[str, ...]
    criteria: tuple[Any, ...]
    streamer: Any

    @property
    def greedy(self) -> bool:
        """Temperature 0: every verifier is the greedy one."""
        return self.sampling.greedy


def build_request(
    engine: SpecEngine,
    prompt: Any = None,
    max_new_tokens: int | None = None,
    temperature: float | None = None,
    top_k: int | None = None,
    top_p: float | None = None,
    plan: Any = AUTO,
    seed: int | None = None,
    stop: Sequence[str | int] | str | None = None,
    streamer: Any = None,
    *,
    messages: Sequence[Mapping[str, Any]] | None = None,
    logits_processor: Any = None,
    stopping_criteria: Any = None,
    generation_config: Any = None,
) -> GenerationRequest:
    """The checked request of ``engine.generate(...)`` with these arguments (see its docstring).

    Raises:
        ValueError, TypeError: one line naming the argument that is wrong and why.
    """
    prompt = chat_prompt(prompt, messages, engine.tokenizer)
    extra = check_logits_processors(logits_processor)
    criteria = check_stopping_criteria(stopping_criteria)
    gen = resolve_generation(
        generation_config,
        getattr(engine.target, "generation_config", None),
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
    )
    if gen.stop_strings:
        stop = [*([stop] if isinstance(stop, (str, int)) else list(stop or [])), *gen.stop_strings]
    # Any id the target can embed is a valid input; ids past its LM head are never drafted (trees.lookup.within_vocab)
    ids = prompt_ids(prompt, engine.tokenizer, engine.input_vocab_size)
    max_new = gen.max_new_tokens
    if max_new is None and gen.max_length is not None:  # transformers: max_length counts the prompt
        max_new = as_int(gen.max_length, "max_length", 1) - len(ids)
        if max_new < 1:
            raise ValueError(
                f"max_length={gen.max_length} (from the generation config) leaves no room after the "
                f"{len(ids)}-token prompt; pass max_new_tokens="
            )
    sampling = SamplingConfig(gen.temperature, gen.top_k, gen.top_p)
    max_new = as_int(32 if max_new is None else max_new, "max_new_tokens", 1)
    seed = _check_seed_and_streamer(seed, streamer)
    if isinstance(plan, str) and plan.strip() == AUTO:
        plan = engine.planner if engine.planner is not None else engine.default_plan(sampling.temperature)
    stop_strings, stop_ids = split_stop(stop, engine.vocab_size)
    if stop_strings and engine.tokenizer is None:
        raise ValueError("stop strings need a tokenizer; pass token ids instead")
    eos = gen.eos_token_ids if gen.eos_token_ids is not None else eos_ids(engine.target, engine.tokenizer)
    planner = as_planner(plan)
    engine.check_planner(planner, sampling.greedy)  # a plan the engine cannot play fails before the prompt is fed
    return GenerationRequest(
        prompt_ids=tuple(ids),
        max_new_tokens=max_new,
        budget=_budget(max_new, len(ids), engine.max_positions),
        sampling=sampling,
        processors=(*gen.processors, *extra),
        planner=planner,
        seed=seed,
        eos=frozenset(eos | stop_ids),
        stop_strings=tuple(stop_strings),
        criteria=tuple(criteria),
        streamer=streamer,
    )


def _check_seed_and_streamer(seed: Any, streamer: Any) -> int | None:
    """The seed as an int (None stays None); a streamer must have ``put`` and ``end``."""
    if seed is not None:
        seed = as_int(seed, "seed", 0)
        if seed >= 2**64:
            raise ValueError(f"seed must be below 2**64 (a 64-bit generator seed), got {seed}")
    if streamer is not None and not (
        callable(getattr(streamer, "put", None)) and callable(getattr(streamer, "end", None))
    ):
        raise TypeError(
            f"streamer must have put(token_ids) and end() methods, like transformers' TextStreamer; "
            f"got {type(streamer).__name__}"
        )
    return seed


def _budget(max_new_tokens: int, prompt_length: int, max_positions: int | None) -> int:
    """``max_new_tokens`` cut to the room the context window leaves after the prompt."""
    if max_positions is None:
        return max_new_tokens
    room = max_positions - prompt_length
    if room < 1:
        raise ValueError(
            f"the prompt has {prompt_length} tokens and the context window is {max_positions}: "
            "no room for a new token; shorten the prompt"
        )
    return min(max_new_tokens, room)
