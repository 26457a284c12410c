"""``python -m raytrain_hetero`` is the ``raytrain-hetero`` command."""

import sys

from raytrain_hetero.app.cli import main

sys.exit(main())
