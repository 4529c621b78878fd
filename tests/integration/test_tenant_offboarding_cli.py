"""`cft tenant delete` with the S3 store (a real moto server): another tenant untouched, the
audit row, an engine still holding an adapter (refused, then forced), a store that fails
between the database and the artefact deletes (finished by running it again), unknown 404."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest

from app.core.artefacts import S3Store
from app.core.config import get_settings
from cft import cli
from tests.support.servers import free_port
from tests.support.tenants import counts, populate

BUCKET = "offboard-cli"


@pytest.fixture
def moto_url() -> Iterator[str]:
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port)
    server.start()
    yield f"http://127.0.0.1:{port}"
    server.stop()


def _adapter_dir(path: Path) -> Path:
    path.mkdir(parents=True)
    (path / "adapter_model.safetensors").write_bytes(b"weights" * 100)
    (path / "adapter_config.json").write_text('{"r": 8}')
    (path / "manifest.json").write_text("{}")
    return path


def _cft(monkeypatch: pytest.MonkeyPatch, env: dict[str, str], *argv: str) -> int:
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    get_settings.cache_clear()
    try:
        return cli.main(list(argv))
    finally:
        get_settings.cache_clear()


def _keys(client: Any, prefix: str) -> list[str]:
    resp = client.list_objects_v2(Bucket=BUCKET, Prefix=prefix)
    return [o["Key"] for o in resp.get("Contents", [])]


def test_cft_tenant_delete_with_s3_store(
    conn: Any,
    db_url: str,
    moto_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    client = boto3.client(
        "s3",
        endpoint_url=moto_url,
        aws_access_key_id="k",
        aws_secret_access_key="s",
        region_name="us-east-1",
    )
    client.create_bucket(Bucket=BUCKET)
    store = S3Store(BUCKET, client)
    src = _adapter_dir(tmp_path / "adapter")
    gone = populate(conn, name="gone", store=store, adapter_dir=src, base_model="b")
    kept = populate(conn, name="kept", store=store, adapter_dir=src, base_model="b")
    kept_before = counts(conn, kept)
    assert kept_before["obs.inference_log partitions"] == 3  # two weekly partitions + DEFAULT
    assert all(v > 0 for k, v in counts(conn, gone).items() if k != "serve.adapter_deployment")
    # An engine still has gone's prod loaded and no reconciler runs: refused, nothing deleted.
    conn.execute(
        "INSERT INTO serve.adapter_deployment (adapter_id, engine_url, state)"
        " VALUES (%s, 'http://engine.invalid', 'loaded')",
        (gone["adapters"][0],),
    )
    env = {
        "CFT_DATABASE_URL": db_url,
        "CFT_HOME": str(tmp_path / "home"),
        "CFT_ARTEFACT_STORE": "s3",
        "CFT_S3_BUCKET": BUCKET,
        "CFT_S3_ACCESS_KEY_ID": "k",
        "CFT_S3_SECRET_ACCESS_KEY": "s",
        "AWS_MAX_ATTEMPTS": "1",
    }
    live = env | {"CFT_S3_ENDPOINT_URL": moto_url}
    assert (
        _cft(monkeypatch, live, "tenant", "delete", "gone", "--yes", "--unload-timeout", "0") == 2
    )
    err = capsys.readouterr().err
    assert "still loaded" in err and "http://engine.invalid" in err and "force" in err
    prepared = counts(conn, gone)
    assert prepared["tenant"] == 1 and prepared["obs.inference_log"] == 3
    row = conn.execute(
        "SELECT status, traffic_pct FROM serve.adapter WHERE id = %s", (gone["adapters"][0],)
    ).fetchone()
    assert row == {"status": "retired", "traffic_pct": 0}  # taken out of traffic first
    assert conn.execute(
        "SELECT count(*) AS n FROM auth.api_key WHERE tenant_id = %s AND revoked_at IS NULL",
        (gone["tenant"]["id"],),
    ).fetchone() == {"n": 0}

    # Forced, with the store unreachable: the rows go, the artefacts stay pending (exit 1).
    dead = env | {"CFT_S3_ENDPOINT_URL": f"http://127.0.0.1:{free_port()}"}
    assert _cft(monkeypatch, dead, "tenant", "delete", "gone", "--yes", "--force") == 1
    first = json.loads(capsys.readouterr().out)
    assert first["status"] == "artefacts" and first["forced"] is True
    assert sorted(first["artefacts"]["pending"]) == sorted(gone["uris"])
    assert first["artefacts"]["errors"]
    assert first["retired_adapters"] == [gone["adapters"][0]]
    assert all(v == 0 for v in counts(conn, gone).values()), counts(conn, gone)
    removed = first["counts"]
    assert removed["obs.inference_log"] == 3 and removed["train.dataset_example"] == 4
    assert removed["serve.adapter"] == 2 and removed["tenant"] == 1
    assert removed["obs.prompt_neighbour"] == 1 and removed["auth.api_key"] == 2
    assert len(_keys(client, "gone-route/")) == 6  # still there

    # Again, with the store back: finished; another run reports the same, done.
    assert _cft(monkeypatch, live, "tenant", "delete", "gone", "--yes") == 0
    second = json.loads(capsys.readouterr().out)
    assert second["status"] == "done" and second["id"] == first["id"]
    assert second["artefacts"]["pending"] == []
    assert sorted(second["artefacts"]["deleted"]) == sorted(gone["uris"])
    assert _keys(client, "gone-route/") == []
    assert _cft(monkeypatch, live, "tenant", "delete", "gone", "--yes") == 0
    assert json.loads(capsys.readouterr().out)["counts"] == removed

    # The other tenant: every row and artefact where it was.
    assert counts(conn, kept) == kept_before
    assert len(_keys(client, "kept-route/")) == 6
    audit = conn.execute(
        "SELECT * FROM auth.tenant_offboarding WHERE tenant_name = 'gone'"
    ).fetchone()
    assert audit["status"] == "done" and audit["requested_by"].startswith("cli ")
    assert audit["finished_at"] >= audit["data_deleted_at"] >= audit["started_at"]

    assert _cft(monkeypatch, live, "tenant", "delete", "nobody", "--yes") == 2
    assert "no tenant 'nobody'" in capsys.readouterr().err


def test_cft_operator_key_and_tenant_consent(
    conn: Any,
    db_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    env = {"CFT_DATABASE_URL": db_url, "CFT_HOME": str(tmp_path)}
    assert _cft(monkeypatch, env, "operator", "key", "create", "--name", "alice") == 0
    key = capsys.readouterr().out.strip()
    row = conn.execute(
        "SELECT role, tenant_id, name, key_hash FROM auth.api_key WHERE prefix = %s", (key[:12],)
    ).fetchone()
    assert row["role"] == "operator" and row["tenant_id"] is None and row["name"] == "alice"
    assert bytes(row["key_hash"]) == hashlib.sha256(key.encode()).digest()
    assert _cft(monkeypatch, env, "operator", "key", "list") == 0
    assert key[:12] in capsys.readouterr().out
    assert _cft(monkeypatch, env, "tenant", "create", "acme") == 0
    assert _cft(monkeypatch, env, "tenant", "consent", "acme", "on") == 0
    assert "consent_training=True" in capsys.readouterr().out
    assert conn.execute("SELECT consent_training FROM tenant WHERE name = 'acme'").fetchone() == {
        "consent_training": True
    }
    # A tenant key cannot be made with the operator role.
    with pytest.raises(SystemExit):
        _cft(monkeypatch, env, "key", "create", "--tenant", "acme", "--role", "operator")
    assert _cft(monkeypatch, env, "operator", "key", "revoke", key[:12]) == 0
    assert conn.execute(
        "SELECT revoked_at IS NOT NULL AS r FROM auth.api_key WHERE prefix = %s", (key[:12],)
    ).fetchone() == {"r": True}
