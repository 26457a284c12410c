"""``python -m raytrain_hetero.bench SCENARIO [--output DIR] [--repeats N]``."""

import sys

from raytrain_hetero.bench.suite import main

sys.exit(main())
