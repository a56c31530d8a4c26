"""`python -m engine.bench`: see engine.bench.cli."""

import sys

from engine.bench.cli import main

sys.exit(main())
