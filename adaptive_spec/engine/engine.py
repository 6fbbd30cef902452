"""The speculative-decoding engine: plan -> draft -> score -> verify -> commit, one step at a time.

Vocabulary as in :mod:`adaptive_spec.verifiers.base`: a step drafts a tree with the draft
model, scores every node in ONE target forward (tree attention mask + explicit position ids),
verifies it with a registered verifier, and commits the *accepted* tokens plus one
*recovered* or *bonus* token to both KV caches.

Cache convention (see :mod:`adaptive_spec.engine.runner`): after the prefill the target's
cache holds ``context[:-1]``; a step's target block is ``[context[-1]] + drafted nodes``, the
root node being the last committed token. Committing gathers the accepted nodes' KV rows
into place and crops the rest.

Vocabulary: the engine samples from the target's whole distribution (``vocab_size`` = the
target's logits). A draft with fewer logits gives the missing ids probability 0, which stays
lossless because the verifiers' residuals reach them; a draft with fewer input embeddings
reads the ids it lacks as its own last id (a draft may read anything; only its output law is
on the tree). The tokenizers must agree on the ids they share.

Root features (:mod:`adaptive_spec.engine.features`) are computed before each speculative step
only when the planner sets ``needs_features``/``needs_hidden`` or a feature log is attached;
otherwise the step runs exactly as without them (no extra forward, no extra host sync).
"""

from __future__ import annotations

import logging
import numbers
import operator
import os
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from transformers import PreTrainedModel

from adaptive_spec.engine.drafting import (
    DraftOutcome,
    DraftRoot,
    check_finite,
    draft_policy_tree,
    draft_root,
    draft_tree,
    finite_flag,
    sample_categorical,
)
from adaptive_spec.engine.eagle import EagleRunner, is_eagle_head
from adaptive_spec.engine.features import LatencyFeatures, RootFeatures, RootTracker
from adaptive_spec.engine.logits import ProbsFn, SamplingConfig, build_logits_processor, check_logits_processors
from adaptive_spec.engine.metrics import GenerationStats, PhaseTimer
from adaptive_spec.engine.runner import ModelRunner
from adaptive_spec.planner.plan import Plan, Planner, StepResult, StepState, as_plan, as_planner
from adaptive_spec.trees import TreeShape, block_ancestors, block_positions
from adaptive_spec.trees.lookup import lookup_tree, ngram_lookup
from adaptive_spec.verifiers import REGISTRY, verify

if TYPE_CHECKING:
    from adaptive_spec.formats.feature_log import FeatureLogger

AUTO = "auto"  # generate()'s default plan: the engine's planner, else the tuned plan for this pair, else a default
_log = logging.getLogger("adaptive_spec.engine")


@dataclass
class GenerationResult:
    """The output of :meth:`SpecEngine.generate`.

    Attributes:
        token_ids: the generated tokens (EOS or the stop string included when generation
            ended on one), prompt excluded.
        text: ``token_ids`` decoded with special tokens skipped (None without a tokenizer).
        stats: counters and timings, see :class:`GenerationStats`.
        steps: one :class:`StepResult` per speculative step (empty for autoregressive decoding).
        state: the final :class:`EngineState` (models' caches included) when asked for with
            ``keep_state=True``, else None.
        finish_reason: ``"stop"`` or ``"length"`` (``stats.stop_reason`` has the detail:
            ``eos``, ``stop``, ``max_new_tokens`` or ``context_window``).
    """

    token_ids: list[int]
    text: str | None
    stats: GenerationStats
    steps: list[StepResult] = field(default_factory=list)
    state: EngineState | None = None

    @property
    def finish_reason(self) -> str:
        """Why generation stopped, as in vLLM's ``RequestOutput``: ``"stop"`` (an EOS token, a stop
        token or a stop string) or ``"length"`` (``max_new_tokens`` or the context window).
        """
        return "stop" if self.stats.stop_reason in ("eos", "stop") else "length"


@dataclass
class EngineState:
    """Everything one ``generate`` call mutates, passed explicitly through the loop.

    Attributes:
        context: committed tokens, prompt then generated.
        prompt_length: number of prompt tokens.
        target: the target model with its cache.
        draft: the draft model with its cache (None for autoregressive decoding).
        generator: the source of every random draw.
        stats: running statistics.
        steps: step results so far.
        root: the root-feature tracker, when features are computed (else None).
    """

    context: list[int]
    prompt_length: int
    target: ModelRunner
    draft: ModelRunner | None
    generator: torch.Generator
    stats: GenerationStats
    steps: list[StepResult] = field(default_factory=list)
    root: RootTracker | None = None

    @property
    def generated(self) -> list[int]:
        return self.context[self.prompt_length :]


@dataclass
class _Run:
    """One generation's fixed settings and state, built by ``SpecEngine._setup``."""

    state: EngineState
    sampling: SamplingConfig
    top_k: int
    planner: Planner | None  # None: plain autoregressive decoding
    target_probs_fn: ProbsFn
    draft_probs_fn: ProbsFn
    soft_probs_fn: ProbsFn  # the processed softmax of the target's rows (one-hot rows at T=0 are not)
    eos: set[int]
    stop_strings: list[str]
    criteria: Sequence[Any]
    max_new_tokens: int
    budget: int  # max_new_tokens, cut to the context window
    log: Any
    key: str
    streamer: Any
    timer: PhaseTimer
    t_start: float


@dataclass
class _StepOutput:
    """What one decoding step produced, before the emission rules."""

    context_length: int
    emitted: list[int] = field(default_factory=list)
    result: StepResult | None = None
    features: Any = None
    propensity: float | None = None


class SpecEngine:
    """Lossless speculative decoding with a target and a draft transformers model.

    Args:
        target: the target causal LM (``PreTrainedModel``), eager or SDPA attention.
        draft: the draft causal LM; same tokenizer as the target.
        tokenizer: the shared tokenizer (needed for text prompts and ``text`` outputs).
        device: where to run both models (default: the target's device).
        dtype: cast both models to this dtype (default: leave them as they are).
        draft_tokenizer: the draft's tokenizer, if separate; it must agree with ``tokenizer``
            on every token id below ``vocab_size``.
        planner: what :meth:`generate` uses when it is given no ``plan``: a plan, plan string
            or planner (default None: the tuned plan for this model pair if a plan file was
            tuned for it, else ``chain:2/block``; see :meth:`default_plan`).
        feature_log: log every speculative step's features: a directory, or a
            :class:`~adaptive_spec.formats.feature_log.FeatureLogger` for other settings (shard size,
            hidden states, run id). See :mod:`adaptive_spec.formats.feature_log`.
        latency_model: source of the latency features (anything with
            ``features(context_length)``, e.g. ``adaptive_spec.planner.LatencyModel``); they are
            0 without one.

    Raises:
        ValueError: unsupported attention implementation or cache type, mismatched
            tokenizers, or a feature log directory holding another schema or other models.
    """

    def __init__(
        self,
        target: PreTrainedModel,
        draft: PreTrainedModel,
        tokenizer: Any = None,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        *,
        draft_tokenizer: Any = None,
        planner: Plan | str | Any = None,
        feature_log: str | os.PathLike | FeatureLogger | None = None,
        latency_model: LatencyFeatures | None = None,
    ) -> None:
        device = torch.device(device) if device is not None else target.device
        if is_eagle_head(draft) and not draft.bound:
            draft.bind(target)  # an EAGLE head reads the target's token embeddings
        self.target = _place(target, "target", device, dtype)
        self.draft = _place(draft, "draft", device, dtype)
        self.device = device
        self.tokenizer = tokenizer
        # The engine's vocabulary is the target's: a draft with fewer logits gives the missing
        # ids probability 0 (still lossless: the residual reaches them), and a draft with fewer
        # input embeddings reads them as its own last id (any draft input is lossless).
        self.vocab_size = _logits_size(self.target)
        self.draft_vocab_size = _logits_size(self.draft)
        self.input_vocab_size = int(self.target.get_input_embeddings().weight.shape[0])
        draft_inputs = int(self.draft.get_input_embeddings().weight.shape[0])
        self.draft_input_limit = draft_inputs if draft_inputs < self.input_vocab_size else None
        if tokenizer is not None and draft_tokenizer is not None:
            check_same_tokenizer(tokenizer, draft_tokenizer, min(len(tokenizer), len(draft_tokenizer)))
        windows = [_context_window(m) for m in (self.target, self.draft)]
        windows = [w for w in windows if w]
        self.max_positions: int | None = min(windows) if windows else None
        self.eos_token_ids = _eos_ids(self.target, tokenizer)
        # Check the attention implementations now rather than at the first call.
        ModelRunner(self.target)
        _draft_runner(self.draft)
        self.sync_timing = True  # CUDA: synchronise at phase boundaries so that phase times are real
        self.hidden_sizes = tuple(m.get_output_embeddings().weight.shape[1] for m in (self.draft, self.target))
        self.planner = planner
        self.latency_model = latency_model
        # Tuned plan files tried by default_plan() (None: configs/plans/in-draft.yaml, then best-static.yaml).
        self.tuned_plan_files: Sequence[str | os.PathLike] | None = None
        self._fingerprints: dict[str, str] | None = None
        self._default_plans: dict[tuple[Any, float], Plan] = {}
        self.feature_log: FeatureLogger | None = None
        # Called as node_log(tree, fed, target_probs, temperature) after each speculative step's
        # target pass, with ``fed[i]`` whether node i was run through the draft (the in-draft
        # decisions): :class:`adaptive_spec.formats.nodes.NodeLogger` logs per-node features and
        # soft acceptance labels for the acceptance model. Its time counts in the step's "other".
        self.node_log: Any = None
        if feature_log is not None:
            from adaptive_spec.formats.feature_log import FeatureLogger

            log = feature_log if isinstance(feature_log, FeatureLogger) else FeatureLogger(feature_log)
            log.attach(self.describe())
            self.feature_log = log

    def describe(self) -> dict[str, Any]:
        """The engine's configuration, as recorded in a feature log's manifest.

        Returns:
            ``{"models": ..., "run": ...}``: ``models`` (both config dicts, vocabulary size,
            dtypes, hidden sizes) must match for logs to be mixed; ``run`` (model names or
            paths, device, package versions) describes this engine only.
        """
        import platform
        from importlib.metadata import PackageNotFoundError, version

        def config(model: PreTrainedModel, hidden: int) -> dict[str, Any]:
            cfg = model.config.to_dict()
            for key in ("_name_or_path", "transformers_version", "dtype", "torch_dtype"):
                cfg.pop(key, None)
            return {"config": cfg, "dtype": str(model.dtype).removeprefix("torch."), "hidden_size": hidden,
                    "logits_size": _logits_size(model)}  # fmt: skip

        versions = {"python": platform.python_version()}
        for pkg in ("adaptive-spec", "torch", "transformers", "numpy"):
            try:
                versions[pkg] = version(pkg)
            except PackageNotFoundError:
                versions[pkg] = None
        return {
            "models": {
                "target": config(self.target, self.hidden_sizes[1]),
                "draft": config(self.draft, self.hidden_sizes[0]),
                "vocab_size": self.vocab_size,
            },
            "run": {
                "target": getattr(self.target, "name_or_path", "") or None,
                "draft": getattr(self.draft, "name_or_path", "") or None,
                "device": str(self.device),
                "versions": versions,
            },
        }

    def close(self) -> None:
        """Flush and close the feature log, if any (also done at interpreter exit)."""
        if self.feature_log is not None:
            self.feature_log.close()

    def __enter__(self) -> SpecEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ loading
    @classmethod
    def from_pretrained(
        cls,
        target: str | None = None,
        draft: str | None = None,
        *,
        device: torch.device | str | None = None,
        dtype: torch.dtype | str | None = None,
        attn_implementation: str = "sdpa",
        trust_remote_code: bool = False,
        local_files_only: bool | None = None,
        revision: str | None = None,
        token: str | bool | None = None,
        quantization_config: Any = None,
        device_map: str | dict[str, Any] | None = None,
        offload_folder: str | os.PathLike | None = None,
        **engine_kwargs: Any,
    ) -> SpecEngine:
        """Load target, draft and their tokenizers from local directories or hub ids.

        With no model arguments, loads the built-in default pair (``adaptive_spec.zoo``),
        in float32 on CPU (its checkpoint is float16, which is slow on CPUs) unless
        ``dtype`` says otherwise. Local directories need no network. ``trust_remote_code``
        stays off unless asked; ``local_files_only`` defaults to True when both paths are
        existing directories. ``revision``, ``token`` and ``quantization_config`` go to
        transformers' ``from_pretrained`` as they are (the first two to the tokenizers too).
        Other keyword arguments (``planner``, ``feature_log``, ``latency_model``) go to the
        constructor.

        ``device_map`` (``"auto"``, ``"cpu"``, a dict, ...) goes to the *target*'s
        ``from_pretrained`` (needs ``accelerate``), so that a large target can be spread over
        several devices (and offloaded); the draft is loaded onto the device of the target's
        input embeddings, where the engine keeps its tensors. Give ``device`` or
        ``device_map``, not both. ``offload_folder`` goes with it, for modules mapped to ``"disk"``.

        A hub name (``org/name``) is checked before anything is downloaded: offline
        (``HF_HUB_OFFLINE=1``, or no connection to the hub) it loads from the local Hugging
        Face cache, or fails at once with one line saying so.

        Raises:
            ValueError: the two tokenizers disagree; a local path that is not a directory; a hub
                name that is neither cached nor reachable; ``device`` and ``device_map`` together.
        """
        import os

        from transformers import AutoModelForCausalLM, AutoTokenizer

        if isinstance(dtype, str):
            dtype = _parse_dtype(dtype)
        if device is not None and device_map is not None:
            raise ValueError("give device= (both models on one device) or device_map= (the target spread), not both")
        if target is None and draft is None:
            from adaptive_spec.files import default_pair_path

            root = default_pair_path()
            target, draft = str(root / "target"), str(root / "draft")
            if dtype is None and torch.device(device or "cpu").type == "cpu" and device_map is None:
                dtype = torch.float32
        else:
            from adaptive_spec.engine.models import SHORT_NAMES, resolve_pair

            named = target in SHORT_NAMES or draft in SHORT_NAMES
            target, draft = resolve_pair(target, draft)  # short names: builtin, smollm2, smollm2-eagle, ...
            if named and dtype is None and torch.device(device or "cpu").type == "cpu" and device_map is None:
                dtype = torch.float32
        if target is None or draft is None:
            raise ValueError(
                "give both target and draft, a short-named target (builtin, smollm2) alone, or neither for the "
                "built-in default pair"
            )
        for role, path in (("target", target), ("draft", draft)):
            _check_model_path(role, str(path))
        if local_files_only is None:
            local_files_only = os.path.isdir(target) and os.path.isdir(draft)
        if not local_files_only:  # hub names: cached, or reachable, or one clear line now
            cached = [_check_hub_name(role, str(p), revision) for role, p in (("target", target), ("draft", draft))]
            local_files_only = all(cached)
        kw: dict[str, Any] = {"trust_remote_code": trust_remote_code, "local_files_only": local_files_only}
        if revision is not None:
            kw["revision"] = revision
        if token is not None:
            kw["token"] = token
        model_kw: dict[str, Any] = {"dtype": dtype or "auto", "attn_implementation": attn_implementation, **kw}
        if quantization_config is not None:
            model_kw["quantization_config"] = quantization_config
        if device_map is not None:
            _check_accelerate()
            offload = {"offload_folder": str(offload_folder)} if offload_folder is not None else {}
            target_model = AutoModelForCausalLM.from_pretrained(target, device_map=device_map, **offload, **model_kw)
            draft_model = AutoModelForCausalLM.from_pretrained(draft, **model_kw).to(target_model.device)
            models = [target_model, draft_model]
        else:
            models = [AutoModelForCausalLM.from_pretrained(path, **model_kw) for path in (target, draft)]
        tokenizer = AutoTokenizer.from_pretrained(target, **kw)
        try:
            draft_tokenizer = AutoTokenizer.from_pretrained(draft, **kw)
        except (OSError, ValueError):  # a draft saved without its tokenizer shares the target's
            draft_tokenizer = None
        if device is not None:  # models loaded here are ours to move (no in-place warning)
            models = [m.to(torch.device(device)) for m in models]
        return cls(
            models[0],
            models[1],
            tokenizer,
            device=device,
            draft_tokenizer=draft_tokenizer,
            **engine_kwargs,
        )

    # ------------------------------------------------------------------ public API
    def fingerprints(self) -> dict[str, str]:
        """``{"target": ..., "draft": ...}``: the pair's model fingerprints (computed once).

        Each hashes the model's config, the engine tokenizer's vocabulary and a sample of its
        weights (:func:`~adaptive_spec.engine.fingerprint.model_fingerprint`): the same whatever
        device or dtype the checkpoint was loaded with. Tuned plan files record the fingerprints
        of the pair they were tuned for.
        """
        if self._fingerprints is None:
            from adaptive_spec.engine.fingerprint import pair_fingerprints

            self._fingerprints = pair_fingerprints(self.target, self.draft, self.tokenizer)
        return self._fingerprints

    def default_plan(self, temperature: float) -> Plan:
        """The plan :meth:`generate` plays at ``temperature`` when given no plan and the engine has no planner.

        The in-draft planner's plan (``configs/plans/in-draft.yaml``) when that file was tuned
        for this model pair, checked against the model fingerprints in its metadata; else the
        tuned best static plan (``configs/plans/best-static.yaml``) on the same condition; else
        ``chain:2/block``. Plans tuned per temperature are taken at the nearest tuned
        temperature of the same kind (greedy or sampling). The choice and its reason are logged
        (``logging.INFO``, logger ``adaptive_spec.engine``) once per temperature. See
        :mod:`adaptive_spec.engine.auto_plan`.
        """
        from adaptive_spec.engine.auto_plan import choose_default_plan

        files = None if self.tuned_plan_files is None else tuple(map(str, self.tuned_plan_files))
        key = (files, float(temperature))
        if key not in self._default_plans:
            plan, why = choose_default_plan(self.fingerprints(), temperature, self.tuned_plan_files)
            _log.info("generate(): plan %s at temperature %g: %s", plan, temperature, why)
            self._default_plans[key] = plan
        return self._default_plans[key]

    def generate(
        self,
        prompt: str | Sequence[int] | torch.Tensor | Mapping[str, Any] | None = None,
        max_new_tokens: int | None = None,
        temperature: float | None = None,
        top_k: int | None = None,
        top_p: float | None = None,
        plan: Plan | str | Any = AUTO,
        seed: int | None = None,
        stop: Sequence[str | int] | str | None = None,
        streamer: Any = None,
        keep_state: bool = False,
        *,
        messages: Sequence[Mapping[str, Any]] | None = None,
        logits_processor: Any = None,
        stopping_criteria: Any = None,
        generation_config: Any = None,
    ) -> GenerationResult:
        """Generate up to ``max_new_tokens`` tokens after ``prompt``.

        Sampling settings follow transformers' precedence: explicit arguments, then the
        ``generation_config`` argument, then the target's own ``model.generation_config`` (read
        at each call; its ``temperature``, ``top_k``, ``top_p``, ``do_sample``, ``min_p``,
        ``typical_p``, ``epsilon_cutoff``, ``max_new_tokens``/``max_length``, ``eos_token_id``
        and ``stop_strings``), then the engine's defaults: 32 new tokens, sampling at
        temperature 1, no top-k or top-p (transformers' own defaults would be greedy, 20 tokens
        in all, top-k 50). A ``do_sample=False`` from either config means temperature 0 unless
        ``temperature`` is passed explicitly.

        Args:
            prompt: text (needs a tokenizer), token ids (list, 1-D tensor or [1, n] tensor), or
                the ``BatchEncoding``/dict of a tokenizer call or of ``apply_chat_template(...,
                return_dict=True)``. Leave it out when giving ``messages``.
            max_new_tokens: exact budget of new tokens (>= 1).
            temperature: 0 = greedy (the ``greedy`` verifier is used whatever the plan says;
                the plan's tree shape is still drafted); > 0 samples.
            top_k: top-k filter (0 disables), applied to draft and target alike.
            top_p: nucleus filter (1 disables), applied to draft and target alike.
            plan: ``"auto"`` (the default): the engine's ``planner`` if it has one, else
                :meth:`default_plan` (the plan tuned for this model pair, checked by model
                fingerprints, else ``chain:2/block``; logged at INFO level). ``"autoregressive"``
                (or None): plain decoding with the target, the baseline. A :class:`Plan`; a plan
                string ``"<tree shape>/<verifier>"`` such as ``"delayed:2x3x3/traversal"``, or
                ``"<drafting policy>/<verifier>"`` such as ``"conf-chain:12:0.4/block"`` (a tree
                grown while drafting, :mod:`adaptive_spec.trees.policy`); or a planner with
                ``choose(state) -> Plan`` (and optionally ``observe(step_result)``). Every plan
                is lossless: the verifier registry refuses a verifier that is not for the law.
            seed: seeds the ``torch.Generator`` every random draw comes from (None: random).
            stop: extra stop conditions: strings (generation stops once the decoded output
                contains one; ``text`` ends with it, cut right after its first occurrence, as vLLM and
                OpenAI-style servers do, while ``token_ids`` keep the whole token that completed it,
                whose text may run past it) and/or token ids (treated as EOS).
            streamer: a transformers-style streamer (``put(tensor)``/``end()``), e.g.
                ``TextStreamer``; it first receives the prompt ids, then each step's tokens.
            keep_state: attach the final :class:`EngineState` (with both KV caches) to the
                result, for inspection.
            messages: a chat, ``[{"role": "user", "content": "..."}, ...]``, rendered with the
                tokenizer's chat template (with the generation prompt) instead of ``prompt``.
            logits_processor: extra transformers logits processors, applied to the draft's and
                the target's rows alike after the sampling warpers. Only processors that act on
                each row alone are lossless and accepted
                (:data:`~adaptive_spec.engine.logits.ROW_WISE_PROCESSORS`: temperature, top-k,
                top-p, min-p, typical, epsilon, eta, top-h, suppressed tokens, inf/NaN removal);
                history-dependent ones (repetition penalty, n-gram bans, minimum length, bad
                words, ...) are refused with a ValueError.
            generation_config: a transformers ``GenerationConfig``; its fields fill the arguments
                left out (see above). Settings the engine cannot apply losslessly
                (``repetition_penalty``, ``no_repeat_ngram_size``, ``min_new_tokens``, beams,
                ...) are refused with a ValueError; in the target's own ``generation_config``
                they are ignored with a warning.
            stopping_criteria: transformers stopping criteria that read only the token ids,
                checked after every emitted token as in ``generate`` (the output is cut at the
                first token that meets one): ``MaxLengthCriteria``, ``MaxTimeCriteria``,
                ``StopStringCriteria``, ``EosTokenCriteria``. Criteria that read the scores
                (``ConfidenceCriteria``, custom ones) are refused: a speculative step emits
                several tokens without per-token scores.

        Returns:
            A :class:`GenerationResult`.

        Raises:
            ValueError: invalid prompt, sampling parameters, plan or budget; NaN/inf logits.
        """
        it = self._start(
            prompt, max_new_tokens, temperature, top_k, top_p, plan, seed, stop, streamer, messages=messages,
            logits_processor=logits_processor, stopping_criteria=stopping_criteria,
            generation_config=generation_config,
        )  # fmt: skip
        while True:
            try:
                next(it)
            except StopIteration as done:
                result: GenerationResult = done.value
                if not keep_state:
                    result.state = None
                return result

    def stream(self, prompt: str | Sequence[int] | torch.Tensor | None = None, **kwargs: Any) -> Iterator[str]:
        """Like :meth:`generate`, but yield the generated text in chunks as steps complete.

        Needs a tokenizer. A chunk is held back while it ends in an incomplete UTF-8
        character. Keyword arguments are those of :meth:`generate` (but ``keep_state``).
        """
        if self.tokenizer is None:
            raise ValueError("stream() needs a tokenizer; pass tokenizer= to SpecEngine")
        try:
            it = self._start(prompt, **kwargs)
        except TypeError as err:
            raise TypeError(f"stream() got unexpected arguments: {err}") from None
        generated: list[int] = []
        sent = ""
        for chunk in it:
            generated.extend(chunk)
            text = self.tokenizer.decode(generated, skip_special_tokens=True)
            if text.endswith("\ufffd") or len(text) <= len(sent):
                continue
            yield text[len(sent) :]
            sent = text
        text = self.tokenizer.decode(generated, skip_special_tokens=True)
        if len(text) > len(sent):
            yield text[len(sent) :]

    def _start(
        self,
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
    ) -> Iterator[list[int]]:
        """Check the arguments, resolve the generation settings and return the loop's iterator."""
        prompt = self._chat_prompt(prompt, messages)
        extra = check_logits_processors(logits_processor)
        criteria = _check_stopping_criteria(stopping_criteria)
        gen = resolve_generation(
            generation_config, getattr(self.target, "generation_config", None),
            max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p,
        )  # fmt: skip
        if gen.stop_strings:
            stop = [*([stop] if isinstance(stop, (str, int)) else list(stop or [])), *gen.stop_strings]
        max_new = gen.max_new_tokens
        if max_new is None and gen.max_length is not None:  # transformers: max_length counts the prompt
            prompt = self._prompt_ids(prompt)
            max_new = _as_int(gen.max_length, "max_length", 1) - len(prompt)
            if max_new < 1:
                raise ValueError(
                    f"max_length={gen.max_length} (from the generation config) leaves no room after the "
                    f"{len(prompt)}-token prompt; pass max_new_tokens="
                )
        eos = gen.eos_token_ids if gen.eos_token_ids is not None else _eos_ids(self.target, self.tokenizer)
        return self._run(
            prompt, 32 if max_new is None else max_new, gen.temperature, gen.top_k, gen.top_p, plan, seed, stop,
            streamer, [*gen.processors, *extra], criteria, eos,
        )  # fmt: skip

    # ------------------------------------------------------------------ the loop
    def _run(
        self,
        prompt: str | Sequence[int] | torch.Tensor,
        max_new_tokens: int,
        temperature: float,
        top_k: int,
        top_p: float,
        plan: Any,
        seed: int | None,
        stop: Sequence[str | int] | str | None,
        streamer: Any,
        extra_processors: Sequence[Any] = (),
        criteria: Sequence[Any] = (),
        eos_ids: set[int] | None = None,
    ) -> Iterator[list[int]]:
        """Yield each step's emitted tokens; return the :class:`GenerationResult`.

        One decoding step is :meth:`_step` (plan -> draft -> one target pass -> verify ->
        commit); the emission rules (:meth:`_emit`), logging and streaming go around it.
        """
        run = self._setup(prompt, max_new_tokens, temperature, top_k, top_p, plan, seed, stop, streamer,
                          extra_processors, criteria, eos_ids)  # fmt: skip
        self._prefill(run)
        while True:
            step = self._step(run)
            emitted, reason = self._emit(run, step.emitted)
            run.timer.switch(None)
            self._log_step(run, step, emitted)  # untimed, so that logging does not count as a step's time
            if run.streamer is not None and emitted:
                run.streamer.put(torch.tensor(emitted))
            if emitted:
                yield emitted
            run.timer.switch("other")
            if reason:
                run.state.stats.stop_reason = reason
                break
        return self._finish(run)

    def _setup(
        self, prompt: Any, max_new_tokens: int, temperature: float, top_k: int, top_p: float, plan: Any,
        seed: int | None, stop: Any, streamer: Any, extra_processors: Sequence[Any], criteria: Sequence[Any],
        eos_ids: set[int] | None,
    ) -> _Run:  # fmt: skip
        """Check the arguments; build the sampling functions, the planner hooks and the state."""
        t_start = time.perf_counter()
        prompt_ids = self._prompt_ids(prompt)
        sampling = SamplingConfig(temperature, top_k, top_p)
        max_new_tokens = _as_int(max_new_tokens, "max_new_tokens", 1)
        if seed is not None:
            seed = _as_int(seed, "seed", 0)
            if seed >= 2**64:
                raise ValueError(f"seed must be below 2**64 (a 64-bit generator seed), got {seed}")
        if streamer is not None and not (
            callable(getattr(streamer, "put", None)) and callable(getattr(streamer, "end", None))
        ):
            raise TypeError(
                f"streamer must have put(token_ids) and end() methods, like transformers' TextStreamer; "
                f"got {type(streamer).__name__}"
            )
        if isinstance(plan, str) and plan.strip() == AUTO:
            plan = self.planner if self.planner is not None else self.default_plan(sampling.temperature)
        planner = as_planner(plan)  # None: plain autoregressive decoding
        # Root features only when asked for (autoregressive decoding has no speculative steps).
        log = self.feature_log if planner is not None else None
        planner_wants = planner is not None and planner.needs_features_for(temperature, top_p)
        want_hidden = (planner_wants and planner.needs_hidden) or (log is not None and log.hidden)
        want_features = want_hidden or planner_wants or log is not None
        stop_strings, stop_ids = _split_stop(stop, self.vocab_size)
        if stop_strings and self.tokenizer is None:
            raise ValueError("stop strings need a tokenizer; pass token ids instead")
        eos = (self.eos_token_ids if eos_ids is None else set(eos_ids)) | stop_ids
        budget = max_new_tokens
        if self.max_positions is not None:
            room = self.max_positions - len(prompt_ids)
            if room < 1:
                raise ValueError(
                    f"the prompt has {len(prompt_ids)} tokens and the context window is {self.max_positions}: "
                    "no room for a new token; shorten the prompt"
                )
            budget = min(budget, room)

        processors = build_logits_processor(sampling.generation_config())
        processors.extend(extra_processors)
        target_probs_fn = ProbsFn(processors, self.vocab_size, one_hot=sampling.greedy)
        # At T=0 the draft drafts from its untempered softmax (any draft is fine for greedy verification).
        draft_ids = self.draft.token_ids if is_eagle_head(self.draft) else None  # a reduced draft vocabulary
        draft_probs_fn = ProbsFn(processors, self.vocab_size, one_hot=False, token_ids=draft_ids)
        soft_probs_fn = ProbsFn(processors, self.vocab_size, one_hot=False)  # the target's rows, for features

        generator = torch.Generator(device=self.device)
        if seed is None:
            generator.seed()
        else:
            generator.manual_seed(int(seed))

        stats = GenerationStats()
        state = EngineState(
            context=list(prompt_ids),
            prompt_length=len(prompt_ids),
            target=ModelRunner(
                self.target, keep_hidden=want_hidden, keep_features=planner is not None and is_eagle_head(self.draft)
            ),
            draft=_draft_runner(self.draft, keep_hidden=want_hidden, input_limit=self.draft_input_limit)
            if planner is not None
            else None,
            generator=generator,
            stats=stats,
        )
        if want_features:
            state.root = RootTracker(temperature, top_p, self.latency_model, want_hidden, self.hidden_sizes)
        return _Run(
            state=state, sampling=sampling, top_k=top_k, planner=planner,
            target_probs_fn=target_probs_fn, draft_probs_fn=draft_probs_fn, soft_probs_fn=soft_probs_fn, eos=eos,
            stop_strings=stop_strings,
            criteria=criteria, max_new_tokens=max_new_tokens, budget=budget, log=log,
            key=_prompt_key(prompt_ids) if log is not None else "", streamer=streamer,
            timer=PhaseTimer(stats.phase_times_s, self.device, self.sync_timing), t_start=t_start,
        )  # fmt: skip

    def _prefill(self, run: _Run) -> None:
        """Feed the prompt but its last token (the first step's root) to both models."""
        state = run.state
        if run.streamer is not None:
            run.streamer.put(torch.tensor([state.context]))
        # Inference mode is entered around each forward-running call, never across a yield.
        with torch.inference_mode():
            prompt_t = torch.tensor(state.context, dtype=torch.long, device=self.device)
            run.timer.switch("target")
            logits_t = state.target.chain_forward(prompt_t[:-1], logits_to_keep=1)  # [1, V'] over the root, or None
            logits_d = None
            if isinstance(state.draft, EagleRunner) and logits_t is not None:
                state.draft.set_target_features(0, state.target.features)
            if state.draft is not None:
                run.timer.switch("draft")
                logits_d = state.draft.chain_forward(prompt_t[:-1], logits_to_keep=1)
            run.timer.switch("other")
            if state.root is not None and logits_t is not None:  # the previous rows of the first step
                hidden = state.target.hidden[-1] if state.target.keep_hidden else None
                state.root.set_previous(run.soft_probs_fn(logits_t)[0], run.draft_probs_fn(logits_d)[0], hidden)

    def _step(self, run: _Run) -> _StepOutput:
        """One decoding step: plan -> draft -> one target pass -> verify -> commit (or one autoregressive token)."""
        state, sampling = run.state, run.sampling
        remaining = run.budget - len(state.generated)
        out = _StepOutput(context_length=len(state.context))
        if run.planner is None:
            out.emitted = self._autoregressive_step(state, run.target_probs_fn, sampling.greedy, run.timer)
        else:
            root = None
            if state.root is not None:  # the first draft forward runs before the planner chooses
                root, out.features = self._root_features(state, run.draft_probs_fn, run.timer, run.log is not None)
            f = out.features
            step_state = StepState(
                step=state.stats.steps, context_length=out.context_length, generated=len(state.generated),
                remaining=remaining, temperature=float(sampling.temperature),
                last=state.steps[-1] if state.steps else None, features=f.values if f is not None else None,
                draft_hidden=f.draft_hidden if f is not None else None,
                target_hidden=f.target_hidden if f is not None else None, top_p=float(sampling.top_p),
            )  # fmt: skip
            plan = as_plan(run.planner.choose(step_state)).truncated(remaining - 1)  # 1) plan
            out.propensity = run.planner.last_propensity
            # 2) draft, 3) one target pass, 4) verify, 5) commit
            out.result = self._speculative_step(
                state, plan, sampling, run.target_probs_fn, run.draft_probs_fn, run.timer, root, step_state.features,
                run.soft_probs_fn,
            )  # fmt: skip
            state.steps.append(out.result)
            out.emitted = list(out.result.tokens)
            run.planner.observe(out.result)
        state.stats.steps += 1
        return out

    def _emit(self, run: _Run, emitted: list[int]) -> tuple[list[int], str]:
        """Commit a step's tokens to the context, cut at the budget, EOS, a stop string or a criterion.

        Returns the tokens emitted and the finish reason ("" to go on).
        """
        state = run.state
        remaining = run.budget - len(state.generated)
        emitted = emitted[:remaining]
        reason = "max_new_tokens" if len(emitted) == remaining else ""
        for i, tok in enumerate(emitted):
            if tok in run.eos:
                emitted, reason = emitted[: i + 1], "eos"
                break
        before = len(state.generated)
        state.context.extend(emitted)
        if run.stop_strings:
            cut = self._stop_string_cut(state.generated, before, run.stop_strings)
            if cut is not None:
                del state.context[state.prompt_length + cut :]
                emitted, reason = state.generated[before:], "stop"
        if run.criteria:
            cut = _criteria_cut(run.criteria, state.context, state.prompt_length + before)
            if cut is not None:
                del state.context[cut:]
                emitted, reason = state.generated[before:], "stop"
        if reason == "max_new_tokens" and run.budget < run.max_new_tokens and len(state.generated) == run.budget:
            reason = "context_window"
        return emitted, reason

    def _log_step(self, run: _Run, step: _StepOutput, emitted: list[int]) -> None:
        """Append the step's root features and outcome to the feature log, if any."""
        if run.log is None or step.result is None:
            return
        f, result = step.features, step.result
        run.log.log_step(
            prompt_key=run.key, step=run.state.stats.steps - 1, features=f.values, draft_hidden=f.draft_hidden_host,
            target_hidden=f.target_hidden_host, action=str(result.plan), num_nodes=result.num_nodes,
            accepted=result.num_accepted, emitted=len(emitted), times=result.times,
            context_ids=run.state.context[: step.context_length], top_k=run.top_k, propensity=step.propensity,
        )  # fmt: skip

    def _finish(self, run: _Run) -> GenerationResult:
        """Close the log and the streamer; fill the statistics; the result."""
        state, stats = run.state, run.state.stats
        run.timer.switch(None)
        if run.log is not None:
            run.log.end_generation()
        if run.streamer is not None:
            run.streamer.end()
        stats.new_tokens = len(state.generated)
        stats.target_forwards = state.target.forwards
        stats.draft_forwards = state.draft.forwards if state.draft is not None else 0
        stats.wall_time_s = time.perf_counter() - run.t_start
        text = self.tokenizer.decode(state.generated, skip_special_tokens=True) if self.tokenizer is not None else None
        if text is not None and stats.stop_reason == "stop" and run.stop_strings:
            text = _cut_at_stop(text, run.stop_strings)
        return GenerationResult(list(state.generated), text, stats, state.steps, state)

    @torch.inference_mode()
    def _autoregressive_step(
        self, state: EngineState, target_probs_fn: ProbsFn, greedy: bool, timer: PhaseTimer
    ) -> list[int]:
        """One plain target decoding step (the baseline): feed the pending token, sample the next."""
        timer.switch("target")
        target = state.target
        pending = torch.tensor(state.context[target.cached :], dtype=torch.long, device=self.device)
        logits = target.chain_forward(pending, logits_to_keep=1)  # [1, V']
        probs = target_probs_fn(logits)  # [1, V]
        check_finite(finite_flag(logits, probs), "target")
        # Greedy: the target's rows are one-hot at the processed argmax.
        token = probs[0].argmax() if greedy else sample_categorical(probs, state.generator)[0]
        state.stats.accept_lengths.append(0)
        state.stats.tree_sizes.append(1)
        timer.switch("other")
        return [int(token.item())]

    @torch.inference_mode()
    def _speculative_step(
        self,
        state: EngineState,
        plan: Plan,
        sampling: SamplingConfig,
        target_probs_fn: ProbsFn,
        draft_probs_fn: ProbsFn,
        timer: PhaseTimer,
        root: DraftRoot | None = None,
        features: Mapping[str, float] | None = None,
        soft_probs_fn: ProbsFn | None = None,
    ) -> StepResult:
        """Draft, score, verify and commit one tree (``root``: the first draft forward, if already run).

        ``features``: the step's root features, passed on to a drafting policy.
        """
        target, draft = state.target, state.draft
        assert draft is not None
        verifier = "greedy" if sampling.greedy else plan.verifier
        if not sampling.greedy and REGISTRY[verifier].greedy_only:
            raise ValueError(
                f"verifier {verifier!r} is only lossless at temperature 0; use temperature=0 or another verifier"
            )
        device = self.device
        n_ctx = len(state.context)

        # 1) draft the tree
        timer.switch("draft")
        pending = root  # the first draft forward, if already run; else the pending tokens (root last)
        if pending is None:
            pending = torch.tensor(state.context[draft.cached :], dtype=torch.long, device=device)
        if plan.source == "lookup":  # found in the context: one-hot rows, no draft forward
            outcome = _lookup_outcome(state.context, plan.shape.depth, self.vocab_size, device, root)
        elif plan.policy is not None and plan.shape.depth > 0:
            outcome = draft_policy_tree(
                draft, pending, plan.policy, draft_probs_fn, state.generator, sampling.greedy,
                temperature=sampling.temperature, features=features,
            )  # fmt: skip
        else:
            shape = plan.shape if plan.policy is None else TreeShape.chain(0)
            outcome = draft_tree(draft, pending, shape, draft_probs_fn, state.generator, sampling.greedy)
        tree = outcome.tree
        N = tree.num_nodes
        state.stats.policy_levels += outcome.policy_levels
        state.stats.policy_decision_s += outcome.policy_decision_s

        # 2) score every node in one target forward: block = pending (root last) + drafted nodes
        timer.switch("target")
        target_base = target.cached
        p = n_ctx - target_base
        ids = torch.tensor(state.context[target_base:] + tree.tokens[1:], dtype=torch.long, device=device)
        pos = block_positions(target_base, p, tree.depths, device)
        anc = block_ancestors(p, outcome.ancestors)  # [block, block]
        logits = target.block_forward(ids, pos, anc, logits_to_keep=N)  # [N, V']
        target_probs = target_probs_fn(logits)  # [N, V]
        check_finite(finite_flag(logits, target_probs), "target")

        # 3) verify
        timer.switch("verify")
        result = verify(verifier, tree, target_probs, state.generator, allow_lossy=plan.allow_lossy, check_inputs=False)

        # 4) commit the accepted path to both caches
        timer.switch("other")
        accepted = tree.path(result.node)[1:]  # accepted nodes, root excluded
        rows = torch.tensor([n_ctx - 1 + a for a in accepted], dtype=torch.long, device=device)
        target.commit(n_ctx, rows)
        if isinstance(draft, EagleRunner):  # the target's features of the newly committed positions
            keep = [*range(p - 1), *(p - 1 + a for a in [0, *accepted])]
            draft.set_target_features(target_base, target.features[torch.tensor(keep, device=device)])
        if outcome.pending_fed:
            fed = [r for r in map(outcome.draft_row, accepted) if r is not None]  # a prefix of the path
            rows_d = torch.tensor([n_ctx - 1 + r for r in fed], dtype=torch.long, device=device)
            draft.commit(n_ctx, rows_d)
        if state.root is not None:  # the rows over the next root token: at the last accepted node
            node = result.node
            # At T=0 the target's rows are one-hot; features use its plain softmax.
            soft = soft_probs_fn if soft_probs_fn is not None else draft_probs_fn
            target_row = soft(logits[node : node + 1])[0] if sampling.greedy else target_probs[node]
            fed_leaf = outcome.draft_row(node) is not None
            draft_row = outcome.tree.draft_probs[node] if fed_leaf else None  # None: a leaf never fed
            state.root.set_previous(target_row, draft_row, target.hidden[node] if target.keep_hidden else None)
            state.root.after_step(result.num_accepted)
        state.stats.accept_lengths.append(result.num_accepted)
        state.stats.tree_sizes.append(N)
        if self.node_log is not None:
            fed = [outcome.draft_row(i) is not None for i in range(N)]
            self.node_log(tree, fed, target_probs, sampling.temperature)
        return StepResult(plan, N, result.num_accepted, result.tokens, result.bonus, timer.take_step())

    @torch.inference_mode()
    def _root_features(
        self, state: EngineState, draft_probs_fn: ProbsFn, timer: PhaseTimer, host_hidden: bool
    ) -> tuple[DraftRoot, RootFeatures]:
        """Run the step's first draft forward (pending tokens, root last) and compute the root features."""
        assert state.draft is not None and state.root is not None
        timer.switch("draft")
        pending = torch.tensor(state.context[state.draft.cached :], dtype=torch.long, device=self.device)
        keep = 2 if state.root.needs_draft_row() else 1  # row -2: the draft's row over the root token
        root = draft_root(state.draft, pending, draft_probs_fn, keep)
        timer.switch("other")
        return root, state.root.features(root.probs, root.hidden, root.ok, len(state.context), host_hidden)

    # ------------------------------------------------------------------ helpers
    def _prompt_ids(self, prompt: str | Sequence[int] | torch.Tensor | Mapping[str, Any]) -> list[int]:
        if isinstance(prompt, Mapping):  # a BatchEncoding or dict, e.g. apply_chat_template(..., return_dict=True)
            if "input_ids" not in prompt:
                raise ValueError(f"a dict prompt needs 'input_ids' (got keys {sorted(prompt)})")
            prompt = prompt["input_ids"]
            if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (list, torch.Tensor)):
                prompt = prompt[0]  # [[ids]]: a batch of one
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError("a text prompt needs a tokenizer; pass tokenizer= or give token ids")
            ids = list(self.tokenizer(prompt)["input_ids"])
            bos = getattr(self.tokenizer, "bos_token_id", None)
            if bos is not None and len(ids) > 1 and ids[0] == ids[1] == bos:
                ids = ids[1:]  # the text already began with the BOS token (e.g. a rendered chat template)
        elif isinstance(prompt, torch.Tensor):
            if prompt.dim() == 2 and prompt.shape[0] == 1:
                prompt = prompt[0]
            if prompt.dim() == 2:
                raise ValueError(_BATCH_ERROR.format(n=prompt.shape[0]))
            if prompt.dim() != 1:
                raise ValueError(f"a token-id prompt must be 1-D or [1, n], got shape {tuple(prompt.shape)}")
            if prompt.is_floating_point() or prompt.is_complex() or prompt.dtype == torch.bool:
                raise ValueError(f"token ids must be integers, got a {str(prompt.dtype).removeprefix('torch.')} tensor")
            ids = [int(x) for x in prompt.tolist()]
        elif isinstance(prompt, (bytes, bytearray)):
            raise ValueError("a bytes prompt is ambiguous: decode it to str, or give a list of token ids")
        elif isinstance(prompt, Sequence):
            if prompt and all(
                isinstance(x, (str, Sequence)) or (isinstance(x, torch.Tensor) and x.dim() > 0) for x in prompt
            ):
                raise ValueError(_BATCH_ERROR.format(n=len(prompt)))
            ids = [_token_id(x, "prompt") for x in prompt]
        else:
            raise ValueError(f"prompt must be text or token ids, got {type(prompt).__name__}")
        if not ids:
            raise ValueError("the prompt is empty: give at least one token (e.g. the BOS token)")
        bad = [t for t in ids if not 0 <= t < self.input_vocab_size]
        if bad:
            raise ValueError(
                f"prompt token ids {bad[:5]} are outside the target's vocabulary [0, {self.input_vocab_size})"
            )
        return ids

    def _chat_prompt(self, prompt: Any, messages: Sequence[Mapping[str, Any]] | None) -> Any:
        """``prompt``, or the token ids of ``messages`` rendered by the tokenizer's chat template."""
        if messages is None:
            if prompt is None:
                raise ValueError("give a prompt or messages=[{'role': 'user', 'content': ...}]")
            return prompt
        if prompt is not None:
            raise ValueError("give either a prompt or messages=, not both")
        if self.tokenizer is None:
            raise ValueError("messages= needs a tokenizer with a chat template; pass tokenizer=")
        if not getattr(self.tokenizer, "chat_template", None):
            raise ValueError(
                "the tokenizer has no chat template: set tokenizer.chat_template, or render the chat yourself "
                "and pass it as prompt"
            )
        if isinstance(messages, Mapping) or not all(isinstance(m, Mapping) for m in messages):
            raise ValueError("messages must be a list of {'role': ..., 'content': ...} dicts")
        return self.tokenizer.apply_chat_template(list(messages), add_generation_prompt=True, tokenize=True,
                                                  return_dict=True)  # fmt: skip

    def _stop_string_cut(self, generated: list[int], before: int, stop_strings: list[str]) -> int | None:
        """Smallest token count whose decoded text contains a stop string (None if there is none)."""
        decode = self.tokenizer.decode
        if not any(s in decode(generated, skip_special_tokens=True) for s in stop_strings):
            return None
        for n in range(before + 1, len(generated) + 1):
            text = decode(generated[:n], skip_special_tokens=True)
            if any(s in text for s in stop_strings):
                return n
        return len(generated)


# ---------------------------------------------------------------------- module helpers
def _cut_at_stop(text: str, stop_strings: Sequence[str]) -> str:
    """``text`` cut right after the earliest-ending occurrence of any stop string (unchanged if none occurs)."""
    ends = [text.find(s) + len(s) for s in stop_strings if s in text]
    return text[: min(ends)] if ends else text


def _lookup_outcome(
    context: list[int], depth: int, vocab_size: int, device: torch.device, root: DraftRoot | None
) -> DraftOutcome:
    """A lookup step's chain (:mod:`adaptive_spec.trees.lookup`).

    ``root``: the step's first draft forward, when it was run for the root features (else None).
    """
    tree = lookup_tree(ngram_lookup(context, depth), vocab_size, device)
    n = tree.num_nodes
    ancestors = torch.ones(n, n, dtype=torch.bool, device=device).tril_()
    if root is None:  # the draft model was not run: its pending tokens wait for the next model step
        return DraftOutcome(tree, ancestors, pending_fed=0, fed_nodes=0)
    return DraftOutcome(tree, ancestors, pending_fed=root.pending, fed_nodes=1)  # only the root has a draft row


def _draft_runner(draft: Any, keep_hidden: bool = False, input_limit: int | None = None) -> ModelRunner:
    """The draft's runner: an :class:`EagleRunner` for an EAGLE head, else a :class:`ModelRunner`."""
    if is_eagle_head(draft):
        return EagleRunner(draft, keep_hidden=keep_hidden)
    return ModelRunner(draft, keep_hidden=keep_hidden, input_limit=input_limit)


def check_same_tokenizer(tokenizer: Any, other: Any, vocab_size: int) -> None:
    """Raise a ValueError unless both tokenizers map the same strings to the same ids below ``vocab_size``."""
    a = {k: v for k, v in tokenizer.get_vocab().items() if v < vocab_size}
    b = {k: v for k, v in other.get_vocab().items() if v < vocab_size}
    if a != b:
        diff = sorted(set(a.items()) ^ set(b.items()), key=lambda kv: kv[1])[:3]
        raise ValueError(
            "the target and draft tokenizers differ (speculative decoding needs one shared vocabulary); "
            f"first differences: {diff}"
        )


def _place(model: PreTrainedModel, role: str, device: torch.device, dtype: torch.dtype | None) -> PreTrainedModel:
    """``model`` on ``device`` (and in ``dtype``) in eval mode; ``nn.Module.to`` works in place, so say so."""
    import warnings

    moves = []
    if model.device != device and not (model.device.type == device.type and device.index is None):
        moves.append(f"moved from {model.device} to {device}")
    if dtype is not None and model.dtype != dtype:
        moves.append(f"cast from {model.dtype} to {dtype}")
    if moves:
        warnings.warn(
            f"SpecEngine {' and '.join(moves)} the {role} model in place (nn.Module.to); pass a copy to keep yours",
            UserWarning, stacklevel=3,
        )  # fmt: skip
        model = model.to(device=device, dtype=dtype) if dtype is not None else model.to(device)
    return model.eval()


def _check_model_path(role: str, path: str) -> None:
    """Refuse at once a model path that looks local but is not a directory (it is never sent to the hub).

    A hub id is ``name`` or ``org/name``; anything with a leading ``/``, ``.`` or ``~``, a
    backslash, more than one ``/`` or a trailing ``/`` is a local path.
    """
    import os

    if os.path.isdir(os.path.expanduser(path)):
        return
    looks_local = (
        path.startswith(("/", ".", "~")) or "\\" in path or path.count("/") > 1 or path.endswith("/")
        or os.path.exists(os.path.expanduser(path))
    )  # fmt: skip
    if looks_local:
        what = "is a file, not a model directory" if os.path.isfile(os.path.expanduser(path)) else "no such directory"
        raise ValueError(f"{role} model {path!r}: {what} (a model directory holds config.json and the weights)")


def _hub_offline() -> bool:
    """Offline mode, read now (``HF_HUB_OFFLINE``/``TRANSFORMERS_OFFLINE``; huggingface_hub reads them at import)."""
    from huggingface_hub import constants

    flags = (os.environ.get("HF_HUB_OFFLINE"), os.environ.get("TRANSFORMERS_OFFLINE"))
    return constants.is_offline_mode() or any((f or "").strip().upper() in ("1", "ON", "YES", "TRUE") for f in flags)


def _hub_reachable(timeout: float = 3.0) -> bool:
    """Whether the hub endpoint answers a TCP connection within ``timeout`` seconds (True behind a proxy)."""
    import socket
    from urllib.parse import urlparse

    from huggingface_hub import constants

    if any(os.environ.get(k) for k in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")):
        return True  # the proxy decides; let huggingface_hub try
    url = urlparse(constants.ENDPOINT)
    try:
        socket.create_connection((url.hostname, url.port or (443 if url.scheme == "https" else 80)), timeout).close()
    except OSError:
        return False
    return True


def _check_hub_name(role: str, name: str, revision: str | None) -> bool:
    """True when model ``name`` needs no network (a local directory, or a hub name in the local cache).

    A hub name that is neither cached nor reachable (offline mode, or no connection) raises at once.
    """
    if os.path.isdir(os.path.expanduser(name)):
        return True
    from huggingface_hub import try_to_load_from_cache

    try:
        cached = isinstance(try_to_load_from_cache(name, "config.json", revision=revision), str)
    except ValueError:  # not a valid repo id
        raise ValueError(f"{role} model {name!r}: no such directory, and not a valid hub name") from None
    if cached:
        return True
    if _hub_offline():
        raise ValueError(
            f"{role} model {name!r} is not a local directory nor in the Hugging Face cache, and the hub is offline "
            "(HF_HUB_OFFLINE=1): download it while online, or give a local model directory"
        )
    if not _hub_reachable():
        from huggingface_hub import constants

        raise ValueError(
            f"{role} model {name!r} is not a local directory nor in the Hugging Face cache, and "
            f"{constants.ENDPOINT} cannot be reached: check the network, or give a local model directory"
        )
    return False


def _check_accelerate() -> None:
    """device_map needs accelerate: say so in one line rather than from deep inside transformers."""
    import importlib.util

    if importlib.util.find_spec("accelerate") is None:
        raise ValueError("device_map= needs the accelerate package: pip install accelerate")


def _logits_size(model: PreTrainedModel) -> int:
    head = model.get_output_embeddings()
    if head is not None and getattr(head, "weight", None) is not None:
        return int(head.weight.shape[0])
    return int(model.config.get_text_config().vocab_size)


def _context_window(model: PreTrainedModel) -> int | None:
    cfg = model.config.get_text_config()
    w = getattr(cfg, "max_position_embeddings", None)
    return int(w) if w else None


def _eos_ids(model: PreTrainedModel, tokenizer: Any) -> set[int]:
    out: set[int] = set()
    for source in (getattr(model, "generation_config", None), model.config):
        eos = getattr(source, "eos_token_id", None) if source is not None else None
        if eos is not None:
            out.update([eos] if isinstance(eos, int) else list(eos))
            break
    if tokenizer is not None and getattr(tokenizer, "eos_token_id", None) is not None:
        out.add(int(tokenizer.eos_token_id))
    return out


def _prompt_key(ids: Sequence[int]) -> str:
    from adaptive_spec.formats.feature_log import prompt_key

    return prompt_key(ids)


_BATCH_ERROR = (
    "batches are not supported yet (got {n} prompts): call generate() once per prompt; "
    "the engine decodes one sequence at a time"
)


def _token_id(x: Any, what: str) -> int:
    """``x`` as a token id: Python or numpy integers only (floats, bools and bytes are refused, not truncated)."""
    if isinstance(x, (bool, float, bytes, str)):
        raise ValueError(f"{what} token ids must be integers, got {x!r}")
    if isinstance(x, torch.Tensor):
        if x.numel() != 1 or x.is_floating_point():
            raise ValueError(f"{what} token ids must be integers, got a tensor {x!r}")
        return int(x.item())
    try:
        return operator.index(x)
    except TypeError:
        raise ValueError(f"{what} token ids must be integers, got {type(x).__name__} {x!r}") from None


@dataclass
class GenerationSettings:
    """Generation settings after transformers' precedence (see :func:`resolve_generation`).

    Attributes:
        max_new_tokens: the new-token budget, or None (then ``max_length``, else 32).
        max_length: prompt plus new tokens, used only when ``max_new_tokens`` is None.
        temperature: 0 = greedy.
        top_k: 0 disables top-k.
        top_p: 1 disables nucleus sampling.
        eos_token_ids: the EOS ids of the ``generation_config`` argument, or None (then the
            target's own, as the engine found them).
        stop_strings: stop strings from a generation config.
        processors: row-wise warpers built from ``min_p``, ``typical_p`` and ``epsilon_cutoff``.
    """

    max_new_tokens: int | None
    max_length: int | None
    temperature: float
    top_k: int
    top_p: float
    eos_token_ids: set[int] | None = None
    stop_strings: list[str] = field(default_factory=list)
    processors: list[Any] = field(default_factory=list)


# GenerationConfig fields that would need history-dependent processors, beams or several
# sequences: refused in a generation_config argument, ignored with a warning in the model's own.
_UNSUPPORTED_FIELDS = (
    "repetition_penalty", "encoder_repetition_penalty", "no_repeat_ngram_size", "encoder_no_repeat_ngram_size",
    "min_length", "min_new_tokens", "bad_words_ids", "sequence_bias", "num_beams", "num_beam_groups",
    "num_return_sequences", "penalty_alpha", "eta_cutoff", "forced_bos_token_id", "forced_eos_token_id",
    "suppress_tokens", "begin_suppress_tokens", "exponential_decay_length_penalty", "guidance_scale",
    "watermarking_config", "renormalize_logits", "top_h",
)  # fmt: skip
_NEUTRAL = {"repetition_penalty": 1.0, "encoder_repetition_penalty": 1.0, "no_repeat_ngram_size": 0,
            "encoder_no_repeat_ngram_size": 0, "min_length": 0, "min_new_tokens": 0, "num_beams": 1,
            "num_beam_groups": 1, "num_return_sequences": 1, "eta_cutoff": 0.0, "guidance_scale": 1.0,
            "renormalize_logits": False}  # fmt: skip


def resolve_generation(
    config: Any,
    model_config: Any = None,
    *,
    max_new_tokens: Any = None,
    temperature: Any = None,
    top_k: Any = None,
    top_p: Any = None,
) -> GenerationSettings:
    """Merge generation settings as transformers does: explicit arguments > ``config`` > ``model_config`` > defaults.

    Each ``GenerationConfig`` field that the explicit arguments leave out is taken from
    ``config`` (the ``generation_config=`` argument) if set there, else from ``model_config``
    (the target's ``generation_config``), else from the engine's defaults (32 new tokens,
    sampling at temperature 1, no top-k or top-p). ``do_sample=False`` means temperature 0
    unless ``temperature`` is explicit. ``max_new_tokens`` wins over ``max_length``, as in
    transformers.

    Raises:
        TypeError: ``config`` is not a ``GenerationConfig``.
        ValueError: ``config`` asks for something that is not lossless with speculative decoding
            (repetition penalty, n-gram bans, minimum lengths, beams, ...).
    """
    import warnings

    from transformers import GenerationConfig

    if config is not None and not isinstance(config, GenerationConfig):
        raise TypeError(f"generation_config must be a transformers GenerationConfig, got {type(config).__name__}")
    sources = [c for c in (config, model_config) if isinstance(c, GenerationConfig)]
    for src in sources:
        bad = [f"{name}={getattr(src, name)!r}" for name in _UNSUPPORTED_FIELDS
               if getattr(src, name, None) is not None and getattr(src, name) != _NEUTRAL.get(name)]  # fmt: skip
        if not bad:
            continue
        what = ", ".join(bad)
        if src is config:
            raise ValueError(
                f"generation_config sets {what}: not supported, speculative decoding stays lossless only with "
                "row-wise settings (temperature, top_k, top_p, min_p, typical_p, epsilon_cutoff); unset it"
            )
        warnings.warn(f"the target's generation_config sets {what}: ignored (not lossless with speculative "
                      "decoding); pass generation_config= to override", UserWarning, stacklevel=4)  # fmt: skip

    def pick(name: str) -> Any:
        for src in sources:
            value = getattr(src, name, None)
            if value is not None:
                return value
        return None

    if temperature is None:
        if pick("do_sample") is False:
            temperature = 0.0
        else:
            temperature = pick("temperature")
            temperature = 1.0 if temperature is None else temperature
    top_k = top_k if top_k is not None else (pick("top_k") or 0)
    top_p = top_p if top_p is not None else (pick("top_p") if pick("top_p") is not None else 1.0)
    sampling = not (isinstance(temperature, numbers.Real) and not isinstance(temperature, bool) and temperature == 0)
    processors: list[Any] = []
    if sampling:
        from transformers.generation.logits_process import (
            EpsilonLogitsWarper,
            MinPLogitsWarper,
            TypicalLogitsWarper,
        )

        if pick("min_p") is not None:
            processors.append(MinPLogitsWarper(float(pick("min_p"))))
        if pick("typical_p") is not None and float(pick("typical_p")) < 1.0:
            processors.append(TypicalLogitsWarper(float(pick("typical_p"))))
        if pick("epsilon_cutoff") is not None and float(pick("epsilon_cutoff")) > 0.0:
            processors.append(EpsilonLogitsWarper(float(pick("epsilon_cutoff"))))
    eos = getattr(config, "eos_token_id", None) if config is not None else None
    eos_ids = None
    if eos is not None:
        eos_ids = {_token_id(e, "eos") for e in ([eos] if not isinstance(eos, (list, tuple)) else eos)}
    stop_strings = pick("stop_strings") or []
    return GenerationSettings(
        max_new_tokens=max_new_tokens if max_new_tokens is not None else pick("max_new_tokens"),
        max_length=None if max_new_tokens is not None else pick("max_length"),
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        eos_token_ids=eos_ids,
        stop_strings=[stop_strings] if isinstance(stop_strings, str) else list(stop_strings),
        processors=processors,
    )


_CRITERIA = ("MaxLengthCriteria", "MaxTimeCriteria", "StopStringCriteria", "EosTokenCriteria")


def _check_stopping_criteria(criteria: Any) -> list:
    """The user's stopping criteria, checked to be ones that read only the token ids."""
    if criteria is None:
        return []
    if not isinstance(criteria, (list, tuple)) and type(criteria).__name__ != "StoppingCriteriaList":
        criteria = [criteria]
    for c in criteria:
        if type(c).__name__ not in _CRITERIA:
            raise ValueError(
                f"stopping criterion {type(c).__name__} is not supported: speculative steps emit several tokens "
                f"without per-token scores; supported: {', '.join(_CRITERIA)} (or stop= strings and token ids)"
            )
    return list(criteria)


def _criteria_cut(criteria: Sequence[Any], context: list[int], first_new: int) -> int | None:
    """The context length at the first newly emitted token that meets a criterion, or None."""
    for end in range(first_new + 1, len(context) + 1):
        ids = torch.tensor([context[:end]])
        if any(bool(c(ids, None).any()) for c in criteria):
            return end
    return None


def _as_int(x: Any, name: str, minimum: int) -> int:
    """``x`` as an int >= ``minimum``; numpy integers are accepted, floats and bools are not."""
    if isinstance(x, bool):
        raise ValueError(f"{name} must be an integer >= {minimum}, got {x!r}")
    try:
        value = operator.index(x)
    except TypeError:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {x!r}") from None
    if value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value}")
    return value


def _split_stop(stop: Sequence[str | int] | str | None, vocab_size: int) -> tuple[list[str], set[int]]:
    if stop is None:
        return [], set()
    if isinstance(stop, (str, int)) or not isinstance(stop, Sequence):
        stop = [stop]
    strings, ids = [], set()
    for s in stop:
        if isinstance(s, str) and s:
            strings.append(s)
            continue
        try:
            tok = _token_id(s, "stop")
        except ValueError:
            raise ValueError(f"stop entries must be non-empty strings or token ids, got {s!r}") from None
        if not 0 <= tok < vocab_size:
            raise ValueError(f"stop token id {tok} is outside the vocabulary [0, {vocab_size})")
        ids.add(tok)
    return strings, ids


def _parse_dtype(name: str) -> torch.dtype:
    table = {
        "float32": torch.float32,
        "fp32": torch.float32,
        "bfloat16": torch.bfloat16,
        "bf16": torch.bfloat16,
        "float16": torch.float16,
        "fp16": torch.float16,
    }
    if name not in table:
        raise ValueError(f"unknown dtype {name!r}; use one of {', '.join(table)}")
    return table[name]
