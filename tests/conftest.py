import os

import torch

# Two threads is what these machines have; more only adds contention under xdist.
torch.set_num_threads(int(os.environ.get("ADAPTIVE_SPEC_TEST_THREADS", "1")))
