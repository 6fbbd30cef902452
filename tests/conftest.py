import os

import torch

# Two threads is what these machines have; more only adds contention under xdist.
torch.set_num_threads(int(os.environ.get("ADAPTIVE_SPEC_TEST_THREADS", "1")))

import pytest  # noqa: E402


def pytest_collection_modifyitems(config, items):
    """``gpu``-marked tests need a CUDA device: skipped cleanly without one (CI has none)."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (run on the GPU machine: pytest -m gpu)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
