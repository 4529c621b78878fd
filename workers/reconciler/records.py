"""What the reconciler reads from serve.adapter, and what it records in
serve.adapter_deployment (one row per adapter and engine: loaded, failed or unloaded, why, and
when its sha256 was last checked).

The recorded states are read once, when a reconciler starts leading, and kept in memory in
step with every record it writes: a pass compares sets, it does not read them again. The
records are written in batches, one statement each (at the end of a pass, and at most FLUSH_S
after the first record of a batch), not one per load.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

from app.core.db import Connection
from app.engines.placement import CANARY, PREVIOUS, PROD
from workers.reconciler.staging import Desired

# Every canary and prod, each route's previous prod (kept for an instant rollback), and each
# candidate a router was called for by name (a fine-tuned model) until its demand ends, with
# its class in the hot set (a called candidate with the canaries: it is being called now).
_DESIRED = (
    "SELECT id, route, base_model, weights_uri, sha256,"
    " CASE status WHEN 'canary' THEN %(canary)s WHEN 'candidate' THEN %(canary)s"
    " WHEN 'prod' THEN %(prod)s ELSE %(previous)s END AS rank"
    " FROM serve.adapter"
    " WHERE (status IN ('canary', 'prod') OR (tainted_at IS NULL AND id IN ("
    "  SELECT previous_prod_id FROM serve.adapter"
    "   WHERE status = 'prod' AND previous_prod_id IS NOT NULL))"
    " OR (status = 'candidate' AND tainted_at IS NULL AND id IN ("
    "  SELECT adapter_id FROM serve.adapter_demand WHERE wanted_until > now())))"
    " AND weights_uri IS NOT NULL AND sha256 IS NOT NULL"
)
# Records not written yet are written at most this long after the first of them.
FLUSH_S = 0.5
# What became of adapters on engines, one row per (adapter, engine); a sha256 checked now.
_RECORD = (
    "INSERT INTO serve.adapter_deployment AS d"
    " (adapter_id, engine_url, state, error, sha256_checked_at)"
    " SELECT a, e, s, err, CASE WHEN c THEN now() END"
    " FROM unnest(%(a)s::text[], %(e)s::text[], %(s)s::text[], %(err)s::text[], %(c)s::bool[])"
    " AS r(a, e, s, err, c)"
    " ON CONFLICT (adapter_id, engine_url) DO UPDATE SET state = excluded.state,"
    " error = excluded.error, updated_at = now(),"
    " sha256_checked_at = coalesce(excluded.sha256_checked_at, d.sha256_checked_at)"
)
_RANKS = {"canary": CANARY, "prod": PROD, "previous": PREVIOUS}
# An adapter asked for by id: any with a verified artefact that is not retired, failed or
# tainted (a candidate served before its canary, an adapter whose NOTIFY has not come yet).
_ASKED = (
    "SELECT id, route, base_model, weights_uri, sha256, %(previous)s AS rank FROM serve.adapter"
    " WHERE id = ANY(%(ids)s) AND status NOT IN ('retired', 'failed')"
    " AND weights_uri IS NOT NULL AND sha256 IS NOT NULL AND tainted_at IS NULL"
)


def desired(conn: Connection) -> dict[str, Desired]:
    """The adapters the fleet serves, by id."""
    rows = conn.execute(_DESIRED, _RANKS).fetchall()
    return {r["id"]: Desired(**r) for r in rows}


def next_demand_end(conn: Connection) -> float | None:
    """Seconds until the first demand for a called-by-name adapter ends (then it leaves the
    desired set: read it again); None when none is running."""
    row = conn.execute(
        "SELECT extract(epoch FROM min(wanted_until) - now())::float8 AS s"
        " FROM serve.adapter_demand WHERE wanted_until > now()"
    ).fetchone()
    return None if row is None or row["s"] is None else float(row["s"])


def recently_left(conn: Connection, grace_s: float) -> set[str]:
    """Adapters out of canary/prod for less than grace_s (kept loaded meanwhile); a tainted
    one is not kept."""
    rows = conn.execute(
        "SELECT id FROM serve.adapter WHERE status NOT IN ('canary', 'prod')"
        " AND tainted_at IS NULL AND updated_at > now() - make_interval(secs => %s)",
        (grace_s,),
    ).fetchall()
    return {r["id"] for r in rows}


def loadable(
    conn: Connection, ids: Iterable[str], desired: dict[str, Desired]
) -> dict[str, Desired]:
    """The adapters of `ids` that may be loaded: from `desired`, else read."""
    ids = list(ids)
    found = {i: desired[i] for i in ids if i in desired}
    rest = [i for i in ids if i not in found]
    if rest:
        rows = conn.execute(_ASKED, {"ids": rest, "previous": PREVIOUS}).fetchall()
        found |= {r["id"]: Desired(**r) for r in rows}
    return found


def loaded_on(conn: Connection, url: str) -> set[str]:
    """The adapters recorded loaded on an engine."""
    rows = conn.execute(
        "SELECT adapter_id FROM serve.adapter_deployment"
        " WHERE engine_url = %s AND state = 'loaded'",
        (url,),
    ).fetchall()
    return {r["adapter_id"] for r in rows}


class Deployments:
    """Per engine URL, the adapters recorded loaded there: read once (read()), then kept in
    step with record(); the records themselves are written in batches (flush(): one statement
    for all of them, at the end of each pass and at most FLUSH_S after the first)."""

    def __init__(self) -> None:
        self.loaded: dict[str, set[str]] | None = None
        # (adapter, engine) -> (state, error, sha256 checked): not written yet.
        self._pending: dict[tuple[str, str], tuple[str, str | None, bool]] = {}
        self._since = 0.0

    def read(self, conn: Connection, urls: Iterable[str]) -> dict[str, set[str]]:
        """Read what is recorded for these engines (when a reconciler starts leading)."""
        self.loaded = {url: loaded_on(conn, url) for url in urls}
        return self.loaded

    def forget(self) -> None:
        """Read them again before the next use (another leader may have changed them); what
        was not written yet is dropped (what the engines list is recorded again)."""
        self.loaded = None
        self._pending.clear()

    def on(self, url: str) -> set[str]:
        """The adapters recorded loaded on an engine (empty until read)."""
        if self.loaded is None:
            return set()
        return self.loaded.setdefault(url, set())

    def record(
        self,
        adapter_id: str,
        engine_url: str,
        state: str,
        error: str | None,
        *,
        checked: bool = False,
    ) -> None:
        """Note what became of an adapter on an engine (loaded, failed, unloaded); written by
        the next flush()."""
        key = (adapter_id, engine_url)
        if not self._pending:
            self._since = time.monotonic()
        before = self._pending.get(key)
        self._pending[key] = (state, error, checked or (before is not None and before[2]))
        if self.loaded is not None:
            loaded = self.loaded.setdefault(engine_url, set())
            if state == "loaded":
                loaded.add(adapter_id)
            else:
                loaded.discard(adapter_id)

    def flush_in(self) -> float | None:
        """Seconds until the records not written yet are due (None: there are none)."""
        if not self._pending:
            return None
        return max(0.0, self._since + FLUSH_S - time.monotonic())

    def flush(self, conn: Connection, *, due_only: bool = False) -> None:
        """Write the records not written yet, in one statement (with due_only, only once they
        are due)."""
        wait = self.flush_in()
        if wait is None or (due_only and wait > 0):
            return
        pending, self._pending = self._pending, {}
        keys = list(pending)
        conn.execute(
            _RECORD,
            {
                "a": [k[0] for k in keys],
                "e": [k[1] for k in keys],
                "s": [pending[k][0] for k in keys],
                "err": [pending[k][1] for k in keys],
                "c": [pending[k][2] for k in keys],
            },
        )
