"""`python -m workers.engine`: the same as `cft engine`."""

import sys

from workers.engine.cli import main

sys.exit(main())
