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
import os
import time
import warnings
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch
from transformers import PreTrainedModel

from adaptive_spec.engine.draft_data import log_prefill
from adaptive_spec.engine.eagle import EagleRunner, draft_runner, is_eagle_head
from adaptive_spec.engine.features import LatencyFeatures, RootTracker
from adaptive_spec.engine.graphs import BUCKETS
from adaptive_spec.engine.logits import ProbsFn, build_logits_processor
from adaptive_spec.engine.metrics import GenerationStats, PhaseTimer
from adaptive_spec.engine.models import shipped_datastore
from adaptive_spec.engine.outputs import DeviceTail, EngineState, GenerationResult
from adaptive_spec.engine.pretrained import (
    check_same_tokenizer,
    context_window,
    describe_pair,
    eos_ids,
    load_pair,
    logits_size,
    place,
)
from adaptive_spec.engine.request import AUTO, GenerationRequest, build_request
from adaptive_spec.engine.runner import ModelRunner
from adaptive_spec.engine.slots import SlotsMixin
from adaptive_spec.engine.step import Run, StepMixin, StepOutput
from adaptive_spec.engine.stopping import cut_at_stop, emit
from adaptive_spec.engine.weight_order import arrange_linears
from adaptive_spec.formats.feature_log import prompt_key
from adaptive_spec.planner.plan import Plan
from adaptive_spec.trees.datastore import Datastore

if TYPE_CHECKING:
    from adaptive_spec.formats.feature_log import FeatureLogger

_log = logging.getLogger("adaptive_spec.engine")


class SpecEngine(StepMixin, SlotsMixin):
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
        cuda_graphs: capture the forwards of models with a static cache (Llama and Qwen2 targets
            and drafts, EAGLE heads) as CUDA graphs, one per row bucket, on first use, and replay
            them for every later request (:mod:`adaptive_spec.engine.graphs`). Default: on for a
            CUDA device. A capture that fails logs one line and runs eagerly.
        compile_forwards: with ``cuda_graphs``, also capture ``torch.compile``'s fused code of the
            forwards of up to 4 rows, compiled per bucket on first use, and replay whichever graph
            is faster (:mod:`adaptive_spec.engine.graphs`; on an H200 a SmolLM2-shaped pass of 1 row
            replayed in 3.4 ms against 4.7). Its logits round slightly differently from the eager
            model's. Default False: the first request pays about 30 s of compilation per bucket
            (``adaptive-spec bench passes --compile`` measures both).
        phase_sync: on CUDA, synchronise with the device at every phase boundary (draft, target,
            verify, other), so that ``stats.phase_times_s`` splits the device's time by phase.
            Default False: the host queues a step's work while the device runs it and waits
            once per step, at the step's host read; the phase times are then the host's time in
            each phase (a phase that reads the host absorbs the device's queue) and only their
            sum per step is the step's time. Each phase sync stalls that overlap. No effect
            on a CPU.
        datastore: a corpus the plans ``lookup:WxL+K/nss`` draft from (:mod:`adaptive_spec.trees.datastore`):
            a :class:`~adaptive_spec.trees.datastore.Datastore` or the path of a file it saved (built by
            ``adaptive-spec zoo datastore``). :meth:`from_pretrained` loads the one shipped for a fetched model
            (``adaptive_spec/zoo/smollm2/datastore.npz``) unless given ``datastore=None``. Default None.

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
        cuda_graphs: bool | None = None,
        compile_forwards: bool = False,
        phase_sync: bool = False,
        datastore: Datastore | str | os.PathLike | None = None,
    ) -> None:
        device = torch.device(device) if device is not None else target.device
        if is_eagle_head(draft) and not draft.bound:
            draft.bind(target)  # an EAGLE head reads the target's token embeddings
        self.target = place(target, "target", device, dtype)
        self.draft = place(draft, "draft", device, dtype)
        self.device = device
        self.tokenizer = tokenizer
        self._set_vocabularies(tokenizer, draft_tokenizer)
        # Check the attention implementations now rather than at the first call.
        ModelRunner(self.target)
        draft_runner(self.draft)
        self.phase_sync = bool(phase_sync)  # CUDA: synchronise at phase boundaries (a profile's split)
        self.cuda_graphs = device.type == "cuda" if cuda_graphs is None else bool(cuda_graphs)
        self.compile_forwards = bool(compile_forwards)  # with cuda_graphs: capture torch.compile's code
        if self.compile_forwards and not self.compiles:
            warnings.warn(
                "compile_forwards=True has no effect here: it compiles the captured forwards of a CUDA device "
                "(cuda_graphs on)",
                UserWarning,
                stacklevel=2,
            )
        # Static caches and captured forwards, lent to one run at a time and reused across runs.
        self._init_slots()
        self.hidden_sizes = tuple(m.get_output_embeddings().weight.shape[1] for m in (self.draft, self.target))
        self.planner = planner
        self.latency_model = latency_model
        self.datastore = self._datastore(datastore)
        # Tuned plan files tried by default_plan() (None: configs/plans/in-draft.yaml, then best-static.yaml).
        self.tuned_plan_files: Sequence[str | os.PathLike] | None = None
        self._fingerprints: dict[str, str] | None = None
        self._default_plans: dict[tuple[Any, float], Plan] = {}
        self.feature_log: FeatureLogger | None = None
        # Called as node_log(tree, fed, target_probs, temperature, drawn=drawn) after each speculative
        # step's target pass, with ``fed[i]`` whether node i was run through the draft (the in-draft
        # decisions) and ``drawn[i]`` whether its token was drawn from the draft model (False for the
        # root and looked-up nodes): :class:`adaptive_spec.formats.nodes.NodeLogger` logs per-node
        # features and soft acceptance labels of the drawn nodes for the acceptance model. Its time
        # counts in the step's "other".
        self.node_log: Any = None
        # A DraftDataLogger (adaptive_spec.engine.draft_data.log_draft_data): the token, target feature and
        # target top-k law of every committed position of speculative generations, for online distillation.
        self.draft_data: Any = None
        # Drafting policies decided on the device where they can be, with one host read a tree on an accelerator
        # (engine.drafting: EAGLE-style trees, and the chains and conf-delayed trunks as their looked laws); False:
        # every policy tree grown on the host, a read a level, as on a CPU.
        self.device_policies = True
        if feature_log is not None:
            from adaptive_spec.formats.feature_log import FeatureLogger

            log = feature_log if isinstance(feature_log, FeatureLogger) else FeatureLogger(feature_log)
            log.attach(self.describe())
            self.feature_log = log

    def _set_vocabularies(self, tokenizer: Any, draft_tokenizer: Any) -> None:
        """The pair's vocabulary sizes, context window and end-of-sequence ids; the two tokenizers checked.

        The engine's vocabulary is the target's: a draft with fewer logits gives the missing ids probability 0 (still
        lossless: the residual reaches them), and a draft with fewer input embeddings reads them as its own last id
        (any draft input is lossless).
        """
        self.vocab_size = logits_size(self.target)
        self.draft_vocab_size = logits_size(self.draft)
        self.input_vocab_size = int(self.target.get_input_embeddings().weight.shape[0])
        draft_inputs = int(self.draft.get_input_embeddings().weight.shape[0])
        self.draft_input_limit = draft_inputs if draft_inputs < self.input_vocab_size else None
        if tokenizer is not None and draft_tokenizer is not None:
            check_same_tokenizer(tokenizer, draft_tokenizer, min(len(tokenizer), len(draft_tokenizer)))
        windows = [w for w in (context_window(m) for m in (self.target, self.draft)) if w]
        self.max_positions: int | None = min(windows) if windows else None
        self.eos_token_ids = eos_ids(self.target, tokenizer)

    def _datastore(self, datastore: Datastore | str | os.PathLike | None) -> Datastore | None:
        """The datastore given (loaded from its file), checked against the target's vocabulary."""
        if datastore is None or isinstance(datastore, Datastore):
            store = datastore
        else:
            try:
                store = Datastore.load(datastore)
            except (FileNotFoundError, ValueError) as err:
                raise ValueError(str(err)) from None
        if store is not None and store.vocab_size not in (self.vocab_size, self.input_vocab_size):
            raise ValueError(
                f"the datastore was built for a vocabulary of {store.vocab_size} ids and the target has "
                f"{self.vocab_size}: build it with the target's tokenizer (adaptive-spec zoo datastore)"
            )
        return store

    def describe(self) -> dict[str, Any]:
        """The engine's configuration, as recorded in a feature log's manifest.

        Returns:
            ``{"models": ..., "run": ...}``: ``models`` (both config dicts, vocabulary size,
            dtypes, hidden sizes) must match for logs to be mixed; ``run`` (model names or
            paths, device, package versions) describes this engine only.
        """
        return describe_pair(self.target, self.draft, self.hidden_sizes, self.vocab_size, self.device)

    def close(self) -> None:
        """Flush and close the feature log, if any (also done at interpreter exit)."""
        if self.feature_log is not None:
            self.feature_log.close()
        if self.draft_data is not None:
            self.draft_data.close()

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

        On a CPU, the loaded models' ``Linear`` weights get the memory order that this host measured
        faster, per forward size (same values; :mod:`adaptive_spec.engine.weight_order`,
        ``ADAPTIVE_SPEC_WEIGHT_ORDER``); ``save_pretrained`` saves them as they are (only a raw
        ``safetensors.torch.save_file`` of the state dict needs
        :func:`~adaptive_spec.engine.layout.row_major_linears` first).

        A hub name (``org/name``) is checked before anything is downloaded: offline
        (``HF_HUB_OFFLINE=1``, or no connection to the hub) it loads from the local Hugging
        Face cache, or fails at once with one line saying so.

        Raises:
            ValueError: the two tokenizers disagree; a local path that is not a directory; a hub
                name that is neither cached nor reachable; ``device`` and ``device_map`` together; a device
                this machine does not have.
        """
        if device is not None:
            from adaptive_spec.engine.load import check_device

            check_device(str(device))
        target_model, draft_model, tokenizer, draft_tokenizer = load_pair(
            target,
            draft,
            device=device,
            dtype=dtype,
            attn_implementation=attn_implementation,
            trust_remote_code=trust_remote_code,
            local_files_only=local_files_only,
            revision=revision,
            token=token,
            quantization_config=quantization_config,
            device_map=device_map,
            offload_folder=offload_folder,
        )
        if "datastore" not in engine_kwargs and isinstance(target, str):  # the corpus shipped for a fetched model
            shipped = shipped_datastore(target)
            engine_kwargs["datastore"] = shipped if shipped is not None and shipped.is_file() else None
        kw = {"device": device, "draft_tokenizer": draft_tokenizer, **engine_kwargs}
        engine = cls(target_model, draft_model, tokenizer, **kw)
        arrange_linears(engine.target, engine.draft)  # the models are ours: on a CPU, this host's faster weight order
        return engine

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

    def default_plan(self, temperature: float) -> Any:
        """What :meth:`generate` plays at ``temperature`` when given no plan and the engine has no planner.

        The per-step source rule (``configs/plans/adaptive.yaml``, a planner that picks the model's
        draft or a lookup each step) or the in-draft planner's plan (``configs/plans/in-draft.yaml``)
        when that file was tuned for this model pair, checked against the model fingerprints in its
        metadata; else the tuned best static plan (``configs/plans/best-static.yaml``) on the same
        condition; else the files shipped for a fetched pair (``adaptive_spec/zoo/<model>/``); else
        ``chain:2/block``. Plans tuned per temperature are taken at the nearest tuned
        temperature of the same kind (greedy or sampling); on a GPU, a file's plans tuned on that kind of
        device first. The choice and its reason are logged
        (``logging.INFO``, logger ``adaptive_spec.engine``) once per temperature. See
        :mod:`adaptive_spec.engine.auto_plan`.
        """
        from adaptive_spec.engine.auto_plan import choose_default_plan

        files = None if self.tuned_plan_files is None else tuple(map(str, self.tuned_plan_files))
        key = (files, float(temperature))
        if key not in self._default_plans:
            plan, why = choose_default_plan(
                self.fingerprints(), temperature, self.tuned_plan_files, device=self.device.type
            )
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

        Settings left out come from ``generation_config``, then the target's own
        ``generation_config``, then the engine's defaults (32 new tokens, temperature 1, no top-k or
        top-p), as :func:`~adaptive_spec.engine.settings.resolve_generation` documents;
        ``do_sample=False`` in a config means temperature 0 unless ``temperature`` is given.

        Args:
            prompt: text (needs a tokenizer), token ids (a list, 1-D or [1, n] tensor), or the
                dict of a tokenizer call or of ``apply_chat_template(..., return_dict=True)``.
            max_new_tokens: exact budget of new tokens (>= 1).
            temperature: 0 = greedy (the ``greedy`` verifier, whatever the plan's); > 0 samples.
            top_k: top-k filter (0 disables); top_p: nucleus filter (1 disables); both applied
                to draft and target alike.
            plan: ``"auto"`` (default): the engine's ``planner``, else :meth:`default_plan` (the
                plan tuned for this pair, else ``chain:2/block``). ``"autoregressive"`` or None:
                plain decoding, the baseline. A :class:`Plan` or plan string (``"<tree
                shape>/<verifier>"`` such as ``"delayed:2x3x3/traversal"``, ``"<drafting
                policy>/<verifier>"`` such as ``"conf-chain:12:0.4/block"``, ``"lookup:8/block"``),
                or a planner (``choose(state) -> Plan``, optionally ``observe(result)``). A
                verifier that is not exact for the plan's drafting law is refused.
            seed: seeds the ``torch.Generator`` of every random draw (None: random).
            stop: stop strings and/or token ids (treated as EOS). On a stop string ``text`` is
                cut right after it, as vLLM and OpenAI-style servers do, while ``token_ids``
                keep the whole token that completed it.
            streamer: e.g. ``TextStreamer``: ``put`` the prompt ids, then each step's tokens.
            keep_state: attach the final :class:`EngineState` (both KV caches) to the result.
            messages: a chat (``[{"role": "user", "content": ...}]``) rendered with the
                tokenizer's chat template, instead of ``prompt``.
            logits_processor: extra processors applied to draft and target rows alike; only
                row-wise ones are lossless and accepted
                (:data:`~adaptive_spec.engine.logits.ROW_WISE_PROCESSORS`), history-dependent
                ones (repetition penalty, n-gram bans, ...) are refused.
            stopping_criteria: transformers criteria that read only the ids (``MaxLength``,
                ``MaxTime``, ``StopString``, ``EosToken``), checked after every emitted token.
            generation_config: a ``GenerationConfig`` filling the arguments left out; settings
                that are not lossless (repetition penalty, beams, ...) are refused here and
                ignored with a warning in the target's own config.

        Returns a :class:`GenerationResult`. Raises a one-line ValueError on an invalid prompt,
        setting, plan or budget, and on NaN/inf logits.
        """
        request = build_request(
            self,
            prompt,
            max_new_tokens,
            temperature,
            top_k,
            top_p,
            plan,
            seed,
            stop,
            streamer,
            messages=messages,
            logits_processor=logits_processor,
            stopping_criteria=stopping_criteria,
            generation_config=generation_config,
        )
        result = _drain(self._run(request, keep_state))
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
            request = build_request(self, prompt, **kwargs)
        except TypeError as err:
            raise TypeError(f"stream() got unexpected arguments: {err}") from None
        it = self._run(request)
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

    # ------------------------------------------------------------------ the loop
    def _run(self, request: GenerationRequest, keep_state: bool = False) -> Iterator[list[int]]:
        """Yield each step's emitted tokens; return the :class:`GenerationResult`.

        One decoding step is :meth:`_step` (plan -> draft -> one target pass -> verify ->
        commit); the emission rules (:meth:`_emit`), logging and streaming go around it.
        The static caches lent to the run go back to the engine at its end (unless its state is kept).
        """
        run = self._setup(request)
        try:
            self._prefill(run)
            result = yield from self._loop(run)
        finally:
            if not keep_state:
                self._give_back(run.slots)
        return result

    def _loop(self, run: Run) -> Iterator[list[int]]:
        """The decoding loop of :meth:`_run`, after the prefill."""
        request = run.request
        while True:
            step = self._step(run)
            emitted, reason = emit(run.request, run.state, step.emitted, self.tokenizer)
            run.timer.switch(None)
            self._log_step(run, step, emitted)  # untimed, so that logging does not count as a step's time
            if request.streamer is not None and emitted:
                request.streamer.put(torch.tensor(emitted))
            if emitted:
                yield emitted
            run.timer.switch("other")
            if reason:
                run.state.stats.stop_reason = reason
                break
        return self._finish(run)

    def _setup(self, request: GenerationRequest) -> Run:
        """Build the sampling functions, the models' runners, the generator and the state of one generation."""
        t_start = time.perf_counter()
        planner, sampling = request.planner, request.sampling
        # Root features only when asked for (autoregressive decoding has no speculative steps).
        log = self.feature_log if planner is not None else None
        planner_wants = planner is not None and planner.needs_features_for(sampling.temperature, sampling.top_p)
        want_hidden = (planner_wants and planner.needs_hidden) or (log is not None and log.hidden)
        want_features = want_hidden or planner_wants or log is not None

        processors = build_logits_processor(sampling.generation_config())
        processors.extend(request.processors)
        # At T=0 the draft drafts from its untempered softmax (any draft is fine for greedy verification).
        draft_ids = self.draft.token_ids if is_eagle_head(self.draft) else None  # a reduced draft vocabulary
        generator = torch.Generator(device=self.device)
        if request.seed is None:
            generator.seed()
        else:
            generator.manual_seed(request.seed)
        eagle = planner is not None and is_eagle_head(self.draft)
        draft_data = planner is not None and self.draft_data is not None
        # Committed rows plus the largest captured block: the static caches never grow mid-run.
        capacity = len(request.prompt_ids) + request.budget + BUCKETS[-1]
        slots = {"target": self._lend("target", self.target, capacity)}
        if planner is not None:
            slots["draft"] = self._lend("draft", self.draft, capacity)
        state = EngineState(
            context=list(request.prompt_ids),
            prompt_length=len(request.prompt_ids),
            target=ModelRunner(
                self.target, keep_hidden=want_hidden, keep_features=eagle or draft_data, slot=slots["target"]
            ),
            draft=None
            if planner is None
            else draft_runner(self.draft, want_hidden, self.draft_input_limit, slot=slots["draft"]),
            generator=generator,
            stats=GenerationStats(),
        )
        if state.draft is not None:
            state.draft.device_policy = self.device_policies
        if want_features:
            state.root = RootTracker(
                sampling.temperature, sampling.top_p, self.latency_model, want_hidden, self.hidden_sizes
            )
        return Run(
            request=request,
            state=state,
            target_probs_fn=ProbsFn(processors, self.vocab_size, one_hot=sampling.greedy),
            draft_probs_fn=ProbsFn(processors, self.vocab_size, one_hot=False, token_ids=draft_ids),
            soft_probs_fn=ProbsFn(processors, self.vocab_size, one_hot=False),
            log=log,
            key=prompt_key(request.prompt_ids) if log is not None else "",
            timer=PhaseTimer(state.stats.phase_times_s, self.device, self.phase_sync),
            t_start=t_start,
            slots={role: slot for role, slot in slots.items() if slot is not None},
        )

    def _prefill(self, run: Run) -> None:
        """Feed the prompt but its last token (the first step's root) to both models."""
        state, timer = run.state, run.timer
        if run.request.streamer is not None:
            run.request.streamer.put(torch.tensor([state.context]))
        # Inference mode is entered around each forward-running call, never across a yield.
        with torch.inference_mode():
            prompt_t = torch.tensor(state.context, dtype=torch.long, device=self.device)
            state.tail = DeviceTail(0, list(state.context), prompt_t)  # the first step's pending tokens: a view
            with timer.phase("target"):
                logits_t = state.target.chain_forward(prompt_t[:-1], logits_to_keep=1)  # [1, V'] or None
            logits_d = None
            if isinstance(state.draft, EagleRunner) and logits_t is not None:
                state.draft.set_target_features(0, state.target.features)
            if self.draft_data is not None and state.draft is not None:
                log_prefill(self.draft_data, state, run.request.sampling.temperature)
            if state.draft is not None:
                with timer.phase("draft"):
                    logits_d = state.draft.chain_forward(prompt_t[:-1], logits_to_keep=1)
            if state.root is not None and logits_t is not None:  # the previous rows of the first step
                hidden = state.target.hidden[-1] if state.target.keep_hidden else None
                state.root.set_previous(run.soft_probs_fn(logits_t)[0], run.draft_probs_fn(logits_d)[0], hidden)

    def _log_step(self, run: Run, step: StepOutput, emitted: list[int]) -> None:
        """Append the step's root features and outcome to the feature log, if any."""
        if run.log is None or step.result is None:
            return
        f, result = step.features, step.result
        run.log.log_step(
            prompt_key=run.key,
            step=step.step,
            features=f.values,
            draft_hidden=f.draft_hidden_host,
            target_hidden=f.target_hidden_host,
            action=str(result.plan),
            num_nodes=result.num_nodes,
            accepted=result.num_accepted,
            emitted=len(emitted),
            times=result.times,
            context_ids=run.state.context[: step.context_length],
            top_k=run.request.sampling.top_k,
            propensity=step.propensity,
        )

    def _finish(self, run: Run) -> GenerationResult:
        """Close the log and the streamer; fill the statistics; the result."""
        state, stats, request = run.state, run.state.stats, run.request
        run.timer.switch(None)
        if run.log is not None:
            run.log.end_generation()
        if self.draft_data is not None:
            self.draft_data.end_generation()
        if request.streamer is not None:
            request.streamer.end()
        stats.new_tokens = len(state.generated)
        stats.target_forwards = state.target.forwards
        stats.draft_forwards = state.draft.forwards if state.draft is not None else 0
        stats.wall_time_s = time.perf_counter() - run.t_start
        text = self.tokenizer.decode(state.generated, skip_special_tokens=True) if self.tokenizer is not None else None
        if text is not None and stats.stop_reason == "stop" and request.stop_strings:
            text = cut_at_stop(text, request.stop_strings)
        return GenerationResult(list(state.generated), text, stats, state.steps, state)


# ---------------------------------------------------------------------- module helpers
def _drain(it: Iterator[list[int]]) -> GenerationResult:
    """Run the loop's iterator to its end; its return value."""
    while True:
        try:
            next(it)
        except StopIteration as done:
            return done.value
