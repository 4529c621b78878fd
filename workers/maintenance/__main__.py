"""`python -m workers.maintenance`: the same as `cft worker`'s maintenance."""

from workers.maintenance.cli import main

raise SystemExit(main())
