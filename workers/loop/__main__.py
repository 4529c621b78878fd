"""`python -m workers.loop`."""

from workers.loop.worker import main

raise SystemExit(main())
