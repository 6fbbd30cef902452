"""Sources of randomness for drafting and verification.

Every stochastic function in adaptive-spec draws through a :class:`Sampler`, which has two
methods: a Bernoulli ``flip`` and a ``categorical`` draw. Two implementations exist:

* :class:`TorchSampler` wraps the caller's ``torch.Generator`` (CPU or CUDA). This is what
  the engine and the public ``verify`` use.
* ``adaptive_spec.analysis.exact.Chooser`` enumerates every outcome of both choices with
  its exact probability. Running the *same* verifier code under it gives the exact law of
  the verifier's output (docs/algorithms.md §9, "probabilistic-program enumeration").

So the code that is exact-tested is the code that ships.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Protocol, runtime_checkable

import torch


@runtime_checkable
class Sampler(Protocol):
    """A source of Bernoulli and categorical draws."""

    def flip(self, prob: float) -> bool:
        """Return True with probability ``prob`` (a float in [0, 1])."""
        ...

    def categorical(self, weights: torch.Tensor) -> int:
        """Draw an index with probability proportional to ``weights`` (Tensor[V], >= 0)."""
        ...

    def flip_bounded(self, bound: float, prob: Callable[[], float]) -> bool:
        """Return True with probability ``prob()``, where ``prob() <= bound``.

        Lets an implementation skip computing an expensive probability when its uniform
        already exceeds the bound; the law is that of ``flip(prob())``.
        """
        ...


class TorchSampler:
    """A :class:`Sampler` over a ``torch.Generator``.

    Uniforms are drawn from the generator in blocks of ``block`` (one host sync per block);
    categorical draws use inverse-CDF sampling on the weights' device with the same
    generator, so a CUDA generator keeps the vocabulary-sized work on the GPU.
    """

    def __init__(self, generator: torch.Generator, block: int = 64) -> None:
        if not isinstance(generator, torch.Generator):
            raise TypeError(f"expected a torch.Generator, got {type(generator).__name__}")
        self.generator = generator
        self._block = block
        self._uniforms: list[float] = []

    def uniform(self) -> float:
        """One U(0, 1) draw."""
        if not self._uniforms:
            self.load_block(self._draw_block().tolist())
        return self._uniforms.pop()

    def _draw_block(self) -> torch.Tensor:
        return torch.rand(self._block, generator=self.generator, dtype=torch.float64, device=self.generator.device)

    def next_block(self, device: torch.device) -> torch.Tensor | None:
        """The next block of uniforms drawn on ``device`` (Tensor[block], float64) for a caller to read with its
        own host read and hand back with :meth:`load_block`; None when uniforms are still buffered or the
        generator lives on another device.
        """
        if self._uniforms or torch.device(device).type != self.generator.device.type:
            return None
        return self._draw_block()

    def load_block(self, values: list[float]) -> None:
        """The block of :meth:`next_block`, read by the caller: the next uniforms, in order."""
        self._uniforms = list(values)[::-1]

    def flip(self, prob: float) -> bool:
        return self.uniform() < float(prob)

    def flip_bounded(self, bound: float, prob: Callable[[], float]) -> bool:
        u = self.uniform()
        if u >= bound:
            return False
        return u < float(prob())

    def categorical(self, weights: torch.Tensor) -> int:
        return int(inverse_cdf(weights.to(self.generator.device)[None], 1, self.generator).item())


def inverse_cdf(rows: torch.Tensor, k: int, generator: torch.Generator) -> torch.Tensor:
    """``k`` independent categorical draws from each row of ``rows`` (Tensor[W, V], unnormalised): LongTensor[W, k].

    The row's cumulative sum in float64, ``k`` uniforms scaled by its total, and a binary search for the first
    token whose cumulative mass exceeds the uniform: a zero weight repeats its predecessor's value, so it is
    never drawn. One uniform a draw: on a CPU ~20x faster than ``torch.multinomial`` or an exponential race
    at V = 128k. No host sync.
    """
    u = torch.rand(rows.shape[0], k, dtype=torch.float64, device=rows.device, generator=generator)
    return inverse_cdf_from(rows, u)


def inverse_cdf_from(rows: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """:func:`inverse_cdf`'s draws from given uniforms ``u`` (Tensor[W, k], float64): LongTensor[W, k]. A captured
    chain draft (:func:`~adaptive_spec.engine.drafting.captured_chain`) draws its uniforms before the replay.
    """
    cdf = rows.double().cumsum(-1)  # not cumsum(dtype=float64): on a CPU that is 10x slower for several rows
    return search_cdf(cdf, u)


def search_cdf(cdf: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Per row of ``cdf`` (Tensor[W, V], cumulative weights), the first token whose cumulative weight exceeds
    ``u`` (Tensor[W, k] of uniforms) times the row's total: LongTensor[W, k]. A zero weight repeats its
    predecessor's value, so it is never the answer (but for a row of total 0: the last token).
    """
    return torch.searchsorted(cdf, u * cdf[:, -1:], right=True).clamp_(max=cdf.shape[-1] - 1)


def as_sampler(source: torch.Generator | Sampler | None) -> Sampler:
    """Turn a ``torch.Generator`` (or an existing :class:`Sampler`) into a :class:`Sampler`.

    ``None`` is refused: every random draw in adaptive-spec comes from the caller's generator.
    """
    if isinstance(source, torch.Generator):
        return TorchSampler(source)
    if source is None:
        raise TypeError("a torch.Generator is required (pass torch.Generator().manual_seed(seed))")
    if isinstance(source, Sampler):
        return source
    raise TypeError(f"expected a torch.Generator or Sampler, got {type(source).__name__}")


_ACCELERATOR_ON_CPU = [0]


def accelerator_path(device: torch.device) -> bool:
    """Whether code with a CPU strategy and an accelerator strategy takes the accelerator's on ``device``.

    Two places choose by device: :func:`~adaptive_spec.trees.draw.draw_children` draws without replacement
    by the exponential race on an accelerator (a few kernels) and from inverse-CDF draws on a CPU (far fewer
    random numbers), and the verifiers that can compute their whole outcome ahead do so on an
    accelerator (:func:`adaptive_spec.verifiers.base.run_ahead`). :func:`accelerator_path_on_cpu` makes a
    CPU take the accelerator's path: ``bench overhead --syncs`` counts that path, and tests check its law.
    """
    return device.type != "cpu" or _ACCELERATOR_ON_CPU[0] > 0


@contextlib.contextmanager
def accelerator_path_on_cpu() -> Iterator[None]:
    """Within the block, :func:`accelerator_path` is True on a CPU too."""
    _ACCELERATOR_ON_CPU[0] += 1
    try:
        yield
    finally:
        _ACCELERATOR_ON_CPU[0] -= 1
