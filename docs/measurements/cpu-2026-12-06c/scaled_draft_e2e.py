# `adaptive-spec` with the draft's rows at scale SHARP: ProbsFn divides the reduced-vocabulary (the head's) logits by it.
# Usage: SHARP=0.85 python scaled_draft_e2e.py bench e2e ... (a measurement patch, not an engine option)
import os
import sys

from adaptive_spec.engine import logits as L

r = float(os.environ.get("SHARP", "1"))
orig = L.ProbsFn.__call__


def call(self, logits):
    if self.token_ids is not None and r != 1.0:
        logits = logits.float() / r
    return orig(self, logits)


L.ProbsFn.__call__ = call
from adaptive_spec.cli import main

sys.exit(main(sys.argv[1:]))
