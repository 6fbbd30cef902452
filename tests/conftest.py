import os
import tempfile

import torch

# Installs (selector pipeline --install, selector acceptance --install) and built pairs go to the
# user data folder: a fresh one per test process, so no test reads or writes the real one.
# The real folder is remembered first: a test of a fetched model (smollm2) reads it, and only reads.
from adaptive_spec.files import user_data_dir

os.environ.setdefault("ADAPTIVE_SPEC_REAL_HOME", str(user_data_dir()))
os.environ["ADAPTIVE_SPEC_HOME"] = tempfile.mkdtemp(prefix="adaptive-spec-home-")

# The engine's models get column-major CPU weights without measuring the host (the weight order of
# every run alike); tests/engine/test_weight_order.py sets "auto" itself.
os.environ.setdefault("ADAPTIVE_SPEC_WEIGHT_ORDER", "column")

# Without a CUDA device, Triton (where installed) runs its kernels in its interpreter: the fused verifier kernels'
# tests run them there (tests/verifiers/test_kernels.py). Read when triton is first imported, so set here.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# Two threads is what these machines have; more only adds contention under xdist.
torch.set_num_threads(int(os.environ.get("ADAPTIVE_SPEC_TEST_THREADS", "1")))

import pytest  # noqa: E402

from tests.helpers.pairs import tiny_pair  # noqa: F401, E402  (a fixture for every test module)


def pytest_collection_modifyitems(config, items):
    """``gpu``-marked tests need a CUDA device: skipped cleanly without one (CI has none)."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (run on the GPU machine: pytest -m gpu)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
