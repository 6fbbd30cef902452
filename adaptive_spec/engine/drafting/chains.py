"""Policy chains decided on the device (``conf-chain``, ``cum-chain``, ``learned-chain``): the stop rule's
arithmetic runs on the device, node after node, and the host reads the chain once, at a *look* level chosen from the
request's past stops (:func:`look_level`, shared with the i.i.d. EAGLE-style trees), or the whole chain in one
captured replay (:func:`captured_policy_chain`).
"""

from __future__ import annotations

import collections
from dataclasses import dataclass

import torch

from adaptive_spec.engine.drafting.base import DraftOutcome, DraftRoot
from adaptive_spec.engine.drafting.static import captured_chain, chain_outcome
from adaptive_spec.engine.logits import ProbsFn
from adaptive_spec.engine.runner import ModelRunner
from adaptive_spec.formats.nodes import PROB_FLOOR
from adaptive_spec.trees.draw import draw_tokens
from adaptive_spec.trees.policy import (
    ChainRule,
    ConfidenceChain,
    CumulativeChain,
    DraftPolicy,
    LearnedChain,
)


def chain_on_device(policy: DraftPolicy) -> bool:
    """Whether ``policy`` is a chain whose stop rule the device decides (:func:`draft_chain_on_device`): ``conf-chain``,
    ``cum-chain``, and ``learned-chain`` with an acceptance model that gives its layers (the installed one does).
    """
    if isinstance(policy, LearnedChain):
        return hasattr(policy.predictor, "device_layers")
    return type(policy) in (ConfidenceChain, CumulativeChain)


FIRST_LOOK, LOOK_HISTORY = 2, 8


def draft_chain_on_device(
    runner: ModelRunner,
    root: DraftRoot,
    policy: ChainRule,
    probs_fn: ProbsFn,
    generator: torch.Generator,
    deterministic: bool,
    temperature: float = 1.0,
) -> DraftOutcome:
    """A policy chain (``conf-chain``, ``cum-chain``, ``learned-chain``) with its stop rule decided on the device: one
    host read at most.

    Each level draws the next token from the last row (the host path's lone candidate: the same draw from the same
    generator state) and decides on the device whether the policy feeds it, with the host path's arithmetic on the
    same values (:class:`_ChainRuleOnDevice`: the top-1 of the row it was drawn from against ``threshold``, its
    path's draft probability against ``min_path_prob``, or the acceptance model's network and rule). It is fed
    whatever the decision, so no level waits for the host. The host reads once, after node ``l``, the *look*:

    * a chain that stopped by then is cut at its stop: the host path's tree, node for node (the nodes fed after the
      stop cost forwards, not law);
    * a chain that has not is drafted to the policy's depth, without another read: every node of it was drawn from
      the draft's rows, so it is verified whole.

    That is the tree the host path grows with the policy :class:`~adaptive_spec.trees.policy.LookedChain` ``(policy,
    l)``, whose law the exact tests check for every verifier of policy chains. The look comes from the past steps of
    the same policy in the request (``runner.chain_look``; a request's runner starts without, so a seed gives the
    same tokens): the deepest of the last :data:`LOOK_HISTORY` stops, a chain that went past its look counting as
    a stop one deeper (a look past the stop costs the forwards in between; a look before it, the forwards to the
    depth, whose nodes may be accepted).
    """
    G, p, base, device = policy.depth, root.pending, root.base, runner.device
    stops, look = look_level(runner, policy, G - 1)
    positions = torch.arange(base + p - 1, base + p + G - 1, device=device)  # node d's position, d = 1 .. G
    rows, drawn, fed = [root.probs[-1:]], [], []  # fed[d]: BoolTensor[1], whether the policy feeds node d + 1
    marks = []  # the draft cache before each level's forward
    rule = _ChainRuleOnDevice(policy, device, temperature)
    for d in range(G):
        drawn2d = draw_tokens(rows[-1], 1, generator, greedy=deterministic)  # [1, 1]
        token = drawn2d[:, 0]  # [1]
        drawn.append(token)
        if d + 1 == G:  # node G is a leaf whatever the rule
            break
        if d < look:  # nodes 1 .. look: the policy's decisions (past the look every node is fed)
            feeds = rule(d + 1, rows[-1], drawn2d)
            fed.append(feeds if d == 0 else fed[-1] & feeds)  # fed once every node before it was
        if d + 1 == look:  # the one read: how many of nodes 1 .. look the policy fed (a stop: fewer than all)
            n_fed = int(torch.cat(fed).sum().item())  # item: one op where tolist dispatches two
            if n_fed < look:  # stopped at node n_fed + 1: the host path's chain
                s = n_fed + 1
                stops.append(s)
                if s - 1 < len(marks):  # nodes fed from the stop on: their rows go
                    runner.undo_block(marks[s - 1])
                return chain_outcome(root, policy.shape, rows[:s], drawn[:s], device, s, depth=s)
        if d < look:  # past the look nothing is undone
            marks.append(runner.block_mark())
        logits = runner.block_forward(token, positions[d + 1 : d + 2], None, logits_to_keep=1)
        rows.append(probs_fn(logits))
    if G > 1:
        stops.append(look + 1)  # the stop is deeper than the look (unknown: not read)
    return chain_outcome(root, policy.shape, rows, drawn, device, G, depth=G)


def captured_policy_chain(
    runner: ModelRunner,
    pending: torch.Tensor,
    policy: ChainRule,
    probs_fn: ProbsFn,
    generator: torch.Generator,
    greedy: bool,
    temperature: float = 1.0,
) -> DraftOutcome | None:
    """A policy chain (``conf-chain``, ``cum-chain``, ``learned-chain``) drafted to its depth in one replay of the
    chain's graph (:func:`~.static.captured_chain`), then cut at the policy's own stop: one host read. None: drafted
    level by level (no graph for it).

    Every node's decision is made after the replay, on the device, from the rows and tokens it returns, by the
    arithmetic of the level-by-level drafter (:class:`_ChainRuleOnDevice`, over the whole chain at once); the one
    read is how many leading nodes the policy feeds, and the rows the replay fed past the stop are dropped from the
    draft cache. The look is the deepest (``depth - 1``): this is the host path's chain of the policy itself,
    node for node (``LookedChain(policy, depth - 1)`` is the policy), whose law the exact tests check. Its cost is the
    chain's forwards to the depth, a replay's worth; the generator gives the chain's ``depth`` uniforms each step, where
    it stops or not.
    """
    G, base = policy.depth, runner.cached
    captured = captured_chain(runner, pending, G, probs_fn, generator, greedy)
    if captured is None:
        return None
    tokens, rows, ok = captured
    root = DraftRoot(int(pending.numel()), base, rows[:1], ok)
    s = G  # the chain's depth: nodes 1 .. s - 1 fed, node s a leaf
    if G > 1:
        feeds = _ChainRuleOnDevice(policy, runner.device, temperature)(1, rows[: G - 1], tokens[: G - 1, None])
        s = int(feeds.cumprod(0).sum().item()) + 1  # the one read: a stop at the first node the policy does not feed
        stops, _ = look_level(runner, policy, G - 1)
        stops.append(s)  # the stop itself, known (a level-by-level chain after this one looks that deep)
        if s < G:
            runner.cut_block(root.pending + s - 1)
    return chain_outcome(root, policy.shape, [rows[:s]], [tokens[:s]], runner.device, s, depth=s)


def look_level(
    runner: ModelRunner, policy: DraftPolicy, deepest: int, least: int = 1, first: int = FIRST_LOOK
) -> tuple[collections.deque, int]:
    """The policy's last stops in this request (``runner.chain_look``, appended to by the caller) and the look they
    choose: the deepest of them, ``first`` before any, within ``least .. deepest`` (at least ``least``).
    """
    stops = runner.chain_look.setdefault(str(policy), collections.deque(maxlen=LOOK_HISTORY))
    return stops, max(least, min(max(stops, default=first), deepest))


class _ChainRuleOnDevice:
    """A policy chain's feed rule on the device, node after node: the host path's arithmetic on the same values
    (float64 from the rows' float32, as its read brings them; :class:`~adaptive_spec.trees.policy.NodeView`).
    """

    def __init__(self, policy: DraftPolicy, device: torch.device, temperature: float) -> None:
        self.policy, self.temperature = policy, float(temperature)
        self.path = None  # the path's draft probability (float64 [1])
        if isinstance(policy, LearnedChain):
            self.net = _learned_net(policy.predictor.device_layers(device), policy.depth, self.temperature)
            self.accept, self.expected = None, None  # the path's predicted acceptance, the expected tokens so far

    def __call__(self, depth: int, row: torch.Tensor, token: torch.Tensor) -> torch.Tensor:
        """BoolTensor[k]: whether the policy feeds the ``k`` nodes at depths ``depth .. depth + k - 1`` of one chain
        (their tokens ``token`` [k, 1] drawn from the rows ``row`` [k, V]), each as if fed node by node after the ones
        before it: a level's one node (the level-by-level drafter's calls) or a whole captured chain's
        (:func:`captured_policy_chain`).
        """
        policy = self.policy
        if isinstance(policy, ConfidenceChain):
            return row.amax(-1).double() >= policy.threshold
        if isinstance(policy, CumulativeChain):
            self.path = _running(self.path, row.gather(-1, token)[:, 0].double(), product=True)
            return self.path >= policy.min_path_prob
        return self._learned(depth, row, token)

    def _learned(self, depth: int, row: torch.Tensor, token: torch.Tensor) -> torch.Tensor:
        """``learned-chain``: acceptance_row's features, the acceptance model's network, LearnedChain.feed's rule.

        The features' constant columns (the depth, the temperature) are folded into the first layer's bias, one
        row per depth (:func:`_learned_net`); the others go in as ``[q, top-1, entropy, path]`` with the logs taken
        where the features are logs.
        """
        net, k = self.net, row.shape[0]
        ent = torch.special.entr(row).sum(-1, keepdim=True)
        x = torch.cat([row.gather(-1, token), row.amax(-1, keepdim=True), ent], dim=1).double()  # q, top-1
        self.path = _running(self.path, x[:, :1], product=True)  # [k, 1]
        x = torch.cat([x, self.path], dim=1)
        h = torch.where(net.logs, x.clamp_min(PROB_FLOOR).log(), x)  # [k, 4]: log q, top-1, entropy, log path
        first = net.first[depth] if k == 1 else torch.cat(net.first[depth : depth + k])
        h = torch.addmm(first, h, net.weights[0])
        for W, b in zip(net.weights[1:], net.biases, strict=True):
            h = torch.addmm(b, h.clamp_min_(0.0), W)
        a, b = torch.sigmoid(h).unbind(1)  # [k] each
        self.accept = _running(self.accept, a, product=True)
        self.expected = _running(1.0 if self.expected is None else self.expected, self.accept, product=False)
        rho = float(self.policy.cost_ratio)  # feed: accept · b · (1 + ρ · depth) > expected · ρ, i.e.
        if k == 1:  # E − a·b·k/ρ < 0
            return torch.addcmul(self.expected, self.accept, b, value=-(1.0 + rho * depth) / rho) < 0.0
        scale = torch.arange(depth, depth + k, dtype=a.dtype, device=a.device).mul_(rho).add_(1.0).div_(-rho)
        return torch.addcmul(self.expected, self.accept * scale, b) < 0.0


def _running(before: torch.Tensor | float | None, x: torch.Tensor, product: bool) -> torch.Tensor:
    """The running product (else sum) of ``x`` [k, ...] along its first dim, continuing from ``before`` (a tensor
    whose last entry it continues, a number, or None: from ``x``'s first), each entry after the one before it, as a
    node-by-node loop takes them.
    """
    if x.shape[0] == 1:  # one node: the level-by-level drafter's call
        if before is None:
            return x
        last = before[-1:] if isinstance(before, torch.Tensor) and before.shape[0] > 1 else before
        return last * x if product else last + x
    if before is not None:
        first = before[-1:] if isinstance(before, torch.Tensor) else torch.full_like(x[:1], before)
        return _running(None, torch.cat([first, x]), product)[1:]
    return x.cumprod(0) if product else x.cumsum(0)


@dataclass(frozen=True)
class _LearnedNet:
    """An acceptance model's layers for :meth:`_ChainRuleOnDevice._learned` (float64, on the device)."""

    first: list[torch.Tensor]  # per depth 0 .. D: the first layer's bias with the depth and temperature columns in
    weights: list[torch.Tensor]  # per layer, W transposed ([in, out]); the first's rows for the 4 other features
    biases: list[torch.Tensor]  # the other layers' biases
    logs: torch.Tensor  # bool [1, 4]: which of q, top-1, entropy, path go in as logs
    layers: list  # the model's device layers, kept alive with their id as the cache's key


_LEARNED_NETS: dict[tuple[int, float], _LearnedNet] = {}


def _learned_net(layers: list[tuple[torch.Tensor, torch.Tensor]], depth: int, temperature: float) -> _LearnedNet:
    """The acceptance model's ``layers`` (:meth:`AcceptanceModel.device_layers`) arranged for chains of ``depth`` or
    less at ``temperature``, made once (a deeper chain makes them again): the columns of the features ``depth`` and
    ``temperature`` (ACCEPTANCE_FEATURES' first and last) times their values, added to the first layer's bias.
    """
    key = id(layers), temperature
    if key not in _LEARNED_NETS or len(_LEARNED_NETS[key].first) <= depth:
        if len(_LEARNED_NETS) > 64:
            _LEARNED_NETS.clear()
        (W0, b0), rest = layers[0], layers[1:]
        depths = torch.arange(depth + 1, dtype=W0.dtype, device=W0.device)
        first = (b0 + temperature * W0[:, -1]) + depths[:, None] * W0[:, 0]  # [D + 1, H]
        logs = (torch.arange(4, device=W0.device) % 3 == 0)[None]  # [[True, False, False, True]], no copy
        _LEARNED_NETS[key] = _LearnedNet(
            list(first[:, None].unbind()),
            [W0[:, 1:-1].t().contiguous(), *(W.t().contiguous() for W, _ in rest)],
            [b for _, b in rest],
            logs,
            layers,
        )
    return _LEARNED_NETS[key]
