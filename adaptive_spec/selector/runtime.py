"""Run an exported selector with onnxruntime: :class:`SelectorRuntime` and :class:`AdaptivePlanner`.

Inference only: numpy, onnxruntime, the feature schema and the plan type; no torch, no Lightning.
Usage::

    engine.generate(prompt, plan=AdaptivePlanner("selector.onnx"))

Everything that could make a decision silently wrong is checked when the file is loaded: the
file parses as ONNX, it carries ``selector export``'s metadata, its feature schema (version and
hash) is this package's, every action is a valid plan, and the graph's inputs and outputs have
the widths the metadata promises. A failed check raises :class:`SelectorLoadError` saying what to
do. Each decision (feature assembly + one onnxruntime call + argmax) is timed; see
:meth:`AdaptivePlanner.latency_us`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from adaptive_spec.formats.features import SCHEMA
from adaptive_spec.planner.plan import Plan, Planner, StepState

FORMAT = "adaptive-spec-selector/1"  # same string as adaptive_spec.selector.export.FORMAT
HIDDEN_INPUTS = ("draft_hidden", "target_hidden")
LATENCY_FEATURES = ("draft_ms", "target_ms", "target_ms_per_token")  # 0 when the engine has no latency model
SELECTOR_FILE = "selector.onnx"
PROFILE_SUFFIX = ".profile.json"  # the selector's own latency profile: selector.profile.json
PIPELINE_HINT = "build one with `make selector` (= `adaptive-spec selector pipeline --install`)"


class SelectorLoadError(ValueError):
    """The file is not a usable selector for this adaptive-spec (corrupt, foreign, or another schema)."""


class SelectorRuntime:
    """An exported selector loaded into a single-threaded onnxruntime session.

    Args:
        path: the ``.onnx`` file written by ``adaptive-spec selector export``.
        threads: intra-op threads (1: a decision is a few small matrix products; more threads only
            add synchronisation).

    Attributes:
        actions: the plan strings, one per logit.
        plans: the parsed :class:`Plan` per action.
        input_names: ``["features"]`` plus the hidden-state inputs the model takes.
        hidden_dims: width per hidden-state input (0 = not taken).
        manifest: the training labels' manifest.
        training: the training run's summary (checkpoint, split, best static actions, hyper-parameters).
        best_static_groups: the best static action per sampling group chosen on the training
            prompts, ``{"T=0,top_p=1": "chain:4/block", ...}`` (empty when the file does not record
            it, e.g. a network exported without its training summary); see :meth:`best_static`.
        static_groups: the sampling groups where the network did *not* beat the best static action
            on the validation prompts in training (``selector train``'s report, ``--min_gain`` and
            ``--gain_quantile``), mapped to that static action's index by ``(T, top_p)``: there the
            planner plays it without computing features or calling the network; see
            :meth:`static_plan_for`. ``static_group_names`` holds the same as group -> action.

    Raises:
        FileNotFoundError: no file at ``path``.
        SelectorLoadError: see the module docstring.
    """

    def __init__(self, path: str | Path, *, threads: int = 1) -> None:
        from adaptive_spec.planner.acceptance import cpu_session

        self.path = Path(path)
        if not self.path.is_file():
            raise FileNotFoundError(f"no selector at {self.path}; export one with `adaptive-spec selector export CKPT`")
        try:
            self.session = cpu_session(self.path, threads)
        except Exception as err:  # onnxruntime raises its own (pybind) exception types for bad files
            raise SelectorLoadError(
                f"{self.path} is not a readable ONNX model ({type(err).__name__}: {str(err).strip()[:300]}); "
                "the file is corrupt or truncated: export it again with `adaptive-spec selector export CKPT`"
            ) from err
        meta = dict(self.session.get_modelmeta().custom_metadata_map)
        self._check_metadata(meta)
        self._check_graph()

    # ------------------------------------------------------------------ load-time checks
    def _fail(self, what: str) -> SelectorLoadError:
        return SelectorLoadError(f"{self.path}: {what}")

    def _check_metadata(self, meta: Mapping[str, str]) -> None:
        if meta.get("adaptive_spec.format") != FORMAT:
            found = meta.get("adaptive_spec.format")
            raise self._fail(
                "no adaptive-spec selector metadata (was it written by `adaptive-spec selector export`?)"
                if found is None
                else f"selector format {found!r}, this adaptive-spec reads {FORMAT!r}"
            )
        try:
            version = int(meta["adaptive_spec.schema_version"])
            hash_ = meta["adaptive_spec.schema_hash"]
            names = json.loads(meta["adaptive_spec.feature_names"])
            self.actions: list[str] = json.loads(meta["adaptive_spec.actions"])
            hidden = json.loads(meta["adaptive_spec.hidden_dims"])
            self.manifest: dict[str, Any] = json.loads(meta.get("adaptive_spec.manifest", "{}"))
            self.training: dict[str, Any] = json.loads(meta.get("adaptive_spec.training", "{}"))
        except (KeyError, ValueError) as err:
            raise self._fail(f"missing or malformed selector metadata ({err}); export the selector again") from err
        try:
            SCHEMA.check_compatible(version, hash_, what=f"the selector {self.path}")
        except ValueError as err:
            raise SelectorLoadError(str(err)) from err
        if list(names) != list(SCHEMA.names):
            raise self._fail(f"feature names {names} differ from the schema's {list(SCHEMA.names)}")
        if not isinstance(self.actions, list) or len(self.actions) < 2:
            raise self._fail(f"the action list must hold >= 2 plan strings, got {self.actions!r}")
        self.plans: list[Plan] = []
        for i, action in enumerate(self.actions):
            try:
                self.plans.append(Plan.parse(action))
            except ValueError as err:
                raise self._fail(f"action {i} ({action!r}) is not a valid plan: {err}") from err
        if not isinstance(hidden, dict) or set(hidden) - set(HIDDEN_INPUTS):
            raise self._fail(f"hidden_dims must map {HIDDEN_INPUTS} to widths, got {hidden!r}")
        self.hidden_dims = {k: int(hidden.get(k, 0)) for k in HIDDEN_INPUTS}
        self.best_static_groups = self._group_actions("best_static")
        self.static_group_names = self._group_actions("static_groups")
        self.static_groups: dict[tuple[float, float], int] = {}  # (T, top_p) -> action index
        for group, action in self.static_group_names.items():
            t, p = _parse_group(group)
            self.static_groups[(round(t, 4), round(p, 4))] = self.actions.index(action)

    def _group_actions(self, key: str) -> dict[str, str]:
        """``training[key]``, checked to map ``"T=<t>,top_p=<p>"`` groups to actions of this selector ({} if absent)."""
        groups = self.training.get(key) if isinstance(self.training, dict) else None
        if groups is None:
            return {}
        if not isinstance(groups, dict):
            raise self._fail(f"training.{key} must map sampling groups to actions, got {groups!r}")
        for group, action in groups.items():
            if _parse_group(group) is None or action not in self.actions:
                raise self._fail(
                    f"training.{key} has {group!r}: {action!r}; expected 'T=<t>,top_p=<p>' mapped to one of "
                    "the actions; export the selector again"
                )
        return dict(groups)

    def _check_graph(self) -> None:
        inputs = {i.name: i for i in self.session.get_inputs()}
        want = {"features": SCHEMA.num_scalar, **{k: d for k, d in self.hidden_dims.items() if d > 0}}
        if set(inputs) != set(want):
            raise self._fail(f"graph inputs {sorted(inputs)} differ from the metadata's {sorted(want)}")
        for name, width in want.items():
            arg = inputs[name]
            if arg.type != "tensor(float)" or len(arg.shape) != 2 or arg.shape[1] != width:
                raise self._fail(f"input {name!r} is {arg.type} {arg.shape}, expected float32 [batch, {width}]")
        outputs = self.session.get_outputs()
        if [o.name for o in outputs] != ["logits"]:
            raise self._fail(f"graph outputs {[o.name for o in outputs]}, expected ['logits']")
        self.input_names = [i.name for i in self.session.get_inputs()]
        # One real run: the output width must match the action list (the graph's may be symbolic).
        probe = self.logits(
            np.zeros((1, SCHEMA.num_scalar), np.float32),
            **{k: np.zeros((1, d), np.float32) for k, d in self.hidden_dims.items() if d > 0},
        )
        if probe.shape != (1, len(self.actions)):
            raise self._fail(f"the graph gives {probe.shape[-1]} logits for {len(self.actions)} actions")
        # A probe batch: a network with NaN/inf weights (or that overflows on ordinary inputs) is
        # refused now, not at the first decision with a message that would blame the features.
        rows = np.stack([np.full(SCHEMA.num_scalar, v, np.float32) for v in (0.0, 1.0, -1.0, 0.5, 10.0)])
        hidden = {k: np.full((len(rows), d), 0.1, np.float32) for k, d in self.hidden_dims.items() if d > 0}
        if not np.isfinite(self.logits(rows, **hidden)).all():
            raise self._fail(
                "the network gives NaN or infinite logits on a probe batch of ordinary features (NaN/inf weights?); "
                "export it again from a sound checkpoint"
            )

    # ------------------------------------------------------------------ inference
    @property
    def takes_hidden(self) -> bool:
        return any(d > 0 for d in self.hidden_dims.values())

    def logits(
        self, features: np.ndarray, draft_hidden: np.ndarray | None = None, target_hidden: np.ndarray | None = None
    ) -> np.ndarray:
        """Logits [B, A] for raw features [B, F] (schema order) and, if taken, hidden states [B, H]."""
        feeds = {"features": np.ascontiguousarray(features, np.float32)}
        for name, h in (("draft_hidden", draft_hidden), ("target_hidden", target_hidden)):
            if self.hidden_dims[name] > 0:
                if h is None:
                    raise ValueError(f"this selector takes {name} [batch, {self.hidden_dims[name]}]; pass it")
                feeds[name] = np.ascontiguousarray(h, np.float32)
        return self.session.run(["logits"], feeds)[0]

    def choose_index(self, features: np.ndarray, **hidden: np.ndarray) -> np.ndarray:
        """The argmax action index per row, int64 [B]."""
        return self.logits(features, **hidden).argmax(axis=1)

    def static_plan_for(self, temperature: float, top_p: float = 1.0) -> Plan | None:
        """The static plan to play at ``(temperature, top_p)`` instead of the network, or None (use the network).

        Only exactly these sampling settings count: at settings the selector never validated on,
        the network decides.
        """
        index = self.static_action_for(temperature, top_p)
        return None if index is None else self.plans[index]

    def static_action_for(self, temperature: float, top_p: float = 1.0) -> int | None:
        """The action index of :meth:`static_plan_for`, or None."""
        return self.static_groups.get((round(float(temperature), 4), round(float(top_p), 4)))

    def best_static(self, temperature: float, top_p: float = 1.0) -> Plan:
        """The best single static action for ``(temperature, top_p)`` chosen on the training prompts.

        Uses the sampling group of exactly these settings, else (with a warning) the nearest
        trained group of the same kind: greedy (0) or sampling (> 0), since a greedy-only plan is
        not valid when sampling.

        Raises:
            LookupError: the selector records no best static action usable at this temperature.
        """
        import warnings

        t, p = float(temperature), float(top_p)
        groups = {g: _parse_group(g) for g in self.best_static_groups}
        exact = [g for g, (gt, gp) in groups.items() if abs(gt - t) < 1e-4 and abs(gp - p) < 1e-4]
        if exact:
            return Plan.parse(self.best_static_groups[exact[0]])
        same_kind = [g for g, (gt, _) in groups.items() if (gt == 0) == (t == 0)]
        if not same_kind:
            have = ", ".join(groups) or "none recorded"
            raise LookupError(
                f"{self.path} has no best static action for T={t:g}, top_p={p:g} (training groups: {have}); "
                "train the selector on labels collected at this temperature"
            )
        nearest = min(same_kind, key=lambda g: (abs(groups[g][0] - t) + abs(groups[g][1] - p), g))
        warnings.warn(
            f"{self.path}: no best static action for T={t:g}, top_p={p:g}; using the one of group {nearest}",
            UserWarning,
            stacklevel=2,
        )
        return Plan.parse(self.best_static_groups[nearest])

    @property
    def trained_with_latency_features(self) -> bool | None:
        """Whether the training rows had non-zero latency features (a latency profile at collection).

        Read from the training summary's ``latency_feature_mean`` (``selector export`` records it),
        else from the label manifest (``collect --profile`` of each logged run); None when unknown.
        """
        means = self.training.get("latency_feature_mean") if isinstance(self.training, dict) else None
        if isinstance(means, dict) and means:
            return any(abs(float(v)) > 0 for v in means.values())
        runs = (self.manifest.get("log") or {}).get("runs") if isinstance(self.manifest, dict) else None
        if isinstance(runs, list) and runs:
            return any(bool((r.get("collect") or {}).get("profile")) for r in runs if isinstance(r, dict))
        return None

    def __repr__(self) -> str:
        return f"SelectorRuntime({str(self.path)!r}, actions={len(self.actions)}, inputs={self.input_names})"


def _parse_group(group: str) -> tuple[float, float] | None:
    """``"T=0.7,top_p=1"`` -> ``(0.7, 1.0)`` (the keys of :func:`adaptive_spec.selector.datamodule.sampling_group`)."""
    try:
        t, p = group.split(",")
        if not (t.startswith("T=") and p.startswith("top_p=")):
            return None
        return float(t[2:]), float(p[6:])
    except (AttributeError, ValueError):
        return None


def default_selector_paths() -> list[Path]:
    """Where a selector is looked for, in order.

    The one installed for the built-in pair in the user data folder (``selector pipeline
    --install``; :func:`adaptive_spec.files.installed_models_dir`), then the copy shipped next to the
    built-in pair in the package, then ``data/selector/`` of the working directory. The first entry
    is where ``--install`` writes.
    """
    from adaptive_spec.files import default_pair_path, installed_models_dir

    return [
        installed_models_dir() / SELECTOR_FILE,
        default_pair_path() / SELECTOR_FILE,
        Path("data") / "selector" / SELECTOR_FILE,
    ]


def find_selector(path: str | Path | None = None) -> Path:
    """The selector file to use: ``path`` if given, else the first of :func:`default_selector_paths` that exists.

    Raises:
        FileNotFoundError: ``path`` does not exist, or no selector was found (the message lists
            where it looked and how to build one).
    """
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(
                f"no selector at {path}; {PIPELINE_HINT}, or export one with `adaptive-spec "
                "selector export CKPT --out DIR` (writes DIR/selector.onnx)"
            )
        return path
    tried = default_selector_paths()
    for candidate in tried:
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(
        f"no selector found (looked at {', '.join(map(str, tried))}); {PIPELINE_HINT}, or pass --selector PATH"
    )


def selector_profile_path(selector: str | Path) -> Path:
    """Where a selector's own latency profile sits: ``selector.onnx`` -> ``selector.profile.json`` beside it.

    ``selector pipeline`` writes the profile its labels were computed with there, so the selector
    runs with the latency features it was trained on.
    """
    selector = Path(selector)
    return selector.with_name(selector.stem + PROFILE_SUFFIX)


def latency_model_for(runtime: SelectorRuntime | None, profile: str | Path | None = None) -> tuple[Any, str | None]:
    """The latency model that feeds the selector's latency features, and a warning if there is none.

    Looks, in order, at: ``profile`` if given; the selector's own profile beside its file
    (:func:`selector_profile_path`, the one it was trained with); the default
    ``data/profile/profile.json`` of ``adaptive-spec profile``.
    :func:`adaptive_spec.bench.profile.latency_for_selector` goes one step further and measures
    one on first use.

    Args:
        runtime: the selector that will read the features (None: no selector, no check).
        profile: a latency profile JSON.

    Returns:
        ``(model, warning)``: a :class:`~adaptive_spec.planner.latency.LatencyModel` or None
        (latency features 0), and a message when the selector was trained with non-zero latency
        features but none will be given (else None).

    Raises:
        FileNotFoundError, ValueError: an explicit ``profile`` is missing or malformed.
    """
    from adaptive_spec.planner.latency import LatencyModel, default_profile_path

    if profile is not None:
        return LatencyModel.load(profile), None
    if runtime is not None and selector_profile_path(runtime.path).is_file():
        return LatencyModel.load(selector_profile_path(runtime.path)), None
    if default_profile_path().is_file():
        return LatencyModel.load(None), None
    warning = None
    if runtime is not None and runtime.trained_with_latency_features:
        warning = (
            f"the selector {runtime.path} was trained with latency features but there is no latency profile "
            f"(looked at {selector_profile_path(runtime.path)} and {default_profile_path()}): they will be 0 and "
            "its choices may suffer; measure one with `adaptive-spec profile` or pass --profile PATH"
        )
    return None, warning


class AdaptivePlanner(Planner):
    """A planner that asks the exported selector for every step's plan.

    The engine fills ``StepState.features`` because :attr:`needs_features` is true (and the hidden
    states when the model takes them, :attr:`needs_hidden`). One decision writes the features into a
    preallocated buffer bound to the onnxruntime session (no per-step allocation), runs it once and
    takes the argmax over the allowed actions.

    Args:
        selector: a path to an exported selector or a loaded :class:`SelectorRuntime`.
        allowed: restrict the choice to these plans (plan strings or :class:`Plan`, each one of the
            selector's actions); None allows all.
        static_groups: play the selector's static plan at the sampling settings it lists
            (``static_groups``); False: the network decides everywhere (what
            :func:`decision_latency_us` times).

    Attributes:
        decision_times_s: seconds per decision (feature assembly included), one entry per step.
    """

    needs_features = True

    def __init__(
        self,
        selector: str | Path | SelectorRuntime,
        allowed: Sequence[str | Plan] | None = None,
        static_groups: bool = True,
    ) -> None:
        import onnxruntime as ort

        self.runtime = selector if isinstance(selector, SelectorRuntime) else SelectorRuntime(selector)
        rt = self.runtime
        self.needs_hidden = rt.takes_hidden
        self._names = SCHEMA.names
        self._use_static = static_groups
        if allowed is None:
            self._allowed: np.ndarray | None = None
        else:
            index = {str(p): i for i, p in enumerate(rt.plans)}
            picked = []
            for a in allowed:
                key = str(a if isinstance(a, Plan) else Plan.parse(a))
                if key not in index:
                    raise ValueError(f"allowed plan {key!r} is not one of the selector's actions: {rt.actions}")
                picked.append(index[key])
            if not picked:
                raise ValueError("allowed must name at least one action")
            self._allowed = np.array(sorted(set(picked)), dtype=np.int64)
        # Buffers shared with onnxruntime: writing them in place is the next run's input.
        self._inputs = {"features": np.zeros((1, SCHEMA.num_scalar), np.float32)}
        for name, d in rt.hidden_dims.items():
            if d > 0:
                self._inputs[name] = np.zeros((1, d), np.float32)
        self._logits = np.zeros((1, len(rt.actions)), np.float32)
        self._binding = rt.session.io_binding()
        for name, buf in self._inputs.items():
            self._binding.bind_ortvalue_input(name, ort.OrtValue.ortvalue_from_numpy(buf))
        self._binding.bind_ortvalue_output("logits", ort.OrtValue.ortvalue_from_numpy(self._logits))
        self.decision_times_s: list[float] = []
        self.choice_counts = np.zeros(len(rt.actions), dtype=np.int64)

    @property
    def actions(self) -> list[str]:
        return self.runtime.actions

    def reset_stats(self) -> None:
        """Forget the decision times and choice counts (the planner keeps no other state between generations)."""
        self.decision_times_s.clear()
        self.choice_counts[:] = 0

    def action_counts(self, top: int | None = None) -> dict[str, int]:
        """How often each action was chosen so far, most frequent first (the ``top`` first; chosen ones only)."""
        order = np.argsort(-self.choice_counts, kind="stable")
        out = {self.runtime.actions[i]: int(self.choice_counts[i]) for i in order if self.choice_counts[i] > 0}
        return dict(list(out.items())[:top]) if top is not None else out

    def _static_index(self, temperature: float, top_p: float) -> int | None:
        """The static action played at these settings (a static group whose action is allowed), or None."""
        index = self.runtime.static_action_for(temperature, top_p) if self._use_static else None
        if index is None or (self._allowed is not None and index not in self._allowed):
            return None
        return index

    def needs_features_for(self, temperature: float, top_p: float = 1.0) -> bool:
        """False at sampling settings where the selector plays its static plan (no features needed)."""
        return self._static_index(temperature, top_p) is None

    def choose(self, state: StepState) -> Plan:
        """The plan for the coming step: argmax of the selector's logits at ``state.features``.

        At sampling settings listed in the selector's ``static_groups`` the answer is that group's
        static plan, without features or a network call.

        Raises:
            RuntimeError: the engine passed no features (or no hidden states the model needs).
            ValueError: a feature is missing or the logits are not finite (non-finite features).
        """
        t0 = time.perf_counter()
        index = self._static_index(state.temperature, state.top_p) if self.runtime.static_groups else None
        if index is not None:
            self.decision_times_s.append(time.perf_counter() - t0)
            self.choice_counts[index] += 1
            return self.runtime.plans[index]
        features = state.features
        if features is None:
            raise RuntimeError(
                "AdaptivePlanner needs StepState.features but the engine passed None; use an engine that computes "
                "root features for planners with needs_features=True"
            )
        try:
            self._inputs["features"][0] = [features[n] for n in self._names]
        except KeyError as err:
            raise ValueError(
                f"StepState.features lacks {err}; the engine's features differ from schema v{SCHEMA.version}"
            ) from err
        if self.needs_hidden:
            for name in HIDDEN_INPUTS:
                if name in self._inputs:
                    self._copy_hidden(name, getattr(state, name))
        self.runtime.session.run_with_iobinding(self._binding)
        logits = self._logits[0]
        allowed = self._allowed
        best = int(logits.argmax()) if allowed is None else int(allowed[logits[allowed].argmax()])
        if not np.isfinite(logits[best]):
            bad = [n for n in self._names if not np.isfinite(features[n])]
            raise ValueError(f"the selector's logits are not finite; non-finite features: {bad}")
        self.decision_times_s.append(time.perf_counter() - t0)
        self.choice_counts[best] += 1
        return self.runtime.plans[best]

    def _copy_hidden(self, name: str, h: Any) -> None:
        """Copy one hidden state (a torch tensor on any device, or an array) into its input buffer."""
        buf = self._inputs[name][0]
        if h is None:
            raise RuntimeError(f"this selector takes {name} but the engine passed None (needs_hidden=True)")
        size = h.numel() if hasattr(h, "numel") else np.size(h)
        if size != buf.shape[0]:
            width = buf.shape[0]
            raise ValueError(f"{name} has {size} values; the selector was trained on width {width} (other model?)")
        if hasattr(h, "detach"):  # a torch tensor: one copy (and cast) into the shared buffer, from any device
            import torch  # already loaded: the engine handed over a tensor

            # A fresh view each time: one made under inference_mode could not be written outside it.
            torch.from_numpy(buf).copy_(h.detach().reshape(-1))
        else:
            buf[:] = np.asarray(h, np.float32).reshape(-1)

    def latency_us(self) -> dict[str, float]:
        """Decision latency so far, microseconds: ``median``, ``p90``, ``mean``, ``max`` and the count ``n``."""
        if not self.decision_times_s:
            return {"n": 0}
        t = np.asarray(self.decision_times_s) * 1e6
        return {
            "n": len(t),
            "median": float(np.median(t)),
            "p90": float(np.percentile(t, 90)),
            "mean": float(t.mean()),
            "max": float(t.max()),
        }

    def __repr__(self) -> str:
        return f"AdaptivePlanner({self.runtime!r})"


def decision_latency_us(
    selector: str | Path | SelectorRuntime, *, decisions: int = 5000, warmup: int = 200, seed: int = 0
) -> dict[str, float]:
    """Time the network's own decisions: :meth:`AdaptivePlanner.choose` (feature assembly and one onnxruntime
    call) on random feature dicts, with the selector's static groups off so that every call runs the network.

    Returns:
        :meth:`AdaptivePlanner.latency_us` over ``decisions`` timed calls, after ``warmup`` untimed ones.
    """
    planner = AdaptivePlanner(selector, static_groups=False)
    rng = np.random.default_rng(seed)
    hidden = {k: rng.standard_normal(d).astype(np.float32) for k, d in planner.runtime.hidden_dims.items() if d > 0}
    states = [
        StepState(
            step=i,
            context_length=64,
            generated=i,
            remaining=1000,
            temperature=1.0,
            features=dict(zip(SCHEMA.names, rng.standard_normal(SCHEMA.num_scalar).tolist(), strict=True)),
            **hidden,
        )
        for i in range(64)
    ]
    for i in range(warmup):
        planner.choose(states[i % len(states)])
    planner.decision_times_s.clear()
    for i in range(decisions):
        planner.choose(states[i % len(states)])
    return planner.latency_us()
