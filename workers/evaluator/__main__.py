"""`python -m workers.evaluator [--once]`: the evaluator worker process."""

from __future__ import annotations

import sys

from workers.evaluator.cli import main

if __name__ == "__main__":
    sys.exit(main())
