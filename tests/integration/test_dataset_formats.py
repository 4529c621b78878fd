"""Snapshot exports in the formats other trainers read, over REST and the CLI: each format of
each method loads with `datasets` (Parquet too, as a folder) in the shape its trainer reads, and
a format that does not fit the snapshot is a 400 naming the ones that do."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from psycopg.rows import dict_row

from app.core.auth import create_key
from app.core.config import Settings, get_settings
from app.datasets import formats
from app.main import create_app
from cft import cli
from tests.support import db as testdb
from tests.support.factories import make_route, make_tenant
from tests.support.servers import serve_app
from tests.support.training import examples, make_snapshot

# An SFT example whose prompt has a name, a content-parts list and a key OpenAI does not take.
RICH = {
    "messages": [
        {"role": "system", "content": "Be brief.", "refusal": None},
        {"role": "user", "name": "ana", "content": [{"type": "text", "text": "Hi "}, {"type": "text", "text": "there"}]},
        {"role": "assistant", "content": "Hello."},
    ]
}  # fmt: skip


@pytest.fixture(scope="module")
def world(
    pg_server: str, template_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Any]]:
    url = testdb.clone(pg_server)
    with psycopg.connect(url, autocommit=True, row_factory=dict_row) as c:
        t, other = make_tenant(c), make_tenant(c)
        route = make_route(c, tenant_id=t["id"])["name"]
        snaps = {
            m: make_snapshot(c, tenant_id=t["id"], route=route, method=m, eval=examples(m, 2)[1:])[
                "id"
            ]
            for m in ("sft", "dpo", "kto")
        }
        snaps["rich"] = make_snapshot(
            c, tenant_id=t["id"], route=route, method="sft", train=[RICH]
        )["id"]
        key = create_key(c, tenant_id=t["id"], role="reader")
        trainer = create_key(c, tenant_id=t["id"], role="trainer")
        other_key = create_key(c, tenant_id=other["id"], role="reader")
    home = tmp_path_factory.mktemp("formats-home")
    with serve_app(create_app(Settings(home=home), db_url=url, engine_urls=[])) as api:
        yield {
            "api": api,
            "url": url,
            "snaps": snaps,
            "key": {"Authorization": f"Bearer {key}"},
            "trainer": {"Authorization": f"Bearer {trainer}"},
            "other": {"Authorization": f"Bearer {other_key}"},
        }
    testdb.drop(pg_server, url)


def _cft(*argv: Any) -> int:
    return cli.main([str(a) for a in argv])


def _export(world: dict[str, Any], snap: str, fmt: str, split: str = "train", key: str = "key"):
    return httpx.get(
        f"{world['api']}/v1/datasets/snapshots/{world['snaps'][snap]}/export",
        params={"format": fmt, "split": split},
        headers=world[key],
        timeout=30,
    )


def _rows(resp: httpx.Response) -> list[dict[str, Any]]:
    assert resp.status_code == 200, resp.text
    assert resp.headers["content-type"].startswith(formats.JSONL_MEDIA_TYPE)
    return [json.loads(line) for line in resp.text.splitlines()]


def _assistant(turns: list[dict[str, Any]]) -> bool:
    return len(turns) == 1 and turns[0]["role"] == "assistant" and bool(turns[0]["content"])


# The shape each format's trainer reads, per line.
SHAPES = {
    "trl-conversational": lambda r: set(r) == {"messages"} and r["messages"][-1]["role"] == "assistant",
    "trl-preference": lambda r: set(r) == {"prompt", "chosen", "rejected"}
    and _assistant(r["chosen"]) and _assistant(r["rejected"]),
    "trl-unpaired-preference": lambda r: set(r) == {"prompt", "completion", "label"}
    and _assistant(r["completion"]) and isinstance(r["label"], bool),
    "openai-chat": lambda r: set(r) == {"messages"}
    and all(set(m) <= {"role", "content", "name"} for m in r["messages"])
    and r["messages"][-1]["role"] == "assistant",
    "openai-preference": lambda r: set(r) == {"input", "preferred_output", "non_preferred_output"}
    and r["input"]["messages"][-1]["role"] == "user"
    and _assistant(r["preferred_output"]) and _assistant(r["non_preferred_output"]),
}  # fmt: skip


@pytest.mark.parametrize("method", ["sft", "dpo", "kto"])
def test_every_fitting_format_loads_in_its_trainers_shape(
    world: dict[str, Any], tmp_path: Path, method: str
) -> None:
    import pyarrow.parquet as pq
    from datasets import load_dataset

    stored = _rows(_export(world, method, "cft"))
    assert len(stored) == 4
    fitting = formats.formats_for(method)
    assert "cft" in fitting and "parquet" in fitting
    assert len(fitting) == (3 if method == "kto" else 4)  # OpenAI has no unpaired format
    for fmt in fitting:
        if fmt in ("cft", "parquet"):
            continue
        rows = _rows(_export(world, method, fmt))
        assert len(rows) == len(stored) and all(SHAPES[fmt](r) for r in rows), (fmt, rows[0])
        path = tmp_path / f"{fmt}.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        assert load_dataset("json", data_files=str(path), split="train").num_rows == 4
        if fmt.startswith("trl-"):  # TRL's formats are what cft stores
            assert rows == stored
        if fmt.startswith("openai-"):  # a file cft's OpenAI fine-tuning API takes as it is
            resp = httpx.post(
                f"{world['api']}/v1/files",
                headers=world["trainer"],
                data={"purpose": "fine-tune"},
                files={"file": (path.name, path.read_bytes())},
                timeout=30,
            )
            assert resp.status_code == 200 and resp.json()["status"] == "processed", resp.text
    resp = _export(world, method, "parquet", split="eval")
    assert resp.status_code == 200 and resp.headers["content-type"] == formats.PARQUET_MEDIA_TYPE
    table = pq.read_table(io.BytesIO(resp.content))
    assert table.num_rows == 1 and set(table.column_names) == set(stored[0])


@pytest.mark.parametrize(
    ("snap", "fmt", "fits"),
    [
        ("sft", "openai-preference", "cft, trl-conversational, openai-chat, parquet"),
        ("kto", "trl-preference", "cft, trl-unpaired-preference, parquet"),
        ("dpo", "openai-chat", "cft, trl-preference, openai-preference, parquet"),
    ],
)
def test_a_format_that_does_not_fit_is_a_400_naming_those_that_do(
    world: dict[str, Any], snap: str, fmt: str, fits: str
) -> None:
    resp = _export(world, snap, fmt)
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert error["code"] == "format_mismatch" and error["message"].endswith(fits), error


def test_openai_and_parquet_exports_of_rich_messages_and_another_tenants_snapshot(
    world: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from datasets import load_dataset

    (line,) = _rows(_export(world, "rich", "openai-chat"))
    # OpenAI's keys only; the content parts are kept as OpenAI accepts them.
    assert line["messages"][0] == {"role": "system", "content": "Be brief."}
    assert line["messages"][1] == RICH["messages"][1]
    assert _export(world, "sft", "cft", key="other").status_code == 404

    # The CLI: a Parquet folder `datasets` loads with its splits by name (text parts joined);
    # another snapshot exported into the same folder loads as itself, not from datasets' cache.
    # Then JSONL in a format, to a file.
    monkeypatch.setenv("CFT_DATABASE_URL", world["url"])
    get_settings.cache_clear()
    snaps = world["snaps"]
    try:
        out = tmp_path / "data"
        assert _cft("dataset", "export", snaps["rich"], "--format", "parquet", "-o", out) == 0
        ds = load_dataset(str(out))
        assert list(ds) == ["train"] and ds["train"][0]["messages"][1]["content"] == "Hi there"
        assert _cft("dataset", "export", snaps["dpo"], "--format", "parquet", "-o", out) == 0
        ds = load_dataset(str(out))
        assert {s: ds[s].num_rows for s in ds} == {"train": 4, "eval": 1}
        assert set(ds["train"].column_names) == {"prompt", "chosen", "rejected"}
        path = tmp_path / "kto.jsonl"
        kto = ("dataset", "export", snaps["kto"], "--format", "trl-unpaired-preference")
        assert _cft(*kto, "--split", "eval", "-o", path) == 0
        assert [json.loads(x)["label"] for x in path.read_text().splitlines()] == [True]
        assert _cft("dataset", "export", snaps["kto"], "--format", "openai-chat") == 2
    finally:
        get_settings.cache_clear()
