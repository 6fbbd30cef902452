"""The node log: per drafted node, the in-draft features, the decision, and soft acceptance labels.

Set ``engine.node_log = NodeLogger(directory)``: after each speculative step's target pass the
engine hands it the tree, which nodes were fed to the draft (the in-draft decisions) and the
target's rows. Every node drawn from the draft model becomes one row (the root and looked-up
nodes, whose tree rows are a lookup's, not the draft's, get none):

* the acceptance model's features, :data:`ACCEPTANCE_FEATURES`,
  computed from the tree's draft rows exactly as the drafting policy saw them;
* ``fed``: whether the node was run through the draft (the policy's feed decision);
* ``label_accept``: the probability that token-level verification accepts the node given its
  parent was accepted, ``min(1, p(x) / q(x))`` over the parent's rows (at T=0 the target's row is
  one-hot, so it is 1 exactly when the token is the target's argmax);
* ``label_next`` (fed nodes only, else NaN): the probability that a child drawn from the node's
  row is accepted, ``Σ min(p, q)`` over the node's rows, or at T=0 ``p(argmax q)``.

Rows are written as Parquet shards (``nodes-00000.parquet``, ...) through a temporary file and
an atomic rename, so an interrupted run leaves whole shards only. The labels need no replay:
the target scored every drafted node in the step's one pass, so they come from online data and
a model can be retrained from any engine run.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import torch

__all__ = ["ACCEPTANCE_FEATURES", "NODE_COLUMNS", "NodeLogger", "acceptance_row", "node_rows", "read_node_log"]

#: Inputs of the acceptance model, per drafted node, as seen when deciding whether to feed it
#: (draft-side only): its depth, log q(token | parent), the top-1 and entropy of the parent's
#: draft row, the log of the path's cumulative draft probability, and the temperature.
ACCEPTANCE_FEATURES = ("depth", "log_token_prob", "parent_top1", "parent_entropy", "log_path_prob", "temperature")
NODE_COLUMNS = ("generation", "step", "node", *ACCEPTANCE_FEATURES, "fed", "label_accept", "label_next")
#: Probabilities below it are logged as it (no -inf) in the acceptance features.
PROB_FLOOR = 1e-12


def acceptance_row(
    depth: int, token_prob: float, parent_top1: float, parent_entropy: float, path_prob: float, temperature: float
) -> tuple[float, ...]:
    """One node's acceptance-model inputs, in :data:`ACCEPTANCE_FEATURES` order: the one place they are computed.

    The drafting policies (:func:`adaptive_spec.trees.policy.acceptance_rows`, at run time) and the
    node log (:func:`node_rows`, for training) both call it, so the model sees at run time what it
    was trained on.
    """
    return (
        float(depth),
        math.log(max(token_prob, PROB_FLOOR)),
        float(parent_top1),
        float(parent_entropy),
        math.log(max(path_prob, PROB_FLOOR)),
        float(temperature),
    )


def node_rows(
    tree: Any, fed: list[bool], target_probs: torch.Tensor, temperature: float, drawn: list[bool] | None = None
) -> dict[str, list]:
    """Features and labels of every drafted node of ``tree`` (columns of :data:`NODE_COLUMNS` but the first two).

    ``tree`` is a :class:`~adaptive_spec.trees.DraftTree` (its tokens, parents, depths and draft rows).
    ``drawn[i]``: whether node ``i``'s token was drawn from the draft model's row at its parent;
    nodes that were not (looked up in the context: their parent's row is the lookup's one-hot
    row, q = 1, not the draft's) get no row. None: every node was drawn.
    """
    n = tree.num_nodes
    if n < 2:
        return {c: [] for c in NODE_COLUMNS[2:]}
    q = tree.draft_probs.double()  # [N, V]
    p = target_probs.double()
    nodes = torch.arange(1, n)
    par = torch.tensor(tree.parents[1:])
    tok = torch.tensor(tree.tokens[1:])
    q_par, p_par = q[par], p[par]  # [N-1, V]
    q_tok = q_par.gather(1, tok[:, None])[:, 0]
    p_tok = p_par.gather(1, tok[:, None])[:, 0]
    ent = -torch.where(q_par > 0, q_par * q_par.clamp_min(1e-300).log(), torch.zeros_like(q_par)).sum(1)
    accept = torch.minimum(torch.ones_like(q_tok), p_tok / q_tok.clamp_min(1e-300))
    if temperature > 0:
        nxt = torch.minimum(p[nodes], q[nodes]).sum(1)
    else:
        nxt = p[nodes].gather(1, q[nodes].argmax(1, keepdim=True))[:, 0]
    q_list, top1, ent_l = q_tok.tolist(), q_par.max(1).values.tolist(), ent.tolist()
    acc_l, nxt_l = accept.tolist(), nxt.tolist()
    path = [1.0] * n
    out: dict[str, list] = {c: [] for c in NODE_COLUMNS[2:]}
    for i in range(1, n):
        path[i] = path[tree.parents[i]] * q_list[i - 1]
        if drawn is not None and not drawn[i]:
            continue
        row = acceptance_row(tree.depths[i], q_list[i - 1], top1[i - 1], ent_l[i - 1], path[i], temperature)
        out["node"].append(i)
        for name, value in zip(ACCEPTANCE_FEATURES, row, strict=True):
            out[name].append(value)
        out["fed"].append(bool(fed[i]))
        out["label_accept"].append(acc_l[i - 1])
        out["label_next"].append(nxt_l[i - 1] if fed[i] else math.nan)
    return out


class NodeLogger:
    """Appends node rows (see the module docstring) to Parquet shards in ``directory``.

    Args:
        directory: the log folder (created; existing shards are kept, and shard and generation
            numbering continue after them).
        shard_rows: rows per shard.

    Use as ``engine.node_log``; call :meth:`end_generation` between prompts and :meth:`close`
    (or use it as a context manager) at the end.
    """

    def __init__(self, directory: str | os.PathLike, shard_rows: int = 50_000) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.shard_rows = shard_rows
        self.generation = 0
        self.step = 0
        self.rows = 0
        self._buf: dict[str, list] = {c: [] for c in NODE_COLUMNS}
        shards = sorted(self.directory.glob("nodes-*.parquet"))
        self._seq = len(shards)
        if shards:  # appending to a log: generation ids continue after the last one
            import pyarrow.parquet as pq

            self.generation = 1 + max(
                max(pq.read_table(s, columns=["generation"]).column(0).to_pylist(), default=-1) for s in shards
            )

    def __call__(
        self,
        tree: Any,
        fed: list[bool],
        target_probs: torch.Tensor,
        temperature: float,
        drawn: list[bool] | None = None,
    ) -> None:
        """Buffer the rows of one step's tree (:func:`node_rows`), and write a shard when enough are buffered."""
        rows = node_rows(tree, fed, target_probs, temperature, drawn)
        k = len(rows["node"])
        self._buf["generation"].extend([self.generation] * k)
        self._buf["step"].extend([self.step] * k)
        for c, values in rows.items():
            self._buf[c].extend(values)
        self.step += 1
        self.rows += k
        if len(self._buf["node"]) >= self.shard_rows:
            self.flush()

    def end_generation(self) -> None:
        """Mark the end of one generation (rows are grouped by generation for validation splits)."""
        self.generation += 1
        self.step = 0

    def flush(self) -> Path | None:
        """Write the buffered rows as one shard; returns its path (None when nothing was buffered)."""
        if not self._buf["node"]:
            return None
        import pyarrow as pa
        import pyarrow.parquet as pq

        table = pa.table(self._buf)
        path = self.directory / f"nodes-{self._seq:05d}.parquet"
        tmp = path.with_suffix(".parquet.tmp")
        pq.write_table(table, tmp)
        os.replace(tmp, path)
        self._seq += 1
        self._buf = {c: [] for c in NODE_COLUMNS}
        return path

    def close(self) -> None:
        self.flush()

    def __enter__(self) -> NodeLogger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_node_log(directory: str | os.PathLike) -> Any:
    """All shards of a node log as one ``pyarrow.Table`` (a run appending to a log continues its generation ids).

    Raises:
        FileNotFoundError: the folder holds no ``nodes-*.parquet`` shard.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    shards = sorted(Path(directory).glob("nodes-*.parquet"))
    if not shards:
        raise FileNotFoundError(f"no node log shards (nodes-*.parquet) in {directory}; collect with --collect")
    tables = [pq.read_table(s) for s in shards]
    for t in tables:
        missing = set(NODE_COLUMNS) - set(t.column_names)
        if missing:
            raise ValueError(f"{directory}: a shard lacks columns {sorted(missing)}; collect the log again")
    return pa.concat_tables([t.select(list(NODE_COLUMNS)) for t in tables])
