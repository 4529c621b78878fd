"""`python -m workers.reconciler [--once]`: the reconciler process."""

from __future__ import annotations

import sys

from workers.reconciler.cli import main

if __name__ == "__main__":
    sys.exit(main())
