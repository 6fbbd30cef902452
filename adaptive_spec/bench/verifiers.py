"""``adaptive-spec bench verifiers``: exact block efficiency against the LP limit, and speed.

Quality mode (default): for a fixed, seeded set of instance families (the toy; random
Dirichlet instances at low, medium and high draft/target divergence with V in {2, 3}) and
shapes (chains of length 2 and 3, i.i.d. trees with K in {2, 3}, delayed trees), every
verifier's exact expected block efficiency (tokens per target call, by enumeration), the
LP limit (docs/algorithms.md §10) and their ratio.

Speed mode (``--speed``): microseconds per verification at V = 32,000 and 128,000 for trees
of 8, 32 and 64 nodes, per verifier, on the chosen device.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import torch
from tqdm.auto import tqdm

from adaptive_spec.analysis.exact import block_efficiency, completed_tv, output_law
from adaptive_spec.analysis.instances import Instance, divergence_instance, toy_instance
from adaptive_spec.analysis.lp import lp_limit
from adaptive_spec.trees import DraftLaw, TreeShape, sample_tree
from adaptive_spec.verifiers import REGISTRY, verify

DIVERGENCE = {"low": 0.2, "medium": 0.5, "high": 0.9}  # draft = (1 - mix) target + mix noise
SEEDS = (0, 1)
QUALITY_SHAPES = [
    TreeShape.chain(2),
    TreeShape.chain(3),
    TreeShape.iid(2, 2),
    TreeShape.iid(3, 2),
    TreeShape.delayed(1, 2, 1),
    TreeShape.delayed(1, 2, 2),
]
# Shapes with 8, 32 and 64 nodes (when no two draws coincide, as at V >= 32k).
SPEED_SHAPES = {
    "chain": {8: TreeShape.chain(7), 32: TreeShape.chain(31), 64: TreeShape.chain(63)},
    "tree": {8: TreeShape.delayed(1, 2, 3), 32: TreeShape.delayed(1, 3, 10), 64: TreeShape.delayed(3, 4, 15)},
}


@dataclass(frozen=True)
class Family:
    name: str
    instances: tuple[Instance, ...]


def families() -> list[Family]:
    """The fixed, seeded instance families of the quality benchmark."""
    out = [Family("toy", (toy_instance(),))]
    for level, mix in DIVERGENCE.items():
        for vocab in (2, 3):
            insts = tuple(divergence_instance(100 * vocab + s, vocab, mix) for s in SEEDS)
            out.append(Family(f"dirichlet-{level}-V{vocab}", insts))
    return out


def quality_rows(
    progress: bool = True, family_names: list[str] | None = None, shapes: list[TreeShape] | None = None
) -> list[dict]:
    """One row per (family, shape, verifier): exact BE, LP limit and ratio (means over seeds)."""
    fams = families()
    if family_names:
        unknown = set(family_names) - {f.name for f in fams}
        if unknown:
            raise ValueError(f"unknown families {sorted(unknown)}; known: {[f.name for f in fams]}")
        fams = [f for f in fams if f.name in family_names]
    jobs = [(fam, shape) for fam in fams for shape in (shapes or QUALITY_SHAPES)]
    rows = []
    for fam, shape in tqdm(jobs, desc="bench verifiers", disable=not progress):
        limits = [lp_limit(shape, i.draft_fn, i.target_fn, i.vocab) for i in fam.instances]
        for name, spec in REGISTRY.items():
            if spec.greedy_only or shape.law not in spec.laws:
                continue
            bes, tvs = [], []
            for inst in fam.instances:
                law = output_law(spec.fn, shape, inst.draft_fn, inst.target_fn)
                bes.append(block_efficiency(law))
                tvs.append(completed_tv(law, inst.target_fn, inst.vocab, shape.depth + 1)[0])
            row = {
                "family": fam.name,
                "shape": str(shape),
                "verifier": name,
                "block_efficiency": statistics.fmean(bes),
                "lp_limit": statistics.fmean(limits),
                "ratio": statistics.fmean(b / lim for b, lim in zip(bes, limits, strict=True)),
                "lossless": spec.lossless,
                "max_completed_tv": max(tvs),
            }
            rows.append(row)
    return rows


def _speed_instance(vocab: int, device: torch.device, seed: int = 0):
    """Realistic rows: target logits ~ N(0, 3²), draft logits = target + N(0, 1)."""
    gen = torch.Generator().manual_seed(seed)
    cache: dict[tuple[int, ...], tuple[torch.Tensor, torch.Tensor]] = {}

    def rows(prefix: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
        if prefix not in cache:
            t = torch.randn(vocab, generator=gen) * 3
            d = t + torch.randn(vocab, generator=gen)
            cache[prefix] = (torch.softmax(t, 0).to(device), torch.softmax(d, 0).to(device))
        return cache[prefix]

    return (lambda c: rows(c)[0]), (lambda c: rows(c)[1])


def speed_rows(
    device: torch.device, vocabs=(32_000, 128_000), nodes=(8, 32, 64), repeats: int = 30, progress: bool = True
) -> list[dict]:
    """Median microseconds per ``verify`` call (inputs unchecked, as the engine calls it)."""
    out = []
    jobs = [(v, n) for v in vocabs for n in nodes]
    for vocab, n_nodes in tqdm(jobs, desc="bench verifiers --speed", disable=not progress):
        target_fn, draft_fn = _speed_instance(vocab, device)
        gen = torch.Generator(device=device).manual_seed(0)
        trees = {}
        for kind, shapes in SPEED_SHAPES.items():
            tree = sample_tree(shapes[n_nodes], draft_fn, torch.Generator(device=device).manual_seed(1))
            trees[kind] = (tree, torch.stack([target_fn(pre) for pre in tree.prefixes]))
        for name, spec in REGISTRY.items():
            kind = "tree" if DraftLaw.DELAYED in spec.laws else "chain"
            tree, rows = trees[kind]
            for _ in range(3):  # warm-up
                verify(name, tree, rows, gen, allow_lossy=True, check_inputs=False)
            times, accepted = [], []
            for _ in range(repeats):
                if device.type == "cuda":
                    torch.cuda.synchronize()
                t0 = time.perf_counter()
                res = verify(name, tree, rows, gen, allow_lossy=True, check_inputs=False)
                if device.type == "cuda":
                    torch.cuda.synchronize()
                times.append(time.perf_counter() - t0)
                accepted.append(res.num_accepted)
            out.append(
                {
                    "verifier": name,
                    "vocab": vocab,
                    "nodes": tree.num_nodes,
                    "shape": str(tree.shape),
                    "device": str(device),
                    "us_per_verify": statistics.median(times) * 1e6,
                    "mean_accepted": statistics.fmean(accepted),
                }
            )
    return out
