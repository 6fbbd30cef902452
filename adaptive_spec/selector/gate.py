"""Training the learned source choice (:mod:`adaptive_spec.planner.gate`): collect, label, fit, write.

1. **Collect** (:func:`collect_gate_data`): generate the training prompts with the model plan,
   playing the lookup plan instead on a random fraction ``explore`` of the steps where lookup finds
   something, and a step with no draft on a fraction ``explore / 4`` of the others (so that their
   step times are measured too). Every step records the gate's features (the same
   :class:`~adaptive_spec.planner.gate.GateFeatures` the planner uses), its position, source,
   accepted tokens and time. Generations are appended to a JSON Lines file as they finish, and a
   rerun skips those already there (resumable).
2. **Label** (:func:`label_steps`), with no extra forward: at a step at position ``p``, the lookup
   plan's candidates are rebuilt from the committed context and compared with the tokens the
   generation committed from ``p`` on. Those follow the target's law, so the depth to which they
   follow the lookup chain (or trie) has the law of the accepted length of a lookup step there
   (block, token or NSS verification of deterministic drafts), at any temperature. The model plan's
   label is the accepted length of the model steps.
3. **Fit** (:func:`fit_gate`): a two-layer perceptron with two outputs (expected accepted tokens of
   each source, squared error on each source's labelled steps), early-stopped on held-out prompts,
   and the step times (model steps: their mean; lookup steps: a line in the tokens found).
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from adaptive_spec.planner.gate import GATE_FEATURES, GATE_VERSION, PLAIN, GateFeatures, SourceGate
from adaptive_spec.planner.plan import Plan, Planner, StepResult, StepState, as_plan
from adaptive_spec.trees import DraftLaw
from adaptive_spec.trees.lookup import NgramIndex

__all__ = ["GateRecorder", "collect_gate_data", "data_root_features", "fit_gate", "label_steps"]


class GateRecorder(Planner):
    """Plays the model plan, or the lookup plan on a random ``explore`` share of the steps that find one.

    Records each step: the gate's features, position, tokens found, source, accepted tokens and time.
    """

    needs_lookup = True

    def __init__(
        self, model: Plan | str, lookup: Plan | str, explore: float, seed: int, root_features: bool = True
    ) -> None:
        self.needs_features = root_features  # False: steps timed as a gate without ROOT_FEATURES plays them
        self.model, self.lookup = as_plan(model), as_plan(lookup)
        if self.model.source != "model" or self.lookup.source != "lookup":
            raise ValueError(f"a gate chooses between a model plan and a lookup plan, got {self.model}, {self.lookup}")
        if not 0 <= explore <= 1:
            raise ValueError(f"explore must be in [0, 1], got {explore}")
        self.explore, self.rng = explore, random.Random(seed)
        self.tracker = GateFeatures(self.lookup.shape.depth)
        self.steps: list[dict[str, Any]] = []

    def choose(self, state: StepState) -> Plan:
        if state.step == 0:
            self.steps = []
        x = self.tracker.vector(state)
        found = len(self.tracker.proposal)
        u = self.rng.random()
        if found and u < self.explore:
            source, plan = "lookup", self.lookup.for_found(found)
        elif u > 1 - self.explore / 4:
            source, plan = "plain", PLAIN
        else:
            source, plan = "model", self.model
        self.steps.append({"x": x.tolist(), "p": state.context_length, "found": found, "source": source})
        return plan

    def observe(self, result: StepResult) -> None:
        self.tracker.observe(result)
        self.steps[-1].update(accepted=result.num_accepted, seconds=sum(result.times.values()))


def _done_keys(path: Path) -> set[str]:
    if not path.is_file():
        return set()
    keys = set()
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            keys.add(json.loads(line)["key"])
        except (json.JSONDecodeError, KeyError, TypeError):
            continue  # a line torn by an interrupted run: that generation is redone
    return keys


def collect_gate_data(
    engine: Any,
    prompts: Sequence[str],
    temperatures: Sequence[float],
    out: str | Path,
    *,
    model: str,
    lookup: str,
    max_new_tokens: int = 128,
    repeats: int = 1,
    explore: float = 0.3,
    seed: int = 0,
    progress: bool = True,
    root_features: bool = True,
) -> Path:
    """Generate every (repeat, prompt, temperature), appending one JSON line per generation to ``out``.

    Generation ``n`` (repeats outermost) is seeded with ``seed + n``; those already in ``out`` are skipped.
    ``root_features=False`` runs no draft forward before each choice (the features of
    :data:`~adaptive_spec.planner.gate.ROOT_FEATURES` are then 0): the step times of a gate that reads none.
    A file holds one kind of collection: resuming it with the other kind is refused.
    """
    from tqdm.auto import tqdm

    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    done = _done_keys(out)
    if done and data_root_features(read_gate_data(out)) != root_features:
        kind = "with" if not root_features else "without"
        raise ValueError(f"{out} was collected {kind} draft root features; give another --data")
    jobs = [(r, i, t) for r in range(repeats) for i in range(len(prompts)) for t in temperatures]
    for n, (r, i, t) in enumerate(tqdm(jobs, desc="gate data", unit="gen", disable=not progress)):
        key = f"{r}:{i}:{t:g}"
        if key in done:
            continue
        recorder = GateRecorder(model, lookup, explore, seed + n, root_features)
        result = engine.generate(
            prompts[i], max_new_tokens=max_new_tokens, temperature=t, plan=recorder, seed=seed + n, keep_state=True
        )
        record = {
            "key": key,
            "prompt": i,
            "temperature": t,
            "ids": list(map(int, result.state.context)),
            "prompt_length": result.state.prompt_length,
            "root_features": root_features,
            "steps": recorder.steps,
        }
        with out.open("a", encoding="utf-8") as f:  # one whole line per generation
            f.write(json.dumps(record) + "\n")
    return out


def read_gate_data(path: str | Path) -> list[dict[str, Any]]:
    """The generations of a gate data file (a torn last line is skipped)."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{path}: no gate data; collect it with `adaptive-spec selector gate` (no --skip-collect)")
    records = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    if not records:
        raise ValueError(f"{path}: no gate data; run `adaptive-spec selector gate` to collect it")
    return records


def data_root_features(records: Sequence[dict[str, Any]]) -> bool:
    """Whether the records were collected with the draft root forward before each choice (older files: yes)."""
    kinds = {bool(r.get("root_features", True)) for r in records}
    if len(kinds) > 1:
        raise ValueError("the gate data mixes collections with and without draft root features")
    return kinds.pop() if kinds else True


def lookup_depth(candidates: Sequence[Sequence[int]], continuation: Sequence[int]) -> int:
    """How deep ``continuation`` follows the trie of ``candidates`` (the accepted length of a lookup step)."""
    depth = 0
    alive = list(candidates)
    while alive and depth < len(continuation):
        alive = [c for c in alive if depth < len(c) and c[depth] == continuation[depth]]
        if alive:
            depth += 1
    return depth


def label_steps(records: Sequence[dict[str, Any]], lookup: Plan | str) -> dict[str, np.ndarray]:
    """Features, labels and masks of every recorded step (see the module docstring).

    Returns:
        ``x`` [N, F], ``lookup`` [N] (accepted length of the lookup plan; NaN where nothing was
        found or the generation ended before the lookup's depth), ``model`` [N] (accepted length of
        the model plan; NaN on the other steps), ``found`` [N], ``seconds`` [N], ``is_lookup`` [N]
        and ``is_plain`` [N] (the step's source), ``group`` [N] (prompt).
    """
    plan = as_plan(lookup)
    paths = plan.shape.paths if plan.shape.law is DraftLaw.DETERMINISTIC else 1
    depth = plan.shape.depth
    names = ("lookup", "model", "found", "seconds", "is_lookup", "is_plain", "group")
    cols: dict[str, list[float]] = {k: [] for k in names}
    xs = []
    for rec in records:
        ids = rec["ids"]
        context: list[int] = []
        ngrams = NgramIndex(context)  # ids[:p] for each step's p, indexed as it grows
        for step in rec["steps"]:
            if "accepted" not in step:
                continue
            p = step["p"]
            rest = ids[p : p + depth]
            y = math.nan
            if step["found"] and len(rest) == depth:
                del context[p:]  # (steps come in order: nothing to delete)
                context.extend(map(int, ids[len(context) : p]))
                y = lookup_depth(ngrams.candidates(paths, depth), rest)
            xs.append(step["x"])
            cols["lookup"].append(y)
            cols["model"].append(step["accepted"] if step["source"] == "model" else math.nan)
            cols["found"].append(step["found"])
            cols["seconds"].append(step["seconds"])
            cols["is_lookup"].append(step["source"] == "lookup")
            cols["is_plain"].append(step["source"] == "plain")
            cols["group"].append(rec["prompt"])
    if not xs:
        raise ValueError("the gate data has no finished steps")
    out = {k: np.asarray(v, dtype=np.float64) for k, v in cols.items()}
    out["x"] = np.asarray(xs, dtype=np.float32)
    return out


def fit_costs(data: dict[str, np.ndarray]) -> dict[str, float]:
    """Step times: the median model and plain steps, and a least-squares line in the tokens found for lookup steps."""
    look, plain = data["is_lookup"] > 0, data["is_plain"] > 0
    model = ~look & ~plain
    if look.sum() < 2 or model.sum() < 1 or plain.sum() < 1:
        raise ValueError("the gate data needs model steps, plain steps and at least two lookup steps; raise --explore")
    model_s = float(np.median(data["seconds"][model]))
    plain_s = float(np.median(data["seconds"][plain]))
    found, secs = data["found"][look], data["seconds"][look]
    if np.ptp(found) > 0:
        slope, intercept = np.polyfit(found, secs, 1)
    else:
        slope, intercept = 0.0, float(np.median(secs))
    slope = max(float(slope), 0.0)
    intercept = max(float(intercept), 1e-6)
    return {"model_s": model_s, "lookup_s": intercept, "per_token_s": slope, "plain_s": plain_s}


def fit_gate(
    data: dict[str, np.ndarray],
    model: str,
    lookup: str,
    *,
    hidden: int = 32,
    epochs: int = 400,
    lr: float = 3e-3,
    weight_decay: float = 1e-4,
    val_fraction: float = 0.25,
    seed: int = 0,
    features: Sequence[str] = GATE_FEATURES,
) -> tuple[SourceGate, dict[str, Any]]:
    """Fit the gate's perceptron on :func:`label_steps`' output; returns the gate and a report.

    ``features``: the inputs it reads (a subset of :data:`~adaptive_spec.planner.gate.GATE_FEATURES`,
    in that order).

    The prompts are split into training and validation groups; the epoch with the lowest
    validation error is kept. The report has each source's mean absolute error on validation,
    against the constant (mean-label) predictor, and the step times.
    """
    import torch

    torch.manual_seed(seed)
    model_plan, lookup_plan = as_plan(model), as_plan(lookup)
    depths = torch.tensor([lookup_plan.shape.depth, model_plan.shape.depth], dtype=torch.float32)
    unknown = [f for f in features if f not in GATE_FEATURES]
    if unknown or not features:
        raise ValueError(f"unknown gate features {unknown}; choose among {', '.join(GATE_FEATURES)}")
    features = sorted(set(features), key=GATE_FEATURES.index)
    full = data["x"].astype(np.float32)
    x = full[:, [GATE_FEATURES.index(f) for f in features]]
    y = np.stack([data["lookup"], data["model"]], axis=1)
    val, val_groups = _validation_split(data["group"], val_fraction, seed)
    mean = x[~val].mean(0)
    scale = x[~val].std(0) + 1e-3
    net = _train_gate_net((x - mean) / scale, y, val, depths, hidden, epochs, lr, weight_decay)
    layers = [
        [net[0].weight.detach().numpy().tolist(), net[0].bias.detach().numpy().tolist()],
        [net[2].weight.detach().numpy().tolist(), net[2].bias.detach().numpy().tolist()],
    ]
    gate = SourceGate(
        {
            "version": GATE_VERSION,
            "features": list(features),
            "model_plan": str(model_plan),
            "lookup_plan": str(lookup_plan),
            "mean": mean.tolist(),
            "scale": scale.tolist(),
            "layers": layers,
            "costs": fit_costs(data),
        }
    )
    report: dict[str, Any] = {"steps": len(x), "val_steps": int(val.sum()), "val_prompts": len(val_groups)}
    report["features"] = list(features)
    report |= _validation_errors(gate.predict(full[val]), y, val)
    report["costs"] = gate.data["costs"]
    return gate, report


def _validation_split(group: np.ndarray, val_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``(mask of the validation steps, the validation prompts)``: a random ``val_fraction`` of the prompts.

    Raises:
        ValueError: fewer than two prompts (one to train on and one to validate on).
    """
    groups = np.unique(group)
    rng = np.random.default_rng(seed)
    val_groups = rng.choice(groups, size=max(1, round(len(groups) * val_fraction)), replace=False)
    val = np.isin(group, val_groups)
    if val.all() or not val.any():
        raise ValueError("the gate data needs at least two prompts (one to validate on)")
    return val, val_groups


def _train_gate_net(
    x: np.ndarray,
    y: np.ndarray,
    val: np.ndarray,
    depths: Any,
    hidden: int,
    epochs: int,
    lr: float,
    weight_decay: float,
) -> Any:
    """The perceptron (standardised ``x`` -> each source's accepted tokens, at most its ``depths``), early-stopped.

    ``y`` is ``[steps, 2]`` (lookup, model) with NaN where a source is unlabelled; the loss is the
    squared error on the labelled entries, and the epoch with the lowest loss on the ``val`` steps is kept.
    """
    import torch

    xt = torch.from_numpy(x)
    yt = torch.from_numpy(np.nan_to_num(y, nan=0.0)).float()
    mt = torch.from_numpy(~np.isnan(y)).float()
    net = torch.nn.Sequential(torch.nn.Linear(x.shape[1], hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 2))
    opt = torch.optim.AdamW(net.parameters(), lr=lr, weight_decay=weight_decay)
    tr, va = torch.from_numpy(~val), torch.from_numpy(val)

    def loss_of(rows: torch.Tensor) -> torch.Tensor:
        pred = depths * torch.sigmoid(net(xt[rows]))
        err = (pred - yt[rows]) ** 2 * mt[rows]
        return (err.sum(0) / mt[rows].sum(0).clamp_min(1)).sum()

    best, best_state = math.inf, None
    for _ in range(epochs):
        net.train()
        opt.zero_grad()
        loss = loss_of(tr)
        loss.backward()
        opt.step()
        with torch.no_grad():
            v = float(loss_of(va))
        if v < best:
            best, best_state = v, {k: t.clone() for k, t in net.state_dict().items()}
    net.load_state_dict(best_state)
    return net


def _validation_errors(pred: np.ndarray, y: np.ndarray, val: np.ndarray) -> dict[str, dict[str, Any]]:
    """Per source (``lookup``, ``model``): labelled steps, mean label, and the validation MAE of ``pred``
    against that of the constant (training mean) predictor.
    """
    out: dict[str, dict[str, Any]] = {}
    for j, name in enumerate(("lookup", "model")):
        ok = ~np.isnan(y[val, j])
        truth = y[val, j][ok]
        out[name] = {
            "labelled": int((~np.isnan(y[:, j])).sum()),
            "mean_label": float(truth.mean()) if ok.any() else None,
            "val_mae": float(np.abs(pred[ok, j] - truth).mean()) if ok.any() else None,
            "val_mae_constant": float(np.abs(np.nanmean(y[~val, j]) - truth).mean()) if ok.any() else None,
        }
    return out


def write_gate(gate: SourceGate, path: str | Path, report: dict[str, Any], provenance: dict[str, Any]) -> Path:
    """Write the gate file atomically (JSON: the weights, the step times, the report and where it came from)."""
    from adaptive_spec.files import atomic_write

    data = gate.to_dict() | {"report": report, "provenance": provenance}
    return atomic_write(path, json.dumps(data, indent=1) + "\n")
