"""`cft worker experiments` (or `python -m workers.experiments`): apply the live-traffic
promotion policy of every enabled route: always-valid decisions (serve.canary_decision,
serve.watch_decision), so checking every --interval keeps their error bound."""

from __future__ import annotations

import logging

from app.core.db import connect
from app.experiments import service as experiments

log = logging.getLogger("cft.experiments")


def run_once(url: str) -> int:
    """One pass: each enabled route in its own transaction; returns the decisions recorded."""
    recorded = 0
    with connect(url) as conn:
        routes = experiments.policy_routes(conn)
        conn.commit()
        for tenant_id, route in routes:
            try:
                with conn.transaction():
                    for d in experiments.run_policy(conn, tenant_id=tenant_id, route=route):
                        if d.id is not None:
                            recorded += 1
                            log.info(
                                "%s/%s %s: %s %s (%s)",
                                tenant_id,
                                route,
                                d.canary_id,
                                d.action,
                                d.code,
                                d.reason,
                            )
            except Exception:
                log.exception("experiment policy of route %s/%s failed", tenant_id, route)
    return recorded
