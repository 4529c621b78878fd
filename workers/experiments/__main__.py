"""`python -m workers.experiments [--once]`: the experiments worker process."""

from __future__ import annotations

import sys

from workers.experiments.cli import main

if __name__ == "__main__":
    sys.exit(main())
