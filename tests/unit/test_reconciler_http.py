"""The reconciler's engine client against a raw local server: keep-alive reuse, a kept
connection the engine dropped (sent again once, on a new one), Connection: close, chunked
bodies, httpx's exceptions for refused, timed out and dropped calls and for error statuses."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import httpx
import pytest

from app.core import http1
from workers.reconciler.http import LeanClient, Reply

# Request bytes -> (raw response or None to drop the call unanswered, keep the connection open).
Answer = Callable[[bytes], tuple[bytes | None, bool]]


CHUNKED = (
    b'HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\n{"a\r\n5\r\n": 1}\r\n0\r\n\r\n'
)


def ok(body: bytes, *extra: bytes) -> bytes:
    head = [b"HTTP/1.1 200 OK", b"content-type: application/json", *extra]
    return b"\r\n".join([*head, b"content-length: %d" % len(body), b"", b""]) + body


@contextmanager
def serve(answer: Answer) -> Iterator[tuple[str, list[bytes], list[int]]]:
    """A raw HTTP server in threads: its URL, the requests it got, the connections it took."""
    listener = socket.create_server(("127.0.0.1", 0))
    seen: list[bytes] = []
    accepted: list[int] = []

    def handle(conn: socket.socket) -> None:
        with conn:
            data = b""
            while True:
                while b"\r\n\r\n" not in data:
                    chunk = conn.recv(65536)
                    if not chunk:
                        return
                    data += chunk
                head, _, data = data.partition(b"\r\n\r\n")
                length = next(
                    (
                        int(line.split(b":")[1])
                        for line in head.split(b"\r\n")
                        if line.lower().startswith(b"content-length:")
                    ),
                    0,
                )
                while len(data) < length:
                    data += conn.recv(65536)
                request, data = head + b"\r\n\r\n" + data[:length], data[length:]
                seen.append(request)
                response, keep = answer(request)
                if response is not None:
                    conn.sendall(response)
                if not keep:
                    return

    def accept() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            accepted.append(1)
            threading.Thread(target=handle, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}", seen, accepted
    finally:
        listener.shutdown(socket.SHUT_RDWR)  # wakes the accept (a close alone would not)
        listener.close()


def test_calls_reuse_one_keep_alive_connection() -> None:
    with serve(lambda request: (ok(b'{"n": 1}'), True)) as (url, seen, accepted):
        client = LeanClient()
        reply = client.post(url + "/load_lora_adapter?x=1", json={"lora_name": "a"})
        assert isinstance(reply, Reply)
        assert (reply.status_code, reply.json(), reply.text) == (200, {"n": 1}, '{"n": 1}')
        assert client.get(url + "/v1/models", timeout=2.0).json() == {"n": 1}
        assert len(accepted) == 1
        assert seen[0].startswith(b"POST /load_lora_adapter?x=1 HTTP/1.1\r\n")
        assert b"\r\ncontent-type: application/json\r\n" in seen[0].lower()
        assert seen[0].endswith(b'\r\n\r\n{"lora_name":"a"}')
        assert seen[1].startswith(b"GET /v1/models HTTP/1.1\r\n")
        client.close()


def test_a_kept_connection_the_engine_dropped_is_sent_again_on_a_new_one() -> None:
    # The engine answers, then closes the connection without saying so (its keep-alive
    # timeout): the next call on it fails and is sent once more, on a new connection.
    with serve(lambda request: (ok(b"{}"), False)) as (url, seen, accepted):
        client = LeanClient()
        for _ in range(3):
            time.sleep(0.05)  # the close reaches the client
            assert client.post(url + "/load", json={}).status_code == 200
        assert (len(seen), len(accepted)) == (3, 3)
        client.close()


def test_a_new_connection_dropped_unanswered_is_a_read_error_not_sent_again() -> None:
    with serve(lambda request: (None, False)) as (url, seen, accepted):
        client = LeanClient()
        with pytest.raises(httpx.ReadError):
            client.post(url + "/load", json={})
        assert (len(seen), len(accepted)) == (1, 1)
        client.close()


def test_chunked_bodies_connection_close_and_error_statuses() -> None:
    def answer(request: bytes) -> tuple[bytes | None, bool]:
        if b"/chunked" in request:
            return CHUNKED, True
        if b"/close" in request:
            return ok(b"{}", b"connection: close"), False
        return b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 4\r\n\r\nbusy", True

    with serve(answer) as (url, _seen, accepted):
        client = LeanClient()
        assert client.get(url + "/chunked").json() == {"a": 1}
        reply = client.get(url + "/missing")
        assert (reply.status_code, reply.text) == (503, "busy")  # any status is an answer
        with pytest.raises(httpx.HTTPStatusError, match="Server error '503'") as caught:
            reply.raise_for_status()
        assert caught.value.response.status_code == 503
        assert caught.value.response.text == "busy"
        assert len(accepted) == 1
        client.get(url + "/close")
        client.get(url + "/close")
        client.get(url + "/missing")
        assert len(accepted) == 3  # a connection the engine closes is not reused
        client.close()


def test_refused_and_timed_out_calls_raise_httpx_errors() -> None:
    def slow(request: bytes) -> tuple[bytes | None, bool]:
        time.sleep(1.0)
        return ok(b"{}"), True

    with serve(slow) as (url, _seen, accepted):
        client = LeanClient()
        with pytest.raises(httpx.ReadTimeout):
            client.get(url + "/slow", timeout=0.2)
        assert client.get(url + "/slow", timeout=5.0).status_code == 200
        assert len(accepted) == 2  # a timed-out connection is never reused
        client.close()
    with pytest.raises(httpx.ConnectError):
        LeanClient().get(url + "/x")


def test_idle_connections_expire_before_the_engines_keep_alive(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with serve(lambda request: (ok(b"{}"), True)) as (url, _seen, accepted):
        client = LeanClient()
        client.get(url + "/a")
        monkeypatch.setattr(http1, "KEEPALIVE_S", 0.0)
        client.get(url + "/a")
        assert len(accepted) == 2
        client.close()
