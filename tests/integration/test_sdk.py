"""The Python SDK (cft_sdk) against the real API server and PostgreSQL: batching, feedback,
retries (timeouts, 5xx, 429) without duplicates, 4xx isolation, the server down, flush at
exit, and the OpenAI wrapper with the official openai SDK against a stub backend."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import psycopg
import pytest
from psycopg.rows import dict_row

import cft_sdk
import cft_sdk.openai
from app.core import auth
from app.core.config import Settings
from app.main import create_app
from tests.support import db as testdb
from tests.support.factories import make_tenant
from tests.support.openai_stub import ANSWER, COMPLETION_TOKENS, PROMPT_TOKENS, OpenAIStub
from tests.support.servers import free_port, serve_app

ROOT = Path(__file__).resolve().parents[2]
FAST = {"backoff_initial": 0.05, "backoff_max": 0.2, "flush_interval": 0.05}


class Gate:
    """ASGI wrapper around the real app: counts POST /v1/logs and can make the next ones
    fail (503, 429) or answer late (after the app committed), as a flaky network would."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.plan: list[str] = []  # "503", "429" or "late:<seconds>", consumed in order
        self.posts: list[int] = []  # body size of each POST /v1/logs that reached the app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        is_log = (
            scope["type"] == "http" and scope["method"] == "POST" and scope["path"] == "/v1/logs"
        )
        action = self.plan.pop(0) if is_log and self.plan else None
        if action in ("503", "429"):
            await send({"type": "http.response.start", "status": int(action), "headers": []})
            await send({"type": "http.response.body", "body": b"{}"})
            return
        if is_log:
            self.posts.append(int(dict(scope["headers"]).get(b"content-length", b"0")))
        if action and action.startswith("late:"):
            held: list[Any] = []

            async def hold(message: Any) -> None:
                held.append(message)

            await self.app(scope, receive, hold)  # the batch is committed here
            await asyncio.sleep(float(action.split(":")[1]))
            for message in held:
                await send(message)
            return
        await self.app(scope, receive, send)


@pytest.fixture(scope="module")
def env(
    pg_server: str, template_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Any]]:
    url = testdb.clone(pg_server)
    with psycopg.connect(url, autocommit=True, row_factory=dict_row) as c:
        tenant = make_tenant(c)
        key = auth.create_key(c, tenant_id=tenant["id"], role="ingest")
    home = tmp_path_factory.mktemp("sdk-home")
    gate = Gate(create_app(Settings(home=home), db_url=url))
    with serve_app(gate) as base:
        yield {"api": base, "key": key, "db_url": url, "gate": gate, "home": home}
    testdb.drop(pg_server, url)


def rows(env: dict[str, Any], route: str) -> list[dict[str, Any]]:
    with psycopg.connect(env["db_url"], autocommit=True, row_factory=dict_row) as c:
        return c.execute(
            "SELECT * FROM obs.inference_log WHERE route = %s ORDER BY created_at", (route,)
        ).fetchall()


def route_name() -> str:
    return f"sdk-{uuid.uuid4().hex[:8]}"


def msg(i: int) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"question {i}"}]


def test_sdk_imports_without_server_or_ml_dependencies() -> None:
    code = textwrap.dedent(
        """
        import sys
        BLOCKED = ("torch", "fastapi", "starlette", "uvicorn", "psycopg", "pydantic", "app",
                   "workers", "openai", "transformers", "sqlalchemy")
        class Blocker:
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in BLOCKED:
                    raise ImportError(f"blocked: {name}")
        sys.meta_path.insert(0, Blocker())
        import cft_sdk, cft_sdk.openai
        c = cft_sdk.Client("http://127.0.0.1:9", "cft_x", route="r", flush_at_exit=False)
        c.log(messages=[{"role": "user", "content": "hi"}])
        c.close(timeout=0)
        print("ok", sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED))
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == "ok []"


def test_batches_feedback_and_idempotent_resend(env: dict[str, Any]) -> None:
    route = route_name()
    gate = env["gate"]
    before = len(gate.posts)
    with cft_sdk.Client(env["api"], env["key"], route=route, batch_size=20, flush_interval=5) as c:
        ids = [
            c.log(messages=msg(i), completion=f"answer {i}", tokens_in=3, user="u-1")
            for i in range(50)
        ]
        c.feedback(ids[0], thumbs=1)
        c.feedback(ids[1], regenerate=ids[2])
        c.feedback(ids[3], edited="a better answer", thumbs=False)
        assert c.flush(10)
        # The same records again (a process that re-sends what it logged): nothing doubles.
        for i, rid in enumerate(ids[:10]):
            c.log(messages=msg(i), completion=f"answer {i}", request_id=rid)
        assert c.flush(10)
        stats = c.stats
    got = rows(env, route)
    assert len(got) == 50
    assert stats.inserted == 50 and stats.existing == 10 and stats.feedback_sent == 3
    # 50 records in batches of 20 (the feedback cuts the third one short), then one re-send.
    assert len(gate.posts) - before == 4
    by_id = {str(r["request_id"]): r for r in got}
    assert by_id[ids[0]]["fb_explicit"] == 1
    assert by_id[ids[1]]["fb_regen"] is True and str(by_id[ids[1]]["regenerated_by"]) == ids[2]
    assert by_id[ids[3]]["fb_edited"] and by_id[ids[3]]["edited_completion"] == "a better answer"
    assert by_id[ids[3]]["fb_explicit"] == -1
    assert by_id[ids[5]]["user_hash"] is not None and by_id[ids[5]]["tokens_in"] == 3


def test_retries_after_timeout_5xx_and_429_land_once(env: dict[str, Any]) -> None:
    route = route_name()
    gate = env["gate"]
    # 1st try: committed but answered after the client's timeout; then 503; then 429.
    gate.plan = ["late:1.0", "503", "429"]
    before = len(gate.posts)
    with cft_sdk.Client(env["api"], env["key"], route=route, request_timeout=0.4, **FAST) as c:
        for i in range(30):
            c.log(messages=msg(i), completion="a")
        assert c.flush(15)
        stats = c.stats
    assert gate.plan == []
    assert len(rows(env, route)) == 30  # the batch re-sent after the timeout landed once
    assert stats.retries >= 3 and stats.sent == 30
    assert stats.existing == 30 and stats.inserted == 0  # the re-send found them all
    assert len(gate.posts) - before == 2  # the late one and the re-send reached the app


def test_refused_records_are_isolated_and_the_rest_land(env: dict[str, Any]) -> None:
    route = route_name()
    with cft_sdk.Client(
        env["api"],
        env["key"],
        route=route,
        flush_interval=5,
        **{k: v for k, v in FAST.items() if k != "flush_interval"},
    ) as c:
        for i in range(9):
            c.log(messages=msg(i))
        c.log(messages=[{"role": "robot", "content": "bad role"}])  # the server refuses it
        assert c.flush(10)
        stats = c.stats
    assert len(rows(env, route)) == 9
    assert stats.rejected == 1 and stats.sent == 9 and stats.retries == 0


def test_server_down_records_wait_and_land_when_it_is_back(env: dict[str, Any]) -> None:
    route = route_name()
    port = free_port()
    c = cft_sdk.Client(f"http://127.0.0.1:{port}", env["key"], route=route, **FAST)
    for i in range(25):
        c.log(messages=msg(i))
    assert not c.flush(0.5)  # nothing listens: the records wait
    assert c.stats.retries >= 1 and c.stats.sent == 0
    # The same API (same database) comes up on that port.
    app = create_app(Settings(home=env["home"]), db_url=env["db_url"])
    with serve_app(app, port=port):
        assert c.flush(15)
        c.close()
    assert len(rows(env, route)) == 25
    assert c.stats.sent == 25 and c.stats.lost == 0


def test_nothing_is_lost_on_a_clean_exit(env: dict[str, Any]) -> None:
    route = route_name()
    n = 300
    code = textwrap.dedent(
        f"""
        import os, sys
        import cft_sdk
        c = cft_sdk.Client({env["api"]!r}, {env["key"]!r}, route={route!r}, flush_interval=30)
        for i in range({n}):
            c.log(messages=[{{"role": "user", "content": f"q{{i}}"}}], completion="a")
        # A forked worker logs through its own sender thread, and exits normally too.
        pid = os.fork()
        if pid == 0:
            for i in range(50):
                c.log(messages=[{{"role": "user", "content": f"child {{i}}"}}])
            sys.exit(0)
        assert os.waitpid(pid, 0)[1] == 0
        # No flush, no close: the interpreter exits and atexit sends the queue.
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert len(rows(env, route)) == n + 50


def test_openai_wrapper_logs_sync_async_and_streaming_calls(env: dict[str, Any]) -> None:
    route = route_name()
    stub = OpenAIStub()
    with serve_app(stub) as backend, cft_sdk.Client(env["api"], env["key"], **FAST) as cft:
        client = cft_sdk.openai.wrap(
            openai.OpenAI(base_url=backend + "/v1", api_key="sk-stub", max_retries=0),
            cft,
            route=route,
        )
        question = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
        resp = client.chat.completions.create(model="stub-model", messages=question, user="alice")
        assert resp.choices[0].message.content == ANSWER
        stream = client.chat.completions.create(
            model="stub-model",
            messages=question,
            stream=True,
            stream_options={"include_usage": True},
        )
        streamed = "".join(ch.choices[0].delta.content or "" for ch in stream if ch.choices)
        assert streamed == ANSWER

        aclient = cft_sdk.openai.wrap(
            openai.AsyncOpenAI(base_url=backend + "/v1", api_key="sk-stub", max_retries=0),
            cft,
            route=route,
        )

        async def calls() -> tuple[str, str]:
            r = await aclient.chat.completions.create(model="stub-model", messages=question)
            s = await aclient.chat.completions.create(
                model="stub-model", messages=question, stream=True
            )
            async with s:
                async for _ in s:
                    pass
            return r.cft_request_id, s.cft_request_id

        async_ids = asyncio.run(calls())
        cft.feedback(resp.cft_request_id, thumbs=-1)
        assert cft.flush(10)
    assert stub.calls == 4
    got = {str(r["request_id"]): r for r in rows(env, route)}
    assert set(got) == {resp.cft_request_id, stream.cft_request_id, *async_ids}
    one = got[resp.cft_request_id]
    assert one["messages"] == question and one["completion"] == ANSWER
    assert (one["tokens_in"], one["tokens_out"]) == (PROMPT_TOKENS, COMPLETION_TOKENS)
    assert one["model"] == "stub-model" and one["user_hash"] is not None
    assert one["fb_explicit"] == -1
    streamed_row = got[stream.cft_request_id]
    assert streamed_row["completion"] == ANSWER and streamed_row["ttft_ms"] is not None
    assert streamed_row["tokens_out"] == COMPLETION_TOKENS  # from the usage chunk
    assert got[async_ids[1]]["completion"] == ANSWER and got[async_ids[1]]["tokens_out"] is None


def test_openai_wrapper_does_not_wait_for_cft(env: dict[str, Any]) -> None:
    # cft is down: the wrapped call returns as fast as the backend answers (enqueue only).
    with serve_app(OpenAIStub()) as backend:
        cft = cft_sdk.Client(f"http://127.0.0.1:{free_port()}", "cft_x", route="r", **FAST)
        client = cft_sdk.openai.wrap(
            openai.OpenAI(base_url=backend + "/v1", api_key="sk-stub", max_retries=0), cft
        )
        start = time.perf_counter()
        for _ in range(5):
            client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
        elapsed = time.perf_counter() - start
        cft.close(timeout=0)
        # A record the SDK cannot build (no route anywhere) never fails the provider's answer.
        routeless = cft_sdk.Client(f"http://127.0.0.1:{free_port()}", "cft_x", flush_at_exit=False)
        bare = cft_sdk.openai.wrap(
            openai.OpenAI(base_url=backend + "/v1", api_key="sk-stub", max_retries=0), routeless
        )
        answer = bare.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "x"}]
        )
        assert answer.choices[0].message.content == ANSWER
        routeless.close(timeout=0)
    assert elapsed < 2.0, elapsed
    assert cft.stats.lost == 5 and cft.stats.sent == 0


def test_close_keeps_its_deadline_against_a_server_that_never_answers() -> None:
    # A socket that accepts connections (kernel backlog) but never answers: every send
    # times out. close() must not spend a request timeout per queued batch.
    with socket.socket() as blackhole:
        blackhole.bind(("127.0.0.1", 0))
        blackhole.listen(1000)
        port = blackhole.getsockname()[1]
        c = cft_sdk.Client(
            f"http://127.0.0.1:{port}",
            "cft_x",
            route="r",
            batch_size=10,
            request_timeout=1.0,
            flush_at_exit=False,
            **FAST,
        )
        for i in range(1000):
            c.log(messages=msg(i))
        start = time.perf_counter()
        c.close(timeout=0.5)
        elapsed = time.perf_counter() - start
    assert elapsed < 3.0, elapsed  # the deadline plus at most one request timeout
    assert c.stats.lost == 1000 and c.stats.sent == 0
