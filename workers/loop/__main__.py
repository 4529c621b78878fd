"""`python -m workers.loop`."""

from workers.loop.cli import main

raise SystemExit(main())
