"""The dashboard: server-rendered HTML pages with inline SVG charts, behind a reader key."""
