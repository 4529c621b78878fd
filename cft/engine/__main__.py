"""`python -m cft.engine`: the same as `cft engine`."""

import sys

from cft.engine.cli import main

sys.exit(main())
