"""``python -m benchmarks SCENARIO [--output DIR] [--repeats N]``."""

import sys

from benchmarks.suite import main

sys.exit(main())
