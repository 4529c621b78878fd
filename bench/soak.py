"""Soak (BENCHMARKS.md "Soak (issue 11)"): mixed traffic at a fixed rate for a fixed time, then a reconciliation.

The stack is bench/router.py's: a fresh embedded PostgreSQL (fsync on), the stub OpenAI backend
(answers at once: this measures cft, not a model) and cft's API under uvicorn with
CFT_ENGINE_URLS pointing at the stub. Three open-loop streams run together, each at its own
rate (a request is sent at its scheduled time whether or not earlier ones have answered, and
its latency counts from that time, so queueing is not hidden):

- ingest:   POST /v1/logs, a batch of --batch records (bench/ingest.py's records);
- feedback: POST /v1/logs/{id}/feedback on a random acknowledged request (logged or routed);
- chat:     POST /v1/chat/completions through the router (route -> prod adapter -> stub), each
            with its own X-Request-Id, from --users distinct users.

Reports per kind: sent, p50/p99/max latency, errors (anything but 2xx, or no answer); then waits
for the router's log writer to drain and checks that every acknowledged request id (each
record of a 200 batch, each X-Request-Id of a 200 chat answer) is in obs.inference_log exactly
once. Exits 1 on any loss or duplicate, 2 if the error rate is over --max-error-rate.

Usage: python bench/soak.py [--seconds 600] [--ingest-rate 10] [--batch 20]
                            [--feedback-rate 10] [--chat-rate 40]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psycopg

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from app.core import auth  # noqa: E402
from bench.ingest import make_records  # noqa: E402
from bench.load import pct  # noqa: E402
from bench.router import Stack  # noqa: E402

ROUTE = "support-es"  # the route bench/router.py's Stack creates (prod adapter bench-v0)


@dataclass
class Kind:
    """Latencies and errors of one kind of request."""

    name: str
    rate: float
    latencies: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    late: int = 0  # sends that started more than 100 ms after their scheduled time

    @property
    def sent(self) -> int:
        return len(self.latencies) + len(self.errors)


@dataclass
class Soak:
    """What the traffic acknowledged, for the reconciliation."""

    acked_logs: list[str] = field(default_factory=list)
    acked_routed: list[str] = field(default_factory=list)

    def any_acked(self) -> str | None:
        """A random acknowledged id, logged or routed with equal odds (None before any)."""
        pools = [p for p in (self.acked_logs, self.acked_routed) if p]
        return random.choice(random.choice(pools)) if pools else None


async def ingest(http: httpx.AsyncClient, soak: Soak, batch: int) -> str | None:
    records = make_records(batch)
    resp = await http.post("/v1/logs", json={"records": records})
    if resp.status_code != 200:
        return f"{resp.status_code} {resp.text[:200]}"
    statuses = {r["request_id"]: r["status"] for r in resp.json()["records"]}
    if len(statuses) != batch or set(statuses.values()) != {"inserted"}:
        return f"unexpected batch result: {list(statuses.values())[:5]}"
    soak.acked_logs.extend(r["request_id"] for r in records)
    return None


async def feedback(http: httpx.AsyncClient, soak: Soak) -> str | None:
    rid = soak.any_acked()
    if rid is None:
        return None  # nothing acknowledged yet: counts as done
    resp = await http.post(f"/v1/logs/{rid}/feedback", json={"thumbs": random.choice([-1, 1])})
    return None if resp.status_code == 200 else f"{resp.status_code} {resp.text[:200]}"


async def chat(http: httpx.AsyncClient, soak: Soak, users: int) -> str | None:
    rid = str(uuid.uuid4())
    body = {
        "model": ROUTE,
        "messages": [{"role": "user", "content": f"¿Cómo cambio mi contraseña? ({rid[:8]})"}],
        "max_tokens": 16,
        "user": f"soak-user-{random.randrange(users)}",
    }
    resp = await http.post("/v1/chat/completions", json=body, headers={"X-Request-Id": rid})
    if resp.status_code != 200:
        return f"{resp.status_code} {resp.text[:200]}"
    if resp.headers.get("x-request-id") != rid:
        return f"X-Request-Id {resp.headers.get('x-request-id')} is not the one sent ({rid})"
    soak.acked_routed.append(rid)
    return None


async def stream(kind: Kind, seconds: float, call: Any) -> None:
    """Open loop: one request every 1/rate seconds, each in its own task."""
    if kind.rate <= 0:
        return
    interval = 1.0 / kind.rate
    start = time.perf_counter()
    tasks: set[asyncio.Task[None]] = set()

    async def one(scheduled: float) -> None:
        try:
            error = await call()
        except httpx.HTTPError as exc:
            error = f"{type(exc).__name__}: {exc}"
        if error is None:
            kind.latencies.append(time.perf_counter() - scheduled)
        else:
            kind.errors.append(error)

    n = 0
    while True:
        scheduled = start + n * interval
        if scheduled - start >= seconds:
            break
        delay = scheduled - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        elif -delay > 0.1:
            kind.late += 1
        task = asyncio.create_task(one(scheduled))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
        n += 1
    await asyncio.gather(*tasks)


async def drive(st: Stack, args: argparse.Namespace, ingest_key: str) -> tuple[Soak, list[Kind]]:
    soak = Soak()
    kinds = [
        Kind("ingest", args.ingest_rate),
        Kind("feedback", args.feedback_rate),
        Kind("chat", args.chat_rate),
    ]
    limits = httpx.Limits(max_connections=200, max_keepalive_connections=200)
    timeout = httpx.Timeout(30.0)
    async with (
        httpx.AsyncClient(
            base_url=st.api,
            headers={"Authorization": f"Bearer {ingest_key}"},
            limits=limits,
            timeout=timeout,
        ) as logs_http,
        httpx.AsyncClient(
            base_url=st.api,
            headers={"Authorization": f"Bearer {st.key}"},
            limits=limits,
            timeout=timeout,
        ) as chat_http,
    ):
        # One warm-up chat call (key cache, route cache, engine probe); not counted.
        await chat(chat_http, Soak(), args.users)
        await asyncio.gather(
            stream(kinds[0], args.seconds, lambda: ingest(logs_http, soak, args.batch)),
            stream(kinds[1], args.seconds, lambda: feedback(logs_http, soak)),
            stream(kinds[2], args.seconds, lambda: chat(chat_http, soak, args.users)),
        )
    return soak, kinds


def rss_mib(pid: int) -> float:
    """Resident memory of a process, MiB (0 where /proc is not available)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def reconcile(db: str, tenant_id: int, acked: list[str], wait_s: float) -> dict[str, int]:
    """Rows per acknowledged id once the router's log writer has drained (waits up to wait_s)."""
    deadline = time.monotonic() + wait_s
    with psycopg.connect(db, autocommit=True) as c:
        while True:
            rows = c.execute(
                "SELECT request_id::text, count(*) FROM obs.inference_log"
                " WHERE tenant_id = %s AND request_id = ANY(%s::uuid[]) GROUP BY 1",
                (tenant_id, acked),
            ).fetchall()
            found = {r[0]: int(r[1]) for r in rows}
            if len(found) >= len(set(acked)) or time.monotonic() > deadline:
                total = c.execute(
                    "SELECT count(*), count(DISTINCT request_id) FROM obs.inference_log"
                    " WHERE tenant_id = %s",
                    (tenant_id,),
                ).fetchone()
                assert total is not None
                return {
                    "acked": len(acked),
                    "distinct_acked": len(set(acked)),
                    "found": len(found),
                    "lost": len(set(acked) - found.keys()),
                    "duplicated": sum(1 for n in found.values() if n > 1),
                    "rows": int(total[0]),
                    "distinct_rows": int(total[1]),
                }
            time.sleep(0.2)


def main() -> None:
    """Run the soak and print the report."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--seconds", type=float, default=600)
    ap.add_argument("--ingest-rate", type=float, default=10, help="batches per second")
    ap.add_argument("--batch", type=int, default=20, help="records per batch")
    ap.add_argument("--feedback-rate", type=float, default=10, help="feedback calls per second")
    ap.add_argument("--chat-rate", type=float, default=40, help="router calls per second")
    ap.add_argument("--users", type=int, default=1000, help="distinct end users of chat calls")
    ap.add_argument("--max-error-rate", type=float, default=0.0)
    args = ap.parse_args()

    with Stack() as st:
        with psycopg.connect(st.db, autocommit=True) as c:
            ingest_key = auth.create_key(c, tenant_id=st.tenant_id, role="ingest")  # type: ignore[arg-type]
        api_pid = st.procs[-1].pid
        rss_start = rss_mib(api_pid)
        started = time.monotonic()
        soak, kinds = asyncio.run(drive(st, args, ingest_key))
        elapsed = time.monotonic() - started
        rss_end = rss_mib(api_pid)
        acked = soak.acked_logs + soak.acked_routed
        result = reconcile(st.db, st.tenant_id, acked, wait_s=60)

    total = sum(k.sent for k in kinds)
    errors = sum(len(k.errors) for k in kinds)
    print(f"soak: {elapsed:.0f} s on {os.cpu_count()} CPUs (shared); stub backend; one API process")
    print(
        f"offered: ingest {args.ingest_rate:g}/s x {args.batch} records, feedback"
        f" {args.feedback_rate:g}/s, chat {args.chat_rate:g}/s ({args.users} users)"
    )
    for k in kinds:
        lat = k.latencies
        print(
            f"  {k.name:<8} sent {k.sent:>6} ({k.sent / elapsed:6.1f}/s)  p50 {pct(lat, 50):7.1f} ms"
            f"  p99 {pct(lat, 99):7.1f} ms  max {1000 * max(lat or [0]):7.1f} ms"
            f"  errors {len(k.errors)}  late sends {k.late}"
        )
    print(f"errors: {errors} of {total} requests ({100 * errors / max(total, 1):.3f} %)")
    for k in kinds:
        for e in k.errors[:3]:
            print(f"  {k.name}: {e}")
    print(f"API process RSS: {rss_start:.0f} MiB at start, {rss_end:.0f} MiB at end")
    print(
        f"reconciliation: {result['distinct_acked']} acknowledged ids"
        f" ({len(soak.acked_logs)} logged, {len(soak.acked_routed)} routed),"
        f" {result['found']} found, lost {result['lost']}, duplicated {result['duplicated']};"
        f" table: {result['rows']} rows, {result['distinct_rows']} distinct request ids"
    )
    if result["lost"] or result["duplicated"] or result["rows"] != result["distinct_rows"]:
        print("FAIL: acknowledged requests are missing or duplicated")
        sys.exit(1)
    if errors > args.max_error_rate * total:
        print(f"FAIL: error rate over {args.max_error_rate:g}")
        sys.exit(2)
    print("OK: every acknowledged request is stored exactly once")


if __name__ == "__main__":
    main()
