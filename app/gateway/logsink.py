"""The sink behind the router's log writer: how a batch of served calls' records reaches
obs.inference_log. It runs in the log process (`app.gateway.logprocess`), or in the router's
own process when CFT_ROUTER_LOG_PROCESS is false."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import psycopg
from psycopg.rows import dict_row

from app.core.config import Settings
from app.core.db import Connection
from app.core.pseudonym import user_secret
from app.logs import service as logs
from app.logs.validation import InvalidRecord

# The record's key for its tenant (the router knows it from the API key; not a log column).
TENANT_KEY = "_tenant_id"
# The application_name of the sink's connection, as pg_stat_activity shows it.
APPLICATION_NAME = "cft-router-logs"


class LogSink:
    """The LogWriter's sink: one transaction per tenant, idempotent by request_id, over one
    kept connection of its own, in one statement per tenant (`logs.log_batch`). At low rates
    every call is a batch of its own, so a batch's cost is a large part of a call's: a pooled
    connection per batch added the pool's liveness check and checkout, and a transaction of ~11
    round trips cost the router 2x the CPU (BENCHMARKS.md, "Router against LiteLLM (issue
    26)"). A failed batch drops the connection; the writer's retry opens a new one."""

    def __init__(self, url: str, settings: Settings) -> None:
        self.url = url
        self.settings = settings
        self.secret = user_secret(settings)
        # Encoded pseudonyms kept across batches: an HMAC per record was a third of the
        # batch's Python at 50 users (`logs.log_batch`).
        self.user_hashes: dict[str, str] = {}
        self._conn: Connection | None = None

    def __call__(self, batch: list[dict[str, Any]]) -> None:
        by_tenant: dict[int, list[dict[str, Any]]] = defaultdict(list)
        for record in batch:
            rec = dict(record)
            by_tenant[int(rec.pop(TENANT_KEY))].append(rec)
        conn = self._conn
        if conn is None or conn.closed:
            conn = self._conn = psycopg.connect(
                self.url, autocommit=True, row_factory=dict_row, application_name=APPLICATION_NAME
            )
        try:
            for tenant_id, records in by_tenant.items():
                logs.log_batch(
                    conn,
                    tenant_id=tenant_id,
                    records=records,
                    settings=self.settings,
                    secret=self.secret,
                    user_hashes=self.user_hashes,
                )
        except BaseException:
            # Closing also rolls back the tenant's transaction if it is still open.
            self.close()
            raise

    def close(self) -> None:
        """Close the kept connection (the next batch opens another)."""
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()


# Errors a retry of the same record cannot fix: the validator's (a backend's completion it cannot
# store, say), and the server's refusal of the data itself (e.g. the tenant was offboarded: a
# foreign key). Not unique_violation: a concurrent write of the same request id raises it, and
# the retry finds that row and skips it (`logs.log_batch`).
PERMANENT_LOG_ERRORS: tuple[type[Exception], ...] = (
    InvalidRecord,
    psycopg.errors.DataError,
    psycopg.errors.ForeignKeyViolation,
    psycopg.errors.CheckViolation,
    psycopg.errors.NotNullViolation,
)
