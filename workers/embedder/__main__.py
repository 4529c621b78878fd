"""`python -m workers.embedder`: the same as `cft worker`'s embedder."""

from workers.embedder.cli import main

raise SystemExit(main())
