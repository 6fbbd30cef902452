"""``python -m adaptive_spec.cli``: the ``adaptive-spec`` command line."""

import sys

from adaptive_spec.cli import main

sys.exit(main())
