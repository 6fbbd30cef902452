"""One decoding step, in one screen: plan -> draft -> one target pass -> verify -> commit.

:class:`StepMixin` holds the step of :class:`~adaptive_spec.engine.engine.SpecEngine` (which sets
up a generation, prefills, loops over steps and emits their tokens): :meth:`StepMixin._step` asks
the planner for a plan (after the step's first draft forward when root features are wanted),
drafts the tree from the plan's source (:mod:`adaptive_spec.engine.drafting`), scores every node
in one target pass under the tree mask, verifies it with the plan's verifier
(:mod:`adaptive_spec.verifiers`) and commits the accepted path to both caches. Plain decoding
(:meth:`StepMixin._autoregressive_step`) is the same target pass over one row. An EAGLE-style tree grown in one
captured replay is read after its target pass is queued (:class:`~adaptive_spec.engine.drafting.DeferredTree`), so
that on a GPU the host's read overlaps the pass.

The mixin reads the engine's ``device``, ``vocab_size``, ``datastore``, ``draft_data`` and ``node_log``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from adaptive_spec.engine.draft_data import log_committed
from adaptive_spec.engine.drafting import (
    DeferredTree,
    DraftOutcome,
    DraftRoot,
    check_finite,
    draft_hybrid,
    draft_lookup_model,
    draft_policy_tree,
    draft_root,
    draft_tree,
    lookup_outcome,
    sample_categorical,
)
from adaptive_spec.engine.eagle import EagleRunner
from adaptive_spec.engine.features import RootFeatures, planner_view
from adaptive_spec.engine.graphs import ModelSlot
from adaptive_spec.engine.logits import ProbsFn, finite_flag, rows_ok
from adaptive_spec.engine.metrics import PhaseTimer
from adaptive_spec.engine.outputs import DeviceTail, EngineState
from adaptive_spec.engine.request import GenerationRequest
from adaptive_spec.planner.plan import Plan, StaticPlanner, StepResult, StepState, as_plan, as_planner
from adaptive_spec.trees import DraftTree, TreeShape, block_ancestors, block_inputs, device_block
from adaptive_spec.verifiers import REGISTRY, VerifyResult, verify
from adaptive_spec.verifiers.base import host_read, result_for

if TYPE_CHECKING:
    from adaptive_spec.formats.feature_log import FeatureLogger


@dataclass
class Run:
    """One generation: its request, its state and the functions built for it by ``SpecEngine._setup``."""

    request: GenerationRequest
    state: EngineState
    target_probs_fn: ProbsFn  # the target's rows as the verifier reads them (one-hot at T=0)
    draft_probs_fn: ProbsFn  # the draft's rows (over its reduced vocabulary, if any)
    soft_probs_fn: ProbsFn  # the processed softmax of the target's rows, for features (one-hot rows at T=0 are not)
    log: FeatureLogger | None
    key: str  # the prompt's key in the feature log
    timer: PhaseTimer
    t_start: float
    slots: dict[str, ModelSlot] = field(default_factory=dict)  # lent by the engine for this run


@dataclass
class StepOutput:
    """What one decoding step produced, before the emission rules."""

    step: int  # the step's number, from 0 (stats.steps before it ran)
    context_length: int
    emitted: list[int] = field(default_factory=list)
    result: StepResult | None = None
    features: Any = None
    propensity: float | None = None


class StepMixin:
    """The decoding step of :class:`~adaptive_spec.engine.engine.SpecEngine` (see the module docstring)."""

    device: torch.device
    vocab_size: int
    datastore: Any
    draft_data: Any
    node_log: Any

    def _step(self, run: Run) -> StepOutput:
        """One decoding step: plan -> draft -> one target pass -> verify -> commit (or one autoregressive token)."""
        state, planner = run.state, run.request.planner
        out = StepOutput(step=state.stats.steps, context_length=len(state.context))
        if planner is None:
            out.emitted = self._autoregressive_step(run)
        else:
            root = None
            if state.root is not None:  # the first draft forward runs before the planner chooses
                root, out.features = self._root_features(run)
            step_state = planner_view(run.request, state, out.step, out.features)
            plan = self._plan(run, step_state)  # 1) plan
            out.propensity = planner.last_propensity
            out.result = self._speculative_step(run, plan, root, step_state.features)  # 2) draft ... 5) commit
            state.steps.append(out.result)
            out.emitted = list(out.result.tokens)
            planner.observe(out.result)
        state.stats.steps += 1
        return out

    def _plan(self, run: Run, step_state: StepState) -> Plan:
        """The planner's plan for this step, cut to the budget (the bonus token counts) and checked."""
        plan = as_plan(run.request.planner.choose(step_state)).truncated(step_state.remaining - 1)
        self.check_plan(plan, run.request.greedy)
        return plan

    def check_planner(self, plan: Any, greedy: bool) -> None:
        """:meth:`check_plan` for what ``generate(plan=...)`` takes, before anything runs: a plan played at every
        step (a :class:`Plan`, its string, a :class:`StaticPlanner`) is checked now; plain decoding needs no check,
        and the plans another planner chooses are checked at each step (:meth:`_plan`).
        """
        planner = as_planner(plan)
        if isinstance(planner, StaticPlanner):
            self.check_plan(planner.plan, greedy)

    def check_plan(self, plan: Plan, greedy: bool) -> None:
        """Raise a one-line ``ValueError`` if this engine cannot play ``plan`` (greedy: at temperature 0).

        A plan that drafts from a datastore needs the engine's (``lookup:WxL+K``); a verifier that is lossless
        only at temperature 0 needs ``greedy``. :meth:`generate` checks a static plan before the prompt is fed,
        the step every plan a planner chooses, and the benchmarks every plan before the first is timed.
        """
        if plan.corpus_paths and self.datastore is None:
            raise ValueError(
                f"plan {plan} drafts from a datastore and the engine has none: give it one (SpecEngine(..., "
                "datastore=FILE), --datastore FILE on the command line; built by adaptive-spec zoo datastore), or "
                "drop the '+K'"
            )
        if not greedy and REGISTRY[plan.verifier].greedy_only:
            raise ValueError(
                f"verifier {plan.verifier!r} is only lossless at temperature 0; use temperature=0 or another verifier"
            )

    @torch.inference_mode()
    def _autoregressive_step(self, run: Run) -> list[int]:
        """One plain target decoding step (the baseline): feed the pending token, sample the next; one host read."""
        state, target = run.state, run.state.target
        with run.timer.phase("target"):
            pending = state.pending(target.cached, self.device)  # the last step's token is on the device already
            logits = target.chain_forward(pending, logits_to_keep=1)  # [1, V']
            probs = run.target_probs_fn(logits)  # [1, V]
            # Greedy: the target's rows are one-hot at the processed argmax.
            token = probs[0].argmax()[None] if run.request.greedy else sample_categorical(probs, state.generator)
            value, ok = torch.cat([token, finite_flag(logits, probs).long()[None]]).tolist()  # the one host read
            check_finite(ok, "target")
            state.tail = DeviceTail(len(state.context), [value], token)
            state.stats.accept_lengths.append(0)
            state.stats.tree_sizes.append(1)
        return [value]

    @torch.inference_mode()
    def _speculative_step(
        self, run: Run, plan: Plan, root: DraftRoot | None, features: Mapping[str, float] | None
    ) -> StepResult:
        """Draft, score, verify and commit one tree (``root``: the step's first draft forward, if already run).

        ``features``: the step's root features, passed on to a drafting policy.
        """
        state, timer, target = run.state, run.timer, run.state.target
        verifier = "greedy" if run.request.greedy else plan.verifier
        n_ctx, base = len(state.context), target.cached  # the target's block starts at ``base``

        # pending tokens (root last): the draft's (when it is fed) and the target's, on the device together (the
        # last step's tokens are there already; anything older is copied once)
        fed = root is None and state.draft is not None and plan.runs_draft
        lo = min(base, state.draft.cached) if fed else base
        tail = state.pending(lo, self.device)
        pending = tail if base == lo else tail[base - lo :]
        draft_pending = (tail if state.draft.cached == lo else tail[state.draft.cached - lo :]) if fed else root

        # 1) draft the tree
        with timer.phase("draft"):
            outcome = self._draft(run, plan, draft_pending, features)

        # 2) score every node in one target forward: block = pending (root last) + drafted nodes
        mark = target.block_mark() if isinstance(outcome, DeferredTree) else None
        with timer.phase("target"):
            logits, target_probs = self._score(run, pending, outcome, base)  # [N, V'], [N, V]
        if isinstance(outcome, DeferredTree):  # the tree's read, after its pass is queued: on a GPU they overlap
            with timer.phase("draft"):
                outcome, redrawn = outcome.read()
            if redrawn:  # a drawn child of probability 0: drawn again on the host, so scored again
                target.undo_block(mark)
                with timer.phase("target"):
                    logits, target_probs = self._score(run, pending, outcome, base)
        tree = outcome.tree

        # 3) verify (the models' finite checks ride the verifier's one host read)
        with timer.phase("verify"):
            result = self._verify(run, plan, verifier, outcome, logits, target_probs)

        # 4) commit the accepted path to both KV caches
        accepted = tree.path(result.node)[1:]  # accepted nodes, root excluded
        nodes = _path_nodes(outcome, accepted)
        state.tail = _emitted_tail(tree, result, n_ctx, nodes)  # the next step's pending tokens, on the device
        self._commit(state, outcome, accepted, base, nodes)
        if self.draft_data is not None:
            log_committed(self.draft_data, state, tree.tokens, accepted, base, logits)
        self._record(run, outcome, result, logits, target_probs)
        return StepResult(plan, tree.num_nodes, result.num_accepted, result.tokens, result.bonus, timer.take_step())

    def _score(
        self, run: Run, pending: torch.Tensor, outcome: DraftOutcome | DeferredTree, base: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The target's pass over the block (``pending``, root last, then the drafted nodes; ``base``: the target's
        cache length before the step): its logits [N, V'] and rows [N, V] over the tree's N nodes.
        """
        if isinstance(outcome, DeferredTree):  # read later: its device tensors alone
            n = outcome.num_nodes
            ids, pos = device_block(pending, outcome.tokens, outcome.depths, base)
        else:
            n = outcome.tree.num_nodes
            ids, pos = block_inputs(pending, outcome.tree, base, self.device)
        mask = block_ancestors(len(run.state.context) - base, outcome.ancestors)  # [block, block]
        logits = run.state.target.block_forward(ids, pos, mask, logits_to_keep=n)
        return logits, run.target_probs_fn(logits)

    def _verify(
        self,
        run: Run,
        plan: Plan,
        verifier: str,
        outcome: DraftOutcome,
        logits: torch.Tensor,
        target_probs: torch.Tensor,
    ) -> VerifyResult:
        """Verify the drafted tree; the target's rows (and the draft's, when not checked yet) must be finite.

        The finite flag rides the verifier's own host read when it has one (``REGISTRY[name].rides``: greedy,
        block, NSS, SpecInfer, RRSw, traversal), else it is read before the verifier runs on the host. Sampled
        rows are softmaxes, NaN wherever the logits were not finite; one-hot (T = 0) rows are not, so their
        logits are checked. A lone root (nothing drafted) is a draw from the target's row, as every verifier's is
        there (the argmax at T = 0), read with the flag.
        """
        tree, generator = outcome.tree, run.state.generator
        greedy = run.request.greedy
        target_ok = finite_flag(logits, target_probs) if greedy else rows_ok(target_probs)
        ok = (target_ok if outcome.ok is None else target_ok & outcome.ok)[None]  # bool: host_read reads it as int
        if tree.num_nodes == 1:  # nothing drafted (a budget's last token): every verifier emits a draw from p_0
            drawn = target_probs[0].argmax()[None] if greedy else sample_categorical(target_probs[:1], generator)
            token, flag = host_read(tree, torch.cat([drawn, ok.long()]))[0]  # the step's one read
            _check_finite(flag, outcome.ok, target_ok)
            return result_for(tree, 0, token, True, on_device=drawn)
        kw = {"allow_lossy": plan.allow_lossy, "check_inputs": False}
        if REGISTRY[verifier].rides:
            result = verify(verifier, tree, target_probs, generator, ride=ok, **kw)
            _check_finite(result.ride[0], outcome.ok, target_ok)
            return result
        _check_finite(host_read(tree, ok)[0][0], outcome.ok, target_ok)
        return verify(verifier, tree, target_probs, generator, **kw)

    def _draft(
        self, run: Run, plan: Plan, pending: DraftRoot | torch.Tensor | None, features: Mapping[str, float] | None
    ) -> DraftOutcome | DeferredTree:
        """Draft the step's tree by the plan's source: lookup in the context, a drafting policy, or a static shape.

        ``pending``: the step's first draft forward, if already run; else the draft's pending tokens (root last),
        or None without a draft model. An EAGLE-style tree grown in one replay comes back before its read
        (:class:`~adaptive_spec.engine.drafting.DeferredTree`), read once the target's pass over it is queued.
        """
        state, sampling, draft = run.state, run.request.sampling, run.state.draft
        if plan.source == "lookup":  # found in the context: one-hot rows, no draft forward
            root = pending if isinstance(pending, DraftRoot) else None
            corpus = None
            if plan.corpus_paths:  # the engine has one (checked with the plan: check_plan)
                corpus = (self.datastore, plan.corpus_paths)
            if plan.model_depth:  # and the draft's greedy chain, merged into the trie
                law = (run.draft_probs_fn, state.generator)
                args = (draft, pending, state.ngrams, plan.shape, plan.model_depth, *law, corpus, plan.model_width)
                return draft_lookup_model(*args)
            return lookup_outcome(state.ngrams, plan.shape, self.vocab_size, self.device, root, corpus)
        law = (run.draft_probs_fn, state.generator, sampling.greedy)
        if plan.source == "hybrid":  # looked up, then extended by the model
            b = plan.shape.depth - plan.lookup_depth
            keep = state.root is not None  # the draft's rows over the looked-up nodes, for the next root's features
            return draft_hybrid(draft, pending, state.ngrams, plan.lookup_depth, b, *law, keep_rows=keep)
        if plan.policy is not None and plan.shape.depth > 0:
            kw = {"temperature": sampling.temperature, "features": features, "deferred": True}
            return draft_policy_tree(draft, pending, plan.policy, *law, **kw)
        return draft_tree(draft, pending, plan.shape if plan.policy is None else TreeShape.chain(0), *law)

    def _commit(
        self, state: EngineState, outcome: DraftOutcome, accepted: list[int], base: int, nodes: list[int] | torch.Tensor
    ) -> None:
        """Keep the accepted nodes' KV rows in both caches (and the target's features for an EAGLE head).

        ``base``: the target's cache length before the step; the block's first ``p`` rows are the
        pending tokens (root last), then one row per drafted node. ``nodes``: :func:`_path_nodes`.
        """
        n_ctx, p, device = len(state.context), len(state.context) - base, self.device
        offset = n_ctx - 1
        rows = [offset + a for a in nodes] if isinstance(nodes, list) else nodes + offset  # the block rows
        state.target.commit(n_ctx, rows)
        if isinstance(state.draft, EagleRunner):  # the target's features of the newly committed positions
            keep = [*range(p - 1), *(p - 1 + a for a in [0, *accepted])]
            feats = state.target.features
            if keep == list(range(len(keep))):  # a chain's rows are a prefix: every row copied, the first kept
                state.draft.set_target_features(base, feats, known=len(keep))
            elif isinstance(rows, torch.Tensor):  # the path's nodes on the device (rows: offset + node)
                state.draft.set_target_features(
                    base, feats[torch.cat([torch.arange(p, device=device), rows - (n_ctx - 1) + (p - 1)])]
                )
            else:
                state.draft.set_target_features(base, feats[torch.tensor(keep, device=device)])
        if outcome.pending_fed:
            fed = [r for r in map(outcome.draft_row, accepted) if r is not None]  # a prefix of the path
            if outcome.cache_rows is None:  # fed nodes sit at their own rows: the path's first rows
                state.draft.commit(n_ctx, rows[: len(fed)])
            elif outcome.cache_rows_tensor is not None and isinstance(rows, torch.Tensor):  # gathered on the device
                state.draft.commit(n_ctx, outcome.cache_rows_tensor[rows[: len(fed)] - (n_ctx - 1)] + (n_ctx - 1))
            elif outcome.cache_rows_tensor is not None and fed != list(range(1, len(fed) + 1)):  # nodes 1 .. k: a slice
                state.draft.commit(n_ctx, outcome.cache_rows_tensor[1 : len(fed) + 1] + (n_ctx - 1))
            else:
                state.draft.commit(n_ctx, [n_ctx - 1 + r for r in fed])

    def _record(
        self, run: Run, outcome: DraftOutcome, result: Any, logits: torch.Tensor, target_probs: torch.Tensor
    ) -> None:
        """A speculative step's statistics, the next root's previous rows, and the node log."""
        state, stats, tree = run.state, run.state.stats, outcome.tree
        stats.policy_levels += outcome.policy_levels
        stats.policy_decision_s += outcome.policy_decision_s
        stats.accept_lengths.append(result.num_accepted)
        stats.tree_sizes.append(tree.num_nodes)
        if state.root is not None:  # the rows over the next root token: at the last accepted node
            node = result.node
            # At T=0 the target's rows are one-hot; features use its plain softmax.
            target_row = run.soft_probs_fn(logits[node : node + 1])[0] if run.request.greedy else target_probs[node]
            # The draft model's own row there (not a lookup's one-hot row); None: the model gave none
            draft_row = outcome.model_row(node)
            hidden = state.target.hidden[node] if state.target.keep_hidden else None
            state.root.set_previous(target_row, draft_row, hidden)
            state.root.after_step(result.num_accepted)
        if self.node_log is not None:
            fed = [outcome.draft_row(i) is not None for i in range(tree.num_nodes)]
            drawn = outcome.drawn_from_model()  # looked-up nodes are not the draft's: not logged
            self.node_log(tree, fed, target_probs, run.request.sampling.temperature, drawn=drawn)

    @torch.inference_mode()
    def _root_features(self, run: Run) -> tuple[DraftRoot, RootFeatures]:
        """Run the step's first draft forward (pending tokens, root last) and compute the root features."""
        state = run.state
        assert state.draft is not None and state.root is not None
        with run.timer.phase("draft"):
            pending = state.pending(state.draft.cached, self.device)
            keep = 2 if state.root.needs_draft_row() else 1  # row -2: the draft's row over the root token
            root = draft_root(state.draft, pending, run.draft_probs_fn, keep)
        features = state.root.features(root.probs, root.hidden, root.ok, len(state.context), run.log is not None)
        return root, features


def _path_nodes(outcome: DraftOutcome, accepted: list[int]) -> list[int] | torch.Tensor:
    """The accepted nodes (root excluded): a chain's prefix ``1 .. k`` as the list (its rows are in place and move
    nothing); any other path as a LongTensor on the device, read off the ancestor matrix's row of the last accepted
    node (parents precede children, so a stable sort puts the path first, in order): no copy.

    A slot tree's matrix is its slots' (:mod:`adaptive_spec.trees.slots`): the path may run through a duplicate
    slot of an accepted node, whose rows hold the same prefix.
    """
    k = len(accepted)
    if k == 0 or accepted == list(range(1, k + 1)):
        return accepted
    on_path = outcome.ancestors[accepted[-1]]  # BoolTensor[N]: the root, the path, the node itself
    return torch.argsort((~on_path).to(torch.uint8), stable=True)[1 : k + 1]


def _check_finite(ok: int, draft_ok: torch.Tensor | None, target_ok: torch.Tensor) -> None:
    """Raise if the step's finite flag read back (the target's and, if not checked yet, the draft's) is 0; only
    then are the two read again, to say which model it was.
    """
    if not ok:
        if draft_ok is not None:
            check_finite(draft_ok, "draft")
        check_finite(target_ok, "target")


def _emitted_tail(
    tree: DraftTree, result: VerifyResult, n_ctx: int, nodes: list[int] | torch.Tensor
) -> DeviceTail | None:
    """The step's emitted tokens that are on the device already, for the next step's pending tokens.

    The next token when the verifier drew it there, after the accepted tokens when the tree's tokens are on the
    device (``nodes``: :func:`_path_nodes`; a chain's prefix is a view, any other path one gather).
    """
    nxt = result.next_on_device
    if nxt is None:
        return None
    k = result.num_accepted
    tokens = tree.tokens_tensor(nxt.device) if tree.has_tensors(nxt.device, "tokens") else None
    if tokens is None or k == 0:
        return DeviceTail(n_ctx + k, [result.tokens[-1]], nxt)
    path = tokens[1 : k + 1] if isinstance(nodes, list) else tokens.index_select(0, nodes)
    return DeviceTail(n_ctx, list(result.tokens), torch.cat([path, nxt]))
