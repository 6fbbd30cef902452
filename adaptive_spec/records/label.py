"""Offline labels: expected block efficiency and predicted step time of every action, per logged root.

``adaptive-spec label DIR`` takes every k-th logged root context of a feature log (the Parquet
shards written by ``collect`` or by ``SpecEngine(feature_log=DIR)``) and, for every action of the
action space, estimates

* E[τ + 1], averaged over ``samples`` draft trees (default 4, as in DDTE). The verifier's
  randomness is integrated out exactly on each fixed tree
  (:func:`adaptive_spec.analysis.expected.expected_block_efficiency`): closed forms for the
  token-level test, BV/traversal/GBV (one all-reject run) and the top-down walks (DDTE eq. 1-3);
* the predicted step time, from the latency profile (:class:`adaptive_spec.planner.latency.LatencyModel`).

Trees are drawn as *maximal* trees per family and cut down to every action of the family, which
keeps each action's drafting law exact:

* ``chain:L``: the first L tokens of one chain;
* ``iid:KxL`` / ``delayed:TxKxB``: the trunk, then the first K of Kmax i.i.d. rollouts, each cut to
  B tokens (rollouts are i.i.d. and ordered; a rollout's prefix is a shorter rollout);
* ``wor:w1x..``: the first w_d children of each node (a prefix of a Gumbel-top-k draw is a
  Gumbel-top-w draw, Plackett-Luce);
* a chain drafting policy (``conf-chain``, ``cum-chain``, ``learned-chain``: any
  :class:`~adaptive_spec.trees.policy.ChainRule`): the policy is run along the drawn chain, on the
  same draft-side facts the engine's drafter gives it, and the chain is cut after the first node
  it does not feed (:func:`policy_chain_length`). Its predicted step time is the mean over the
  samples of the static chain of the length it kept (the policy's own decisions, 8-40 µs per
  level on a CPU, are not in the latency profile).

All maximal trees of all samples of one context form one forest under one root (the last
committed token): the draft model grows it level by level (one forward per depth for the whole
forest) and the target scores it in ONE batched forward under a tree attention mask.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import time
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from adaptive_spec.analysis.expected import expected_block_efficiency
from adaptive_spec.engine.drafting import check_finite, finite_flag
from adaptive_spec.engine.logits import ProbsFn, SamplingConfig, build_logits_processor
from adaptive_spec.engine.runner import ModelRunner
from adaptive_spec.formats.features import SCHEMA
from adaptive_spec.formats.label_table import LABELS_FILE, LabelTable, write_labels
from adaptive_spec.planner.plan import Plan
from adaptive_spec.trees import DraftLaw, DraftTree, TreeShape
from adaptive_spec.trees.draw import draw_children
from adaptive_spec.trees.policy import ChainRule, NodeView, PolicyContext, row_stats


@dataclass(frozen=True)
class LabelConfig:
    """Settings of a labelling run.

    Attributes:
        every: label the roots whose step index is a multiple of ``every`` (k).
        samples: draft trees per root and family (s); E[τ+1] is their mean.
        seed: seeds the tree draws (each root gets its own stream derived from it).
        max_contexts: stop after this many roots (None: all selected roots).
    """

    every: int = 4
    samples: int = 4
    seed: int = 0
    max_contexts: int | None = None

    def __post_init__(self) -> None:
        if self.every < 1 or self.samples < 1:
            raise ValueError(f"every and samples must be >= 1, got every={self.every}, samples={self.samples}")
        if self.max_contexts is not None and self.max_contexts < 1:
            raise ValueError(f"max_contexts must be >= 1 or None, got {self.max_contexts}")


# ---------------------------------------------------------------------------------------- the forest
@dataclass
class _FamilyTree:
    """One maximal tree of the forest; node ids are forest ids (0 = the shared root)."""

    kind: str  # "chain" | "rollout" | "wor"
    trunk: int = 0  # rollout: trunk length T
    paths: int = 1  # rollout: Kmax
    length: int = 0  # chain: L; rollout: branch length Bmax
    widths: tuple[int, ...] = ()  # wor: max widths per depth
    trunk_nodes: list[int] = field(default_factory=list)
    walkers: list[list[int]] = field(default_factory=list)  # rollout: node ids along each rollout
    kids: dict[int, list[int]] = field(default_factory=lambda: defaultdict(list))  # draw order, distinct

    @property
    def depth(self) -> int:
        if self.kind == "chain":
            return self.length
        if self.kind == "rollout":
            return self.trunk + self.length
        return len(self.widths)


def family_specs(plans: list[Plan]) -> list[_FamilyTree]:
    """The maximal trees (one per family) from which every plan's tree is cut."""
    chain_len, rollouts, wor = 0, {}, []
    for plan in plans:
        if plan.policy is not None:
            if not isinstance(plan.policy, ChainRule):
                raise ValueError(f"cannot label {plan}: the labeller takes static shapes and chain policies only")
            chain_len = max(chain_len, plan.policy.depth)
            continue
        s = plan.shape
        if s.law is DraftLaw.CHAIN:
            chain_len = max(chain_len, s.depth)
        elif s.law is DraftLaw.WITHOUT_REPLACEMENT:
            size = max(len(wor), len(s.widths))
            pad = lambda w, size=size: list(w) + [0] * (size - len(w))  # noqa: E731
            wor = [max(a, b) for a, b in zip(pad(wor), pad(s.widths), strict=True)]
        else:
            trunk = s.trunk if s.law is DraftLaw.DELAYED else 0
            k, b = rollouts.get(trunk, (0, 0))
            rollouts[trunk] = (max(k, s.paths), max(b, s.branch_len))
    specs = []
    if chain_len:
        specs.append(_FamilyTree("chain", length=chain_len))
    for trunk in sorted(rollouts):
        k, b = rollouts[trunk]
        specs.append(_FamilyTree("rollout", trunk=trunk, paths=k, length=b))
    if wor:
        specs.append(_FamilyTree("wor", widths=tuple(wor)))
    return specs


def _fresh(spec: _FamilyTree) -> _FamilyTree:
    return _FamilyTree(spec.kind, spec.trunk, spec.paths, spec.length, spec.widths)


class Forest:
    """Tokens, parents and depths of all maximal trees of one root, grown level by level."""

    def __init__(self, specs: list[_FamilyTree], samples: int) -> None:
        self.trees = [_fresh(spec) for _ in range(samples) for spec in specs]
        self.samples = samples
        self.tokens, self.parents, self.depths = [-1], [-1], [0]
        self.owner = [-1]  # tree index of each node (-1: the shared root)
        self.ancestors: torch.Tensor | None = None  # BoolTensor[n, n], set by grow_forest

    def add(self, tree_idx: int, parent: int, token: int) -> int:
        tree = self.trees[tree_idx]
        for c in tree.kids[parent]:  # merge within one tree (same parent, same token)
            if self.tokens[c] == token:
                return c
        self.tokens.append(token)
        self.parents.append(parent)
        self.depths.append(self.depths[parent] + 1)
        self.owner.append(tree_idx)
        node = len(self.tokens) - 1
        tree.kids[parent].append(node)
        return node

    @property
    def max_depth(self) -> int:
        return max(t.depth for t in self.trees)


def grow_forest(
    forest: Forest,
    draft: ModelRunner,
    root_row: torch.Tensor,
    context_length: int,
    probs_fn: ProbsFn,
    generator: torch.Generator,
    greedy: bool,
) -> dict[int, torch.Tensor]:
    """Draw every maximal tree, one draft forward per depth; returns the draft row of each expanded node.

    The draft cache holds the context minus its last token; the block is [root, forest nodes...].
    Draws follow the engine's drafting laws (``engine/drafting.py``): at temperature 0 single
    walkers (chains, trunks) take the argmax and without-replacement nodes their top-w tokens,
    while i.i.d. rollouts are sampled.
    """
    device = root_row.device
    rows: dict[int, torch.Tensor] = {0: root_row}
    cap = 1 + sum(_max_nodes(t) for t in forest.trees)
    anc = torch.zeros(cap, cap, dtype=torch.bool, device=device)
    anc[0, 0] = True
    for d in range(forest.max_depth):
        # (tree, parent, mode): "one" = a single walker, "iid" = one i.i.d. draw, ("wor", w)
        requests: list[tuple[int, int, Any]] = []
        for ti, tree in enumerate(forest.trees):
            if d >= tree.depth:
                continue
            if tree.kind == "chain":
                requests.append((ti, tree.trunk_nodes[-1] if tree.trunk_nodes else 0, "one"))
            elif tree.kind == "rollout":
                if d < tree.trunk:
                    requests.append((ti, tree.trunk_nodes[-1] if tree.trunk_nodes else 0, "one"))
                else:
                    if d == tree.trunk:
                        start = tree.trunk_nodes[-1] if tree.trunk_nodes else 0
                        tree.walkers = [[start] for _ in range(tree.paths)]
                    requests.extend((ti, w[-1], ("iid", wi)) for wi, w in enumerate(tree.walkers))
            else:
                requests.extend((ti, n, ("wor", tree.widths[d])) for n in _level(tree, d))
        new_nodes = _draw_level(forest, requests, rows, probs_fn.vocab_size, generator, greedy)
        if not new_nodes:
            break
        # Ancestor rows of the new nodes, then feed those that will be expanded.
        ids = torch.tensor(new_nodes, device=device)
        par = torch.tensor([forest.parents[n] for n in new_nodes], device=device)
        anc[ids] = anc[par]
        anc[ids, ids] = True
        # Every new node is fed (as in the engine), so that the draft cache's block order is the
        # forest's node order; only the deepest level is never fed.
        expand = new_nodes
        if d + 1 < forest.max_depth:
            e = torch.tensor(expand, device=device)
            m = len(forest.tokens)
            logits = draft.block_forward(
                torch.tensor([forest.tokens[n] for n in expand], device=device),
                torch.full((len(expand),), context_length - 1 + d + 1, device=device),
                anc[e, :m],
                logits_to_keep=len(expand),
            )
            check_finite(finite_flag(logits), "draft")
            probs = probs_fn(logits)
            for i, n in enumerate(expand):
                rows[n] = probs[i]
    forest.ancestors = anc[: len(forest.tokens), : len(forest.tokens)]
    return rows


def _max_nodes(tree: _FamilyTree) -> int:
    if tree.kind == "chain":
        return tree.length
    if tree.kind == "rollout":
        return tree.trunk + tree.paths * tree.length
    total, level = 0, 1
    for w in tree.widths:
        level *= w
        total += level
    return total


def _level(tree: _FamilyTree, depth: int) -> list[int]:
    """Nodes of a without-replacement tree at ``depth`` (>= 1), in draw order."""
    level = [0]
    for _ in range(depth):
        level = [c for n in level for c in tree.kids.get(n, [])]
    return level


def _draw_level(
    forest: Forest,
    requests: list[tuple[int, int, Any]],
    rows: dict[int, torch.Tensor],
    vocab: int,
    generator: torch.Generator,
    greedy: bool,
) -> list[int]:
    if not requests:
        return []
    R = torch.stack([rows[parent] for _, parent, _ in requests])  # [W, V]
    # The engine's drafting laws (draw_children): at T=0 single walkers take the argmax and
    # without-replacement nodes their top-w tokens, while i.i.d. rollouts are sampled.
    greedy_rows = False
    if greedy:
        greedy_rows = torch.tensor([mode == "one" or mode[0] == "wor" for _, _, mode in requests], device=R.device)
    kmax = max((mode[1] for _, _, mode in requests if mode != "one" and mode[0] == "wor"), default=1)
    kmax = min(kmax, vocab)
    top, valid = draw_children(R, kmax, generator, greedy=greedy_rows)
    idx, ok = top.tolist(), valid.tolist()
    before = len(forest.tokens)
    for r, (ti, parent, mode) in enumerate(requests):
        tree = forest.trees[ti]
        if mode == "one":
            tree.trunk_nodes.append(forest.add(ti, parent, idx[r][0]))
        elif mode[0] == "iid":
            tree.walkers[mode[1]].append(forest.add(ti, parent, idx[r][0]))
        else:  # without replacement: the top-w of the race (w distinct tokens of nonzero probability)
            for j in range(min(mode[1], vocab)):
                if ok[r][j]:
                    forest.add(ti, parent, idx[r][j])
    return list(range(before, len(forest.tokens)))


def cut_tree(forest: Forest, tree: _FamilyTree, shape: TreeShape, rows: dict[int, torch.Tensor], vocab: int):
    """The draft tree of ``shape`` cut from a maximal tree: (DraftTree, forest ids of its nodes)."""
    edges: list[tuple[int, int]] = []  # (parent, child) draws in drafting order, forest ids
    if shape.law is DraftLaw.CHAIN:
        path = [0, *tree.trunk_nodes[: shape.depth]]
        edges = list(itertools.pairwise(path))
    elif shape.law is DraftLaw.WITHOUT_REPLACEMENT:
        level = [0]
        for w in shape.widths:
            nxt = []
            for n in level:
                kids = tree.kids.get(n, [])[:w]
                edges.extend((n, c) for c in kids)
                nxt.extend(kids)
            level = nxt
    else:
        trunk = shape.trunk if shape.law is DraftLaw.DELAYED else 0
        path = [0, *tree.trunk_nodes[:trunk]]
        edges = list(itertools.pairwise(path))
        for walker in tree.walkers[: shape.paths]:
            seq = walker[: shape.branch_len + 1]  # walker[0] is the branching node
            edges.extend(itertools.pairwise(seq))
    ids = sorted({0, *(c for _, c in edges)})  # forest ids grow with depth: parents come first
    local = {g: i for i, g in enumerate(ids)}
    child_draws: list[list[int]] = [[] for _ in ids]
    for parent, child in edges:
        child_draws[local[parent]].append(local[child])
    zero = torch.zeros(vocab, dtype=rows[0].dtype, device=rows[0].device)
    has_kids = {local[p] for p, _ in edges}
    probs = torch.stack([rows[g] if i in has_kids else zero for i, g in enumerate(ids)])
    dtree = DraftTree(
        [forest.tokens[g] if g else -1 for g in ids],
        [-1] + [local[forest.parents[g]] for g in ids[1:]],
        [forest.depths[g] for g in ids],
        probs,
        child_draws,
        shape,
    )
    return dtree, ids


def policy_chain_length(
    policy: ChainRule,
    forest: Forest,
    chain: list[int],
    rows: dict[int, torch.Tensor],
    temperature: float,
    stats: dict[int, tuple[float, float]] | None = None,
) -> int:
    """How many tokens of a drawn chain a chain policy keeps.

    The policy sees each drawn node as the engine's drafter shows it (depth, the token's draft
    probability, the entropy and top-1 of the row it was drawn from, the path probability, the
    parent's memo) and the chain ends after the first node it does not feed, or at its depth.
    The chain's tokens are the policy's own draws: a dynamic chain draws each child from the
    fed node's row exactly as a static chain does, so a prefix of the drawn chain has its law.

    Args:
        policy: the chain policy.
        forest: the forest holding the chain.
        chain: forest ids of the drawn chain's nodes, by depth (at least ``policy.depth`` long).
        rows: draft rows of the forest's expanded nodes (0 = the root).
        temperature: the step's temperature, as the policy sees it.
        stats: a cache of ``(entropy, top-1)`` per forest id, shared across policies.
    """
    stats = {} if stats is None else stats
    parent, parent_memo, path = 0, None, 1.0
    for depth, node in enumerate(chain[: policy.depth], start=1):
        if parent not in stats:
            stats[parent] = row_stats(rows[parent])
        ent, top1 = stats[parent]
        q = float(rows[parent][forest.tokens[node]])
        path *= q
        view = NodeView(depth, depth - 1, forest.tokens[node], depth, q, path, ent, top1, parent_memo=parent_memo)
        # the node budget left after `depth` draws, as the engine's drafter passes it
        fed = policy.feed([view], PolicyContext(policy.depth - depth, temperature), None)[0]
        if not fed or depth == policy.depth:
            return depth
        parent, parent_memo = node, view.memo
    return min(policy.depth, len(chain))


# ---------------------------------------------------------------------------------------- labelling
class Labeller:
    """Labels root contexts for every action of a space with one draft/target pair.

    Args:
        target, draft: transformers causal LMs (eval mode) on the same device, same vocabulary.
        actions: the plans to label (an :class:`~adaptive_spec.planner.actions.ActionSpace` or list).
        latency: a :class:`~adaptive_spec.planner.latency.LatencyModel` (predicted step times).
        vocab_size: the shared vocabulary size.
        config: :class:`LabelConfig`.
    """

    def __init__(self, target, draft, actions, latency, vocab_size: int, config: LabelConfig | None = None) -> None:
        self.target, self.draft = target, draft
        self.plans = [a if isinstance(a, Plan) else Plan.parse(str(a)) for a in actions]
        self.latency = latency
        self.vocab_size = vocab_size
        self.config = config or LabelConfig()
        self.specs = family_specs(self.plans)
        self.device = next(target.parameters()).device

    def _family_of(self, shape: TreeShape) -> int:
        for i, spec in enumerate(self.specs):
            if shape.law is DraftLaw.DYNAMIC_CHAIN and spec.kind == "chain":
                return i
            if shape.law is DraftLaw.CHAIN and spec.kind == "chain":
                return i
            if shape.law is DraftLaw.WITHOUT_REPLACEMENT and spec.kind == "wor":
                return i
            if shape.law in (DraftLaw.IID, DraftLaw.DELAYED) and spec.kind == "rollout":
                trunk = shape.trunk if shape.law is DraftLaw.DELAYED else 0
                if spec.trunk == trunk:
                    return i
        raise AssertionError(f"no family for {shape}")  # pragma: no cover

    @torch.inference_mode()
    def label(self, context_ids: list[int], temperature: float, top_k: int, top_p: float, seed: int):
        """(E[τ+1] per action [A], predicted seconds per step per action [A]) at one root context."""
        if len(context_ids) < 1:
            raise ValueError("a root context needs at least one token")
        sampling = SamplingConfig(float(temperature), int(top_k), float(top_p))
        processors = build_logits_processor(sampling.generation_config())
        target_fn = ProbsFn(processors, self.vocab_size, one_hot=sampling.greedy)
        draft_fn = ProbsFn(processors, self.vocab_size, one_hot=False)
        generator = torch.Generator(device=self.device).manual_seed(int(seed))
        ctx = torch.tensor(context_ids, dtype=torch.long, device=self.device)
        n = len(context_ids)

        draft = ModelRunner(self.draft)
        if n > 1:
            draft.chain_forward(ctx[:-1], logits_to_keep=1)
        root_logits = draft.block_forward(
            ctx[-1:], torch.tensor([n - 1], device=self.device), torch.ones(1, 1, dtype=torch.bool, device=self.device),
            logits_to_keep=1,
        )  # fmt: skip
        check_finite(finite_flag(root_logits), "draft")
        forest = Forest(self.specs, self.config.samples)
        rows = grow_forest(forest, draft, draft_fn(root_logits)[0], n, draft_fn, generator, sampling.greedy)

        target = ModelRunner(self.target)
        if n > 1:
            target.chain_forward(ctx[:-1], logits_to_keep=1)
        m = len(forest.tokens)
        ids = torch.tensor([context_ids[-1], *forest.tokens[1:]], dtype=torch.long, device=self.device)
        pos = torch.tensor([n - 1 + d for d in forest.depths], dtype=torch.long, device=self.device)
        logits = target.block_forward(ids, pos, forest.ancestors, logits_to_keep=m)  # ONE pass, all trees
        check_finite(finite_flag(logits), "target")
        target_probs = target_fn(logits).double()  # [m, V]
        rows = {k: v.double() for k, v in rows.items()}

        be = np.zeros(len(self.plans), dtype=np.float64)
        times = np.zeros(len(self.plans), dtype=np.float64)
        cut_cache: dict[tuple[str, int], tuple[DraftTree, torch.Tensor]] = {}
        stats: dict[int, tuple[float, float]] = {}  # (entropy, top-1) per draft row, for the policies
        for a, plan in enumerate(self.plans):
            fam = self._family_of(plan.shape)
            total, seconds = 0.0, 0.0
            for s in range(self.config.samples):
                tree = forest.trees[s * len(self.specs) + fam]
                shape = plan.shape
                if plan.policy is not None:  # the chain the policy keeps of this sample's chain
                    length = policy_chain_length(plan.policy, forest, tree.trunk_nodes, rows, temperature, stats)
                    shape = TreeShape.chain(length)
                    seconds += self.latency.predict(Plan(shape, plan.verifier), n, temperature=temperature).total_s
                key = (str(shape), s)
                if key not in cut_cache:
                    dtree, gids = cut_tree(forest, tree, shape, rows, self.vocab_size)
                    cut_cache[key] = (dtree, target_probs[torch.tensor(gids, device=self.device)])
                dtree, trows = cut_cache[key]
                verifier = "greedy" if sampling.greedy else plan.verifier
                value, _ = expected_block_efficiency(verifier, dtree, trows, generator=generator)
                total += value
            be[a] = total / self.config.samples
            if plan.policy is None:
                times[a] = self.latency.predict(plan, n, temperature=temperature).total_s
            else:
                times[a] = seconds / self.config.samples
        return be, times


# ---------------------------------------------------------------------------------------- the command
def select_roots(table, every: int, max_contexts: int | None) -> list[int]:
    """Row indices of the logged roots to label: steps that are multiples of ``every``."""
    steps = table.column("step").to_numpy()
    rows = [i for i, s in enumerate(steps) if int(s) % every == 0]
    return rows[:max_contexts] if max_contexts is not None else rows


def label_directory(
    log_dir: str | Path,
    labeller: Labeller,
    *,
    out: str | Path | None = None,
    progress: bool = True,
    strict: bool = False,
) -> tuple[LabelTable, Path]:
    """Label the roots of a feature log; write ``labels.parquet`` next to the shards (atomically).

    A torn shard is skipped with a warning naming it, unless ``strict`` (then it is an error).
    """
    from tqdm.auto import tqdm

    from adaptive_spec.formats.feature_log import read_shards

    log_dir = Path(log_dir)
    table = read_shards(log_dir, strict=strict)
    manifest_path = log_dir / "manifest.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
    cfg = labeller.config
    rows = select_roots(table, cfg.every, cfg.max_contexts)
    if not rows:
        raise ValueError(f"{log_dir}: no logged step is a multiple of every={cfg.every}; lower --every")
    cols = {name: table.column(name) for name in ("run_id", "prompt_key", "step", "context_ids", "temperature",
                                                  "top_k", "top_p")}  # fmt: skip
    feats = np.stack([table.column(name).to_numpy() for name in SCHEMA.names], axis=1).astype(np.float32)
    hidden = {h: table.column(h) if h in table.column_names else None for h in ("draft_hidden", "target_hidden")}
    be, times = [], []
    t0 = time.perf_counter()
    for i in tqdm(rows, desc="labelling roots", unit="root", disable=not progress):
        ctx = cols["context_ids"][i].as_py()
        seed = int.from_bytes(hashlib.sha256(f"{cfg.seed}:{i}:{cols['run_id'][i]}".encode()).digest()[:4], "little")
        b, t = labeller.label(
            ctx, float(cols["temperature"][i].as_py()), int(cols["top_k"][i].as_py()),
            float(cols["top_p"][i].as_py()), seed,
        )  # fmt: skip
        be.append(b)
        times.append(t)

    def hidden_rows(name: str) -> np.ndarray | None:
        col = hidden[name]
        if col is None or col[rows[0]].as_py() is None:
            return None
        return np.asarray([col[i].as_py() for i in rows], dtype=np.float16)

    label_manifest = {
        "log": manifest,
        "label_config": asdict(cfg),
        "actions": [str(p) for p in labeller.plans],
        "latency_profile": getattr(labeller.latency, "profile", {}).get("device", None),
        "seconds": round(time.perf_counter() - t0, 1),
        "roots": len(rows),
    }
    out_table = LabelTable(
        actions=[str(p) for p in labeller.plans],
        features=feats[rows],
        block_efficiency=np.asarray(be, np.float32),
        step_time_s=np.asarray(times, np.float32),
        run_id=[str(cols["run_id"][i]) for i in rows],
        prompt_key=[str(cols["prompt_key"][i]) for i in rows],
        step=np.asarray([int(cols["step"][i].as_py()) for i in rows], np.int32),
        draft_hidden=hidden_rows("draft_hidden"),
        target_hidden=hidden_rows("target_hidden"),
        manifest=label_manifest,
    )
    path = write_labels(out_table, Path(out) if out is not None else log_dir / LABELS_FILE)
    return out_table, path


# ---------------------------------------------------------------------------------------- the report
def _family(plan: str) -> str:
    return plan.split(":", 1)[0]


def label_report(table: LabelTable) -> dict[str, Any]:
    """Summary of a label set: best actions, winning verifiers/shapes, oracle gain per temperature."""
    tps = table.tokens_per_s
    temps = table.features[:, SCHEMA.names.index("temperature")]
    out: dict[str, Any] = {"roots": len(table), "actions": len(table.actions), "per_temperature": {}}
    best = tps.argmax(axis=1)
    for t in sorted({round(float(x), 3) for x in temps}):
        sel = np.isclose(temps, t)
        sub, b = tps[sel], best[sel]
        static = int(sub.mean(axis=0).argmax())
        oracle = float(sub.max(axis=1).mean() / sub[:, static].mean())
        counts = np.bincount(b, minlength=len(table.actions))
        verifier_wins: dict[str, int] = defaultdict(int)
        family_wins: dict[str, int] = defaultdict(int)
        for a, c in enumerate(counts):
            if c:
                verifier_wins[table.actions[a].split("/")[1]] += int(c)
                family_wins[_family(table.actions[a])] += int(c)
        top = np.argsort(-counts)[:10]
        out["per_temperature"][str(t)] = {
            "roots": int(sel.sum()),
            "best_static": table.actions[static],
            "best_static_tokens_per_s": float(sub[:, static].mean()),
            "oracle_tokens_per_s": float(sub.max(axis=1).mean()),
            "oracle_gain": oracle,
            "best_static_block_efficiency": float(table.block_efficiency[sel][:, static].mean()),
            "top_best_actions": {table.actions[a]: int(counts[a]) for a in top if counts[a]},
            "verifier_wins": dict(sorted(verifier_wins.items(), key=lambda kv: -kv[1])),
            "family_wins": dict(sorted(family_wins.items(), key=lambda kv: -kv[1])),
            "distinct_best_actions": int((counts > 0).sum()),
        }
    return out


def write_report(table: LabelTable, out_dir: str | Path) -> dict[str, Any]:
    """Write ``report.json``, ``report.md`` and PNG plots of a label set to ``out_dir``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    rep = label_report(table)
    (out_dir / "report.json").write_text(json.dumps(rep, indent=2))
    temps = list(rep["per_temperature"])
    fig, axes = plt.subplots(len(temps), 3, figsize=(16, 3.6 * len(temps)), squeeze=False)
    for r, t in enumerate(temps):
        d = rep["per_temperature"][t]
        ax = axes[r][0]
        names = list(d["top_best_actions"])[::-1]
        ax.barh(names, [d["top_best_actions"][n] for n in names], color="tab:blue")
        ax.set_title(f"T={t}: most frequent best actions ({d['distinct_best_actions']} distinct)")
        ax.tick_params(axis="y", labelsize=7)
        for c, key, title in ((1, "verifier_wins", "verifier"), (2, "family_wins", "tree shape")):
            ax = axes[r][c]
            ax.bar(list(d[key]), list(d[key].values()), color="tab:green" if c == 1 else "tab:orange")
            ax.set_title(f"T={t}: wins per {title}")
            ax.tick_params(axis="x", labelrotation=30, labelsize=8)
    fig.suptitle("Label set: which action has the highest predicted tokens/s per root")
    fig.tight_layout()
    fig.savefig(out_dir / "best_actions.png", dpi=110)
    plt.close(fig)
    lines = ["# Label report", "", f"{rep['roots']} roots, {rep['actions']} actions.", "",
             "| T | roots | best static | its tok/s | oracle tok/s | **oracle gain** | distinct best |",
             "|---|---|---|---|---|---|---|"]  # fmt: skip
    for t, d in rep["per_temperature"].items():
        lines.append(
            f"| {t} | {d['roots']} | `{d['best_static']}` | {d['best_static_tokens_per_s']:.1f} | "
            f"{d['oracle_tokens_per_s']:.1f} | **{d['oracle_gain']:.3f}** | {d['distinct_best_actions']} |"
        )
    lines += ["", "![best actions](best_actions.png)", ""]
    (out_dir / "report.md").write_text("\n".join(lines))
    return rep


def log_models(manifest: dict, target: str | None = None, draft: str | None = None) -> tuple[str | None, str | None]:
    """The models to label a log with: explicit, else the log's last run's (if they are local folders), else built-in.

    ``(None, None)`` means the built-in pair. Raises ``ValueError`` when only one of the two is given.
    """
    if target or draft:
        from adaptive_spec.engine.models import PAIRED_DRAFT

        if not (target and (draft or target in PAIRED_DRAFT)):
            raise ValueError("give both --target and --draft, a short-named --target alone (smollm2), or neither")
        return target, draft
    runs = manifest.get("runs") or []
    if runs:
        logged_target, logged_draft = runs[-1].get("target"), runs[-1].get("draft")
        if logged_target and logged_draft and Path(logged_target).is_dir() and Path(logged_draft).is_dir():
            return logged_target, logged_draft
    return None, None


def label_log(
    log_dir: str | Path,
    config: LabelConfig,
    *,
    target: str | None = None,
    draft: str | None = None,
    device: str | None = None,
    dtype: str | None = None,
    actions: str | Path | None = None,
    profile: str | Path | None = None,
    out: str | Path | None = None,
    progress: bool = True,
    strict: bool = False,
) -> tuple[LabelTable, Path]:
    """Label a feature log with the models that logged it (see :func:`log_models`); write the label file.

    The models are loaded in the logged dtype unless ``dtype`` is given; ``actions`` is an
    action-space YAML (default: the built-in grid), ``profile`` a latency profile (default:
    :func:`~adaptive_spec.planner.latency.default_profile_path`), ``out`` the label file (default
    ``log_dir/labels.parquet``), ``strict`` refuses a log with a torn shard (default: skip it with a
    warning). Returns the table and the file written.

    Raises:
        ValueError: the loaded models are not the ones that produced the log.
    """
    from adaptive_spec.engine import SpecEngine
    from adaptive_spec.formats.feature_log import _differences, _json_normal, read_manifest
    from adaptive_spec.planner.actions import ActionSpace
    from adaptive_spec.planner.latency import LatencyModel

    manifest = read_manifest(log_dir)
    target, draft = log_models(manifest, target, draft)
    logged = manifest.get("models")
    dtype = dtype or (logged or {}).get("target", {}).get("dtype")  # label in the dtype that was logged
    engine = SpecEngine.from_pretrained(target, draft, device=device, dtype=dtype)
    if logged is not None and _json_normal(engine.describe()["models"]) != logged:
        diff = "; ".join(_differences(logged, _json_normal(engine.describe()["models"]))[:5])
        raise ValueError(
            f"{log_dir} was logged with other models than the ones loaded for labelling ({diff}); pass the "
            "log's models with --target/--draft (labels must use the models that produced the features)"
        )
    space = ActionSpace.from_yaml(actions) if actions else ActionSpace.default()
    latency = LatencyModel.load(profile)
    labeller = Labeller(engine.target, engine.draft, list(space), latency, engine.vocab_size, config)
    return label_directory(log_dir, labeller, out=out, progress=progress, strict=strict)
