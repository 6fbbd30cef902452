"""Offline analysis of verifiers, apart from the runtime verifiers in :mod:`adaptive_spec.verifiers`.

- :mod:`~adaptive_spec.analysis.exact`: exact enumeration of a verifier's output law and block
  efficiency on small vocabularies;
- :mod:`~adaptive_spec.analysis.expected`: expected block efficiency of a drafted tree, in closed
  form or by collapsing enumeration (the labeller's oracle);
- :mod:`~adaptive_spec.analysis.lp`: ``lp_limit``, the best block efficiency any lossless
  verifier can reach for a drafting law (scipy, imported on use);
- :mod:`~adaptive_spec.analysis.instances`: small draft/target instances for tests and benchmarks.
"""

__all__ = ["lp_limit"]


def __getattr__(name: str):
    # scipy is imported only when the LP is used.
    if name == "lp_limit":
        from adaptive_spec.analysis.lp import lp_limit

        return lp_limit
    raise AttributeError(name)
