"""`python -m workers.trainer [--once]`: the training worker process."""

from __future__ import annotations

import sys

from workers.trainer.cli import main

if __name__ == "__main__":
    sys.exit(main())
