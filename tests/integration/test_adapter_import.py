"""Adapters trained elsewhere, over real HTTP and the real CLI: an adapter written by PEFT
directly is imported (POST /v1/adapters), gated, canaried, promoted, served by the router through
a real engine and rolled back; every bad upload is a 4xx naming the problem with nothing stored;
and the round trip: a snapshot exported by `cft dataset export`, trained with TRL's SFTTrainer
outside cft, imported by `cft adapter import`, scored by the real evaluator, served."""

from __future__ import annotations

import io
import json
import os
import shutil
import tarfile
import tempfile
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from psycopg.rows import dict_row

from app.core import basemodels
from app.core.artefacts import CONFIG_FILE, WEIGHTS_FILE, sha256_file
from app.core.auth import create_key
from app.core.config import Settings, get_settings
from cft import cli
from cft.engine.core import Engine
from cft.engine.server import create_app as create_engine_app
from cft.serve import create_app
from tests.support import db as testdb
from tests.support import s3
from tests.support.factories import make_route, make_tenant
from tests.support.lora import make_adapter_dir
from tests.support.servers import serve_app
from tests.support.stack import wait_until
from tests.support.training import make_snapshot, tiny_llama

pytestmark = pytest.mark.slow
BASE = basemodels.BUNDLED
ROOT = Path(__file__).resolve().parents[2]
# Above the PEFT adapters here (r=8 on q/k/v/o, float32: 3.7 MB), below what the
# oversize cases send.
MAX_IMPORT = 6 * 1024 * 1024


@dataclass
class World:
    api: str
    db_url: str
    settings: Settings
    route: str
    tenant: dict[str, Any]
    keys: dict[str, dict[str, str]]
    other_key: dict[str, str]
    adapters: list[Path]

    def owner(self) -> psycopg.Connection[dict[str, Any]]:
        return psycopg.connect(self.db_url, autocommit=True, row_factory=dict_row)

    def upload(
        self, data: bytes, name: str = "adapter.tar.gz", key: str = "trainer", **fields: str
    ) -> httpx.Response:
        form = {"route": self.route, "method": "sft"} | fields
        headers = self.other_key if key == "other" else self.keys[key]
        return httpx.post(
            f"{self.api}/v1/adapters",
            headers=headers,
            data=form,
            files={"file": (name, data, "application/octet-stream")},
            timeout=60,
        )

    def post(self, path: str, key: str, body: Any = None) -> httpx.Response:
        return httpx.post(f"{self.api}{path}", headers=self.keys[key], json=body, timeout=30)

    def call(self, route: str | None = None) -> httpx.Response:
        body = {"model": route or self.route, "prompt": "Hi", "max_tokens": 2, "user": "u1"}
        return httpx.post(
            f"{self.api}/v1/completions", json=body, headers=self.keys["client"], timeout=120
        )

    def stored(self) -> list[str]:
        root = self.settings.artefact_path
        return sorted(str(p.relative_to(root)) for p in root.rglob("*")) if root.exists() else []

    def state(self) -> tuple[Any, ...]:
        """What a refused import must leave as it was: rows, audit, the store, temp dirs."""
        with self.owner() as c:
            rows = c.execute(
                "SELECT (SELECT count(*) FROM serve.adapter) AS a,"
                " (SELECT count(*) FROM serve.adapter_event) AS e"
            ).fetchone()
        temps = sorted(Path(tempfile.gettempdir()).glob("cft-import-*"))
        return rows["a"], rows["e"], self.stored(), temps


def tar_gz(folder: Path, root: str = "my-adapter", extra: Callable[[Any], None] | None = None):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        tar.add(folder, arcname=root)
        if extra:
            extra(tar)
    return buf.getvalue()


def zip_of(folder: Path, extra: Callable[[zipfile.ZipFile], None] | None = None) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        for p in sorted(folder.iterdir()):
            z.write(p, p.name)
        if extra:
            extra(z)
    return buf.getvalue()


@pytest.fixture(scope="module")
def peft_adapters(models_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """Two adapters written by PEFT directly (LoraConfig + get_peft_model + save_pretrained)."""
    root = tmp_path_factory.mktemp("peft")
    return [make_adapter_dir(models_dir, root / f"a{i}", seed=20 + i) for i in range(2)]


@pytest.fixture(scope="module")
def world(
    pg_server: str,
    template_url: str,
    models_dir: Path,
    peft_adapters: list[Path],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[World]:
    url = testdb.clone(pg_server)
    tmp = tmp_path_factory.mktemp("import-home")
    with psycopg.connect(url, autocommit=True, row_factory=dict_row) as c:
        t, other = make_tenant(c), make_tenant(c)
        route = make_route(c, tenant_id=t["id"], base_model=BASE)["name"]
        make_route(c, tenant_id=other["id"], base_model=BASE)
        # The route's rule trusts the release role's scores (recorded over REST below).
        c.execute(
            "INSERT INTO train.promotion_policy (tenant_id, route, suite_id, metric, direction,"
            " trusted_authors) VALUES (%s, %s, 'tasks', 'accuracy', 'higher',"
            " '{evaluator,release,owner}')",
            (t["id"], route),
        )
        keys = {
            role: {"Authorization": f"Bearer {create_key(c, tenant_id=t['id'], role=role)}"}
            for role in ("trainer", "release", "reader", "client")
        }
        other_key = {
            "Authorization": f"Bearer {create_key(c, tenant_id=other['id'], role='trainer')}"
        }
    settings = Settings(
        home=ROOT / ".cft",  # the converted base: the import checks shapes against its config
        artefact_dir=tmp / "artefacts",
        serving_dir=tmp / "serving",
        reconcile_interval=0.2,
        router_load_wait=10,
        adapter_import_max_bytes=MAX_IMPORT,
        user_hash_secret=get_settings().user_hash_secret,
    )
    eng = Engine(BASE, models_dir, max_loras=4)
    try:
        with (
            serve_app(create_engine_app(eng), ready_path="/health") as engine_url,
            serve_app(create_app(settings, db_url=url, engine_urls=[engine_url])) as api,
        ):
            yield World(api, url, settings, route, t, keys, other_key, peft_adapters)
    finally:
        eng.close()
        testdb.drop(pg_server, url)


def _record(world: World, adapter: str, accuracy: float) -> None:
    body = {"results": [{"suite_id": "tasks", "metric": "accuracy", "score": accuracy}]}
    resp = world.post(f"/v1/adapters/{adapter}/eval-results", "release", body)
    assert resp.status_code == 200, resp.text


def _serves(world: World, adapter: str) -> None:
    wait_until(lambda: world.call().headers.get("x-cft-adapter") == adapter, f"{adapter} served")


def test_peft_adapter_imported_gated_promoted_served_and_rolled_back(world: World) -> None:
    first = world.upload(tar_gz(world.adapters[0]))
    assert first.status_code == 201, first.text
    a = first.json()
    assert (a["status"], a["source"], a["method"], a["base_model"]) == (
        "candidate",
        "imported",
        "sft",
        BASE,
    )
    # What cft's trainer records: the weights' sha256, the base's revision, a verified artefact.
    assert a["sha256"] == sha256_file(world.adapters[0] / WEIGHTS_FILE)
    assert a["base_revision"] == basemodels.revision(BASE, world.settings.models_path)
    assert a["training_run_id"] is None and a["import_detail"]["imported_by"].startswith("key=")
    assert a["import_detail"]["origin"].startswith("upload adapter.tar.gz (sha256 ")
    stored = Path(a["weights_uri"].removeprefix("file://"))
    assert sorted(p.name for p in stored.iterdir()) == [CONFIG_FILE, WEIGHTS_FILE, "manifest.json"]
    manifest = json.loads((stored / "manifest.json").read_text())
    assert manifest["source"] == "imported" and manifest["hyperparameters"]["rank"] == 8

    # No eval results: the gate refuses; with them, the first prod.
    refused = world.post(f"/v1/adapters/{a['id']}/promote", "release")
    assert refused.status_code == 409 and "no eval results" in refused.text
    _record(world, a["id"], 0.5)
    assert world.post(f"/v1/adapters/{a['id']}/promote", "release").status_code == 200
    _serves(world, a["id"])

    # A second import, as a zip: a regression is refused; a better one goes canary, then prod.
    second = world.upload(zip_of(world.adapters[1]), name="adapter.zip")
    assert second.status_code == 201, second.text
    b = second.json()["id"]
    assert b != a["id"]
    _record(world, b, 0.3)
    worse = world.post(f"/v1/adapters/{b}/promote", "release")
    assert worse.status_code == 409 and "regression" in worse.text
    _record(world, b, 0.9)
    canary = world.post(f"/v1/adapters/{b}/canary", "release", {"traffic_pct": 10})
    assert canary.status_code == 200 and canary.json()["status"] == "canary", canary.text
    promoted = world.post(f"/v1/adapters/{b}/promote", "release", {"reason": "imported, better"})
    assert promoted.status_code == 200, promoted.text
    assert promoted.json()["previous_prod_id"] == a["id"]
    _serves(world, b)

    restored = world.post(f"/v1/adapters/{b}/rollback", "release", {"reason": "test rollback"})
    assert restored.status_code == 200 and restored.json()["id"] == a["id"], restored.text
    _serves(world, a["id"])
    with world.owner() as c:
        events = c.execute(
            "SELECT new_status, reason FROM serve.adapter_event WHERE adapter_id = %s ORDER BY id",
            (b,),
        ).fetchall()
    assert events[0]["new_status"] == "candidate" and events[0]["reason"].startswith("imported: ")
    assert [e["new_status"] for e in events[1:]] == ["canary", "prod", "retired"]


def _copy(src: Path, tmp: Path) -> Path:
    return Path(shutil.copytree(src, tmp / "adapter"))


def _config(folder: Path, **fields: Any) -> Path:
    cfg = json.loads((folder / CONFIG_FILE).read_text()) | fields
    (folder / CONFIG_FILE).write_text(json.dumps(cfg))
    return folder


def _drop_tensors(folder: Path, keep: Callable[[str], bool]) -> Path:
    from safetensors.torch import load_file, save_file

    tensors = load_file(folder / WEIGHTS_FILE)
    save_file({k: v for k, v in tensors.items() if keep(k)}, folder / WEIGHTS_FILE)
    return folder


def _tiny_base_adapter(tmp: Path) -> Path:
    """A PEFT adapter of another (tiny) Llama, whose config names the route's base."""
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(tiny_llama(), LoraConfig(r=8, target_modules=["q_proj", "v_proj"]))
    model.save_pretrained(tmp / "tiny")
    return _config(tmp / "tiny", base_model_name_or_path=BASE)


def _member(name: str, kind: bytes, data: bytes = b"", link: str = "") -> Callable[[Any], None]:
    def add(tar: Any) -> None:
        info = tarfile.TarInfo(name)
        info.type, info.size, info.linkname = kind, len(data), link
        tar.addfile(info, io.BytesIO(data) if data else None)

    return add


def _zip_entry(name: str, data: bytes) -> Callable[[zipfile.ZipFile], None]:
    return lambda z: z.writestr(name, data)


# (upload builder (good adapter folder, tmp) -> (bytes, form fields, key), status, code, words)
CASES: dict[
    str, tuple[Callable[[Path, Path], tuple[bytes, dict[str, str], str]], int, str, str]
] = {
    "declared base is another model": (
        lambda a, t: (
            tar_gz(_config(_copy(a, t), base_model_name_or_path="meta-llama/Llama-3.1-8B")),
            {},
            "trainer",
        ),
        422,
        "base_mismatch",
        "trained on 'meta-llama/Llama-3.1-8B', but the route serves",
    ),
    "weights of another base": (
        lambda a, t: (tar_gz(_tiny_base_adapter(t)), {}, "trainer"),
        422,
        "base_mismatch",
        "do not fit the base model",
    ),
    "base_model field not the route's": (
        lambda a, t: (tar_gz(a), {"base_model": "llama-3.1-8b"}, "trainer"),
        422,
        "base_mismatch",
        "not 'llama-3.1-8b'",
    ),
    "DoRA": (
        lambda a, t: (tar_gz(_config(_copy(a, t), use_dora=True)), {}, "trainer"),
        422,
        "adapter_not_loadable",
        "does not yet support DoRA",
    ),
    "rank above the engine's": (
        lambda a, t: (tar_gz(_config(_copy(a, t), r=32)), {}, "trainer"),
        422,
        "adapter_not_loadable",
        "LoRA rank 32 is greater than max_lora_rank 16",
    ),
    "a missing lora_B": (
        lambda a, t: (
            tar_gz(
                _drop_tensors(_copy(a, t), lambda k: "layers.3.self_attn.v_proj.lora_B" not in k)
            ),
            {},
            "trainer",
        ),
        422,
        "adapter_not_loadable",
        "layers.3.self_attn.v_proj: lora_B.weight is missing",
    ),
    "a module missing in one layer": (
        lambda a, t: (
            tar_gz(_drop_tensors(_copy(a, t), lambda k: "layers.5.self_attn.k_proj" not in k)),
            {},
            "trainer",
        ),
        422,
        "adapter_not_loadable",
        "lacks the weights of target modules adapter_config.json names: layer 5 k_proj",
    ),
    "pickled weights only": (
        lambda a, t: (
            tar_gz(_rename(_copy(a, t), WEIGHTS_FILE, "adapter_model.bin")),
            {},
            "trainer",
        ),
        422,
        "bad_adapter",
        "adapter_model.bin is a pickle",
    ),
    "zip-slip path": (
        lambda a, t: (zip_of(a, _zip_entry("../../evil.txt", b"x")), {}, "trainer"),
        422,
        "unsafe_archive",
        "escapes the archive",
    ),
    "absolute path": (
        lambda a, t: (
            tar_gz(a, extra=_member("/tmp/evil.txt", tarfile.REGTYPE, b"x")),
            {},
            "trainer",
        ),
        422,
        "unsafe_archive",
        "has an absolute path",
    ),
    "symlink": (
        lambda a, t: (
            tar_gz(a, extra=_member("my-adapter/link", tarfile.SYMTYPE, link="/etc/passwd")),
            {},
            "trainer",
        ),
        422,
        "unsafe_archive",
        "is a link",
    ),
    "device file": (
        lambda a, t: (tar_gz(a, extra=_member("my-adapter/dev", tarfile.CHRTYPE)), {}, "trainer"),
        422,
        "unsafe_archive",
        "is a device",
    ),
    "zip bomb": (
        lambda a, t: (zip_of(a, _zip_entry("zeros.bin", bytes(MAX_IMPORT + 1))), {}, "trainer"),
        413,
        "adapter_too_large",
        "unpacks to more than",
    ),
    "oversize upload": (
        lambda a, t: (os.urandom(MAX_IMPORT + 1), {}, "trainer"),
        413,
        "payload_too_large",
        "CFT_ADAPTER_IMPORT_MAX_BYTES",
    ),
    "not an archive": (
        lambda a, t: (b"this is not an archive", {}, "trainer"),
        400,
        "invalid_archive",
        "not a readable",
    ),
    "another tenant's route": (
        lambda a, t: (tar_gz(a), {}, "other"),
        404,
        "route_not_found",
        "not found",
    ),
}


def _rename(folder: Path, old: str, new: str) -> Path:
    (folder / old).rename(folder / new)
    return folder


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_upload_is_a_4xx_naming_the_problem_and_stores_nothing(
    world: World, tmp_path: Path, case: str
) -> None:
    build, status, code, words = CASES[case]
    data, fields, key = build(world.adapters[0], tmp_path)
    before = world.state()
    resp = world.upload(data, key=key, **fields)
    assert resp.status_code == status, resp.text
    error = resp.json()["error"]
    assert error["code"] == code and words in error["message"], error
    assert world.state() == before


def test_round_trip_export_train_with_trl_import_with_the_cli_evaluate_serve(
    world: World, models_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from datasets import load_dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import SFTConfig, SFTTrainer

    from workers.evaluator import worker as evaluator

    with world.owner() as c:
        route = make_route(c, tenant_id=world.tenant["id"], base_model=BASE)["name"]
        train = [
            {"messages": [{"role": "user", "content": f"Greet {n}."},
                          {"role": "assistant", "content": f"Dear customer {n}, hello."}]}
            for n in ("Ana", "Ben", "Cy", "Di")
        ]  # fmt: skip
        snap = make_snapshot(
            c, tenant_id=world.tenant["id"], route=route, method="sft", train=train, eval=train[:1]
        )
    env = {
        "CFT_DATABASE_URL": world.db_url,
        "CFT_HOME": str(ROOT / ".cft"),
        "CFT_ARTEFACT_DIR": str(world.settings.artefact_path),
    }
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    get_settings.cache_clear()
    try:
        data = tmp_path / "data"
        assert (
            cli.main(["dataset", "export", str(snap["id"]), "--format", "parquet", "-o", str(data)])
            == 0
        )
        ds = load_dataset(str(data))
        assert (ds["train"].num_rows, ds["eval"].num_rows) == (4, 1)

        base = basemodels.local_dir(BASE, models_dir)
        tok = AutoTokenizer.from_pretrained(base)
        trainer = SFTTrainer(
            model=AutoModelForCausalLM.from_pretrained(base),
            args=SFTConfig(
                output_dir=str(tmp_path / "run"),
                max_steps=2,
                per_device_train_batch_size=2,
                max_length=32,
                learning_rate=1e-3,
                report_to=[],
                save_strategy="no",
                use_cpu=True,
            ),
            train_dataset=ds["train"],
            processing_class=tok,
            peft_config=LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"]),
        )
        trainer.train()
        trainer.save_model(str(tmp_path / "trained"))  # also tokenizer files: not imported

        argv = ["adapter", "import", str(tmp_path / "trained"), "--route", route]
        argv += [
            "--method",
            "sft",
            "--snapshot",
            str(snap["id"]),
            "--metadata",
            '{"trainer": "trl"}',
        ]
        assert cli.main(argv) == 0
    finally:
        get_settings.cache_clear()
    with world.owner() as c:
        row = c.execute("SELECT * FROM serve.adapter WHERE route = %s", (route,)).fetchone()
        assert (row["status"], row["source"], row["dataset_snapshot_id"]) == (
            "candidate",
            "imported",
            snap["id"],
        )
        assert row["import_detail"]["metadata"] == {"trainer": "trl"}
        assert row["import_detail"]["imported_by"] == "cli"
    # The evaluator scores it as it scores cft's own: the snapshot's held-out loss, which the
    # default global rule requires.
    ev = evaluator.Evaluator(
        evaluator.EvalConfig(db_url=world.db_url, models_dir=models_dir, settings=world.settings)
    )
    with evaluator.connect(world.db_url, ev.cfg.worker_id) as c:
        summary = ev.evaluate(c, row["id"])
    assert f"heldout:{snap['id']}" in summary["results"]["candidate"]
    promoted = world.post(f"/v1/adapters/{row['id']}/promote", "release")
    assert promoted.status_code == 200, promoted.text
    wait_until(
        lambda: world.call(route).headers.get("x-cft-adapter") == row["id"], "the TRL adapter"
    )


def test_chunked_upload_over_the_limit_is_413_and_stores_nothing(world: World) -> None:
    boundary = "cft-test-boundary"
    head = (
        f'--{boundary}\r\nContent-Disposition: form-data; name="route"\r\n\r\n{world.route}\r\n'
        f'--{boundary}\r\nContent-Disposition: form-data; name="method"\r\n\r\nsft\r\n'
        f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="a.tar.gz"\r\n'
        "Content-Type: application/gzip\r\n\r\n"
    ).encode()
    before = world.state()
    chunk = b"\0" * (1 << 20)
    body = iter(
        [head, *[chunk] * (MAX_IMPORT // len(chunk) + 1), f"\r\n--{boundary}--\r\n".encode()]
    )
    resp = httpx.post(
        f"{world.api}/v1/adapters",
        content=body,
        headers=world.keys["trainer"]
        | {"Content-Type": f"multipart/form-data; boundary={boundary}"},
        timeout=60,
    )
    assert resp.status_code == 413, resp.text
    assert resp.json()["error"]["code"] == "payload_too_large"
    assert world.state() == before


def test_cli_imports_an_s3_prefix_and_refuses_an_empty_one(
    world: World, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    with world.owner() as c:
        route = make_route(c, tenant_id=world.tenant["id"], base_model=BASE)["name"]
    with s3.moto_server() as endpoint:
        bucket = s3.client(endpoint)
        bucket.create_bucket(Bucket="team-models")
        for path in world.adapters[1].iterdir():  # with PEFT's README.md, left out
            bucket.upload_file(str(path), "team-models", f"run-42/final/{path.name}")
        env = s3.settings_env(endpoint) | {
            "CFT_DATABASE_URL": world.db_url,
            "CFT_HOME": str(ROOT / ".cft"),
            "CFT_ARTEFACT_DIR": str(world.settings.artefact_path),
        }
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        get_settings.cache_clear()
        try:
            argv = ["adapter", "import", "--route", route, "--method", "dpo"]
            before = world.state()
            assert cli.main([*argv, "s3://team-models/run-41/"]) == 1
            assert "nothing is stored under s3://team-models/run-41/" in capsys.readouterr().err
            assert world.state() == before
            assert cli.main([*argv, "s3://team-models/run-42/final"]) == 0
        finally:
            get_settings.cache_clear()
    with world.owner() as c:
        row = c.execute("SELECT * FROM serve.adapter WHERE route = %s", (route,)).fetchone()
    assert (row["method"], row["source"]) == ("dpo", "imported")
    assert row["import_detail"]["origin"] == "s3://team-models/run-42/final"
    assert row["sha256"] == sha256_file(world.adapters[1] / WEIGHTS_FILE)
