"""The OpenAI fine-tuning API served by cft, driven by the official SDKs end to end.

One real stack per module: PostgreSQL, the API (cft.serve's app: router and reconciler) in front
of the local CPU engine, and a real trainer (TRL + PEFT on SmolLM2-135M, two steps; the NF4 base
is the process-wide one other trainer tests load) that takes each queued run when a test asks. The Python SDK and the Node SDK each upload a file, create a
job, poll it and its events until it succeeded, list its checkpoints and chat with the
fine-tuned model through the router (loaded on demand), and cancel a second job; every
response is checked against the SDK's own types, with no field missing or added.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import psycopg
import pytest
from openai.types import FileDeleted, FileObject
from openai.types.fine_tuning import FineTuningJob, FineTuningJobEvent
from openai.types.fine_tuning.jobs import FineTuningJobCheckpoint
from psycopg.rows import dict_row

from app.core.artefacts import LocalStore
from app.core.auth import create_key
from app.core.config import Settings
from app.loop.method import hyperparameters as loop_settings
from cft.engine.core import Engine
from cft.engine.server import create_app as create_engine_app
from cft.serve import create_app
from tests.support import db as testdb
from tests.support.factories import make_route, make_tenant
from tests.support.servers import serve_app
from workers import base_model
from workers.trainer.worker import Worker, WorkerConfig

pytestmark = pytest.mark.slow
BASE = base_model.BUNDLED
NODE_DIR = Path(__file__).resolve().parents[1] / "node"
FILE_MAX = 64 * 1024


def chat_line(i: int, **extra: Any) -> dict[str, Any]:
    return {
        "messages": [
            {"role": "system", "content": "Answer with the sum."},
            {"role": "user", "content": f"What is {i} plus {i}?"},
            {"role": "assistant", "content": f"{2 * i}."},
        ]
    } | extra


def jsonl(rows: list[Any]) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


TRAIN = jsonl([chat_line(i) for i in range(1, 5)])
VALID = jsonl([chat_line(5)])


def strict(model: Any, body: dict[str, Any]) -> Any:
    """The body parsed by the SDK's type, which names exactly the body's fields."""
    assert set(body) == set(model.model_fields), (model.__name__, sorted(body))
    return model.model_validate(body)


class Stack:
    """The module's servers, tenants, keys and trainer."""

    def __init__(self, **kw: Any) -> None:
        self.__dict__.update(kw)

    def sdk(self, key: str) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.api + "/v1", api_key=key, max_retries=0, timeout=120)

    def train_next(self) -> threading.Thread:
        """Train the next queued run in the background (as one trainer worker would)."""

        def run() -> None:
            deadline = time.monotonic() + 240
            while time.monotonic() < deadline and not self.worker.run_once():
                time.sleep(0.2)

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        return thread

    def count(self, sql: str, *args: Any) -> int:
        with psycopg.connect(self.db_url, autocommit=True) as c:
            row = c.execute(sql, args).fetchone()
        assert row is not None
        return int(row[0])


@pytest.fixture(scope="module")
def stack(
    pg_server: str, template_url: str, models_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    url = testdb.clone(pg_server)
    home = tmp_path_factory.mktemp("ft-home")
    with psycopg.connect(url, autocommit=True, row_factory=dict_row) as c:
        a, b = make_tenant(c), make_tenant(c)
        route = make_route(c, tenant_id=a["id"], name="support", base_model=BASE)
        make_route(c, tenant_id=b["id"], name="support", base_model=BASE)
        keys = {r: create_key(c, tenant_id=a["id"], role=r) for r in ("trainer", "client")}
        keys |= {f"b-{r}": create_key(c, tenant_id=b["id"], role=r) for r in ("trainer", "client")}
    settings = Settings(
        home=home,
        artefact_dir=home / "artefacts",
        serving_dir=home / "serving",
        file_max_bytes=FILE_MAX,
        reconcile_interval=0.5,
        router_load_wait=60,
    )
    worker = Worker(
        WorkerConfig(
            db_url=url,
            models_dir=models_dir,
            store=LocalStore(settings.artefact_path),
            lease_s=60,
        )
    )
    eng = Engine(BASE, models_dir, max_loras=2)
    try:
        with (
            serve_app(create_engine_app(eng), ready_path="/health") as engine_url,
            serve_app(create_app(settings, db_url=url, engine_urls=[engine_url])) as api,
        ):
            yield Stack(
                api=api, db_url=url, keys=keys, route=route, tenant=a, worker=worker, home=home
            )
    finally:
        eng.close()
        testdb.drop(pg_server, url)


def test_python_sdk_fine_tunes_to_a_served_model(stack: Stack, tmp_path: Path) -> None:
    trainer, client = stack.sdk(stack.keys["trainer"]), stack.sdk(stack.keys["client"])
    raw = trainer.files.with_raw_response.create(file=("sums.jsonl", TRAIN), purpose="fine-tune")
    file = strict(FileObject, raw.http_response.json())
    assert (file.bytes, file.filename, file.purpose) == (len(TRAIN), "sums.jsonl", "fine-tune")
    assert strict(FileObject, trainer.files.retrieve(file.id).model_dump()).id == file.id
    assert trainer.files.content(file.id).read() == TRAIN
    valid = trainer.files.create(file=("held-out.jsonl", VALID), purpose="fine-tune")
    assert [f.id for f in trainer.files.list(purpose="fine-tune")] == [valid.id, file.id]

    raw_job = trainer.fine_tuning.jobs.with_raw_response.create(
        model="support",
        training_file=file.id,
        validation_file=valid.id,
        suffix="sums",
        seed=3,
        method={
            "type": "supervised",
            "supervised": {"hyperparameters": {"n_epochs": 1, "batch_size": 2}},
        },
        metadata={"team": "ml"},
    )
    job = strict(FineTuningJob, raw_job.http_response.json())
    assert job.status == "queued" and job.fine_tuned_model is None and job.seed == 3
    assert job.hyperparameters.n_epochs == 1 and job.hyperparameters.batch_size == 2
    assert job.organization_id == stack.tenant["name"] and job.metadata == {"team": "ml"}
    assert job.method is not None and job.method.type == "supervised"

    trained = stack.train_next()
    deadline = time.monotonic() + 240
    while job.status not in ("succeeded", "failed", "cancelled"):
        assert time.monotonic() < deadline, job
        time.sleep(0.25)
        job = trainer.fine_tuning.jobs.retrieve(job.id)
    trained.join(timeout=30)
    assert job.status == "succeeded", job.error
    body = trainer.fine_tuning.jobs.with_raw_response.retrieve(job.id).http_response.json()
    strict(FineTuningJob, body)
    name = f"ft:{BASE}:{stack.tenant['name']}:sums:"
    assert job.fine_tuned_model and job.fine_tuned_model.startswith(name) and job.finished_at

    # Events, newest first, paged with `after`; steps carry their loss.
    events = list(trainer.fine_tuning.jobs.list_events(job.id, limit=2))
    raw_events = trainer.fine_tuning.jobs.with_raw_response.list_events(job.id, limit=100)
    for e in raw_events.http_response.json()["data"]:
        strict(FineTuningJobEvent, e)
    messages = [e.message for e in reversed(events)]
    assert messages[:3] == [
        f"Created fine-tuning job: {job.id}",
        "Validated files: 4 training and 1 validation examples",
        "Fine-tuning job started",
    ]
    assert messages[-2:] == [
        f"New fine-tuned model created: {job.fine_tuned_model}",
        "The job has successfully completed",
    ]
    steps = [e for e in events if e.type == "metrics"]
    assert [e.data["step"] for e in reversed(steps)] == [1, 2]  # type: ignore[index]
    assert len({e.id for e in events}) == len(events)

    (ckpt,) = trainer.fine_tuning.jobs.checkpoints.list(job.id)
    raw_ckpt = trainer.fine_tuning.jobs.checkpoints.with_raw_response.list(job.id)
    strict(FineTuningJobCheckpoint, raw_ckpt.http_response.json()["data"][0])
    assert ckpt.fine_tuned_model_checkpoint == job.fine_tuned_model and ckpt.step_number == 2
    assert ckpt.metrics.train_loss is not None and ckpt.metrics.valid_loss is not None

    # The fine-tuned model answers by name, with the tenant's client key, loaded on demand.
    assert job.fine_tuned_model in [m.id for m in client.models.list()]
    raw_chat = client.chat.completions.with_raw_response.create(
        model=job.fine_tuned_model,
        messages=[{"role": "user", "content": "What is 3 plus 3?"}],
        max_tokens=4,
        temperature=0,
    )
    chat = raw_chat.parse()
    assert chat.model == job.fine_tuned_model and chat.choices[0].message.content
    adapter = raw_chat.headers["x-cft-adapter"]
    with psycopg.connect(stack.db_url, autocommit=True, row_factory=dict_row) as c:
        row = c.execute(
            "SELECT a.status, a.route, r.id AS run FROM serve.adapter a"
            " JOIN train.training_run r ON r.adapter_id = a.id WHERE a.id = %s",
            (adapter,),
        ).fetchone()
    assert row is not None and (row["status"], row["route"]) == ("candidate", "support")

    # Another tenant's keys: the model does not exist for them.
    with pytest.raises(openai.NotFoundError) as exc:
        stack.sdk(stack.keys["b-client"]).chat.completions.create(
            model=job.fine_tuned_model, messages=[{"role": "user", "content": "hi"}]
        )
    assert exc.value.code == "model_not_found"
    assert job.fine_tuned_model not in [
        m.id for m in stack.sdk(stack.keys["b-client"]).models.list()
    ]
    b_trainer = stack.sdk(stack.keys["b-trainer"])
    with pytest.raises(openai.NotFoundError):
        b_trainer.fine_tuning.jobs.retrieve(job.id)
    with pytest.raises(openai.NotFoundError):
        b_trainer.files.retrieve(file.id)

    # "auto" is the loop's rule; a second job is cancelled while queued.
    second = trainer.fine_tuning.jobs.create(model=BASE, training_file=file.id)
    rule = loop_settings("sft", 4)
    assert second.hyperparameters.batch_size == rule["batch_size"] * rule["grad_accum"]
    assert second.hyperparameters.learning_rate_multiplier == 1.0
    with psycopg.connect(stack.db_url, autocommit=True, row_factory=dict_row) as c:
        params = c.execute(
            "SELECT r.params FROM train.training_run r JOIN train.fine_tuning_job j"
            " ON j.training_run_id = r.id WHERE j.id = %s",
            (second.id,),
        ).fetchone()
    assert params is not None and params["params"] == rule | {"seed": second.seed}
    raw_cancel = trainer.fine_tuning.jobs.with_raw_response.cancel(second.id)
    cancelled = strict(FineTuningJob, raw_cancel.http_response.json())
    assert cancelled.status == "cancelled" and cancelled.finished_at
    with pytest.raises(openai.ConflictError):
        trainer.fine_tuning.jobs.cancel(second.id)
    listed = trainer.fine_tuning.jobs.list(limit=1)
    assert [j.id for j in listed.data] == [second.id] and listed.has_more
    assert [j.id for j in trainer.fine_tuning.jobs.list(limit=1, after=second.id)] == [job.id]
    assert [j.id for j in trainer.fine_tuning.jobs.list(metadata={"team": "ml"})] == [job.id]

    # Deleting the file leaves the jobs as they are.
    deleted = trainer.files.with_raw_response.delete(file.id).http_response.json()
    assert strict(FileDeleted, deleted).deleted
    assert trainer.fine_tuning.jobs.retrieve(job.id).status == "succeeded"


def test_node_sdk_fine_tunes_to_a_served_model(stack: Stack, tmp_path: Path) -> None:
    if shutil.which("node") is None or shutil.which("npm") is None:
        pytest.skip("node and npm are not installed: the Node SDK test needs them")
    installed = NODE_DIR / "node_modules" / "openai" / "package.json"
    wanted = json.loads((NODE_DIR / "package.json").read_text())["dependencies"]["openai"]
    if not installed.exists() or json.loads(installed.read_text())["version"] != wanted:
        subprocess.run(
            ["npm", "ci", "--no-audit", "--no-fund", "--loglevel=error"],
            cwd=NODE_DIR,
            check=True,
            timeout=300,
        )
    data = tmp_path / "sums.jsonl"
    data.write_bytes(TRAIN)
    trained = stack.train_next()
    proc = subprocess.run(
        ["node", str(NODE_DIR / "fine_tune.mjs")],
        env={
            "PATH": "/usr/bin:/bin:/usr/local/bin",
            "CFT_BASE_URL": stack.api + "/v1",
            "CFT_TRAINER_KEY": stack.keys["trainer"],
            "CFT_CLIENT_KEY": stack.keys["client"],
            "CFT_MODEL": "support",
            "CFT_FILE": str(data),
        },
        capture_output=True,
        text=True,
        timeout=300,
    )
    trained.join(timeout=30)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout)
    strict(FileObject, out["file"])
    for key in ("created", "finished", "cancelled"):
        strict(FineTuningJob, out[key])
    job = out["finished"]
    assert job["status"] == "succeeded" and job["seed"] == 7
    assert job["fine_tuned_model"].startswith(f"ft:{BASE}:{stack.tenant['name']}:node:")
    for event in out["events"]:
        strict(FineTuningJobEvent, event)
    # Every page was read: the oldest event comes last.
    assert out["events"][-1]["message"] == f"Created fine-tuning job: {job['id']}"
    assert out["events"][0]["message"] == "The job has successfully completed"
    (ckpt,) = out["checkpoints"]
    strict(FineTuningJobCheckpoint, ckpt)
    assert out["chat"]["model"] == job["fine_tuned_model"]
    assert out["chat"]["choices"][0]["message"]["content"]
    assert out["cancelled"]["status"] == "cancelled"
    assert out["cancel_again"]["status"] == 409
    assert out["jobs"][0] == job["id"] and len(set(out["jobs"])) == len(out["jobs"])


BAD_FILES = [
    pytest.param(b'{"messages": []}\nnot json\n', "line 1", id="empty-messages"),
    pytest.param(jsonl([chat_line(1), "x"]), "line 2: must be a JSON object", id="not-an-object"),
    pytest.param(jsonl([chat_line(1)]) + b"{not json}\n", "line 2: not valid JSON", id="bad-json"),
    pytest.param(jsonl([chat_line(1, tools=[{"type": "function"}])]), "line 1: tools", id="tools"),
    pytest.param(
        jsonl([{"prompt": "a", "completion": "b"}]),
        "line 1: unknown key 'completion'",
        id="wrong-keys",
    ),
    pytest.param(
        jsonl([chat_line(1), {"messages": [{"role": "robot", "content": "x"}]}]),
        "line 2: messages[0].role must be one of system, user, assistant",
        id="bad-role",
    ),
    pytest.param(
        jsonl([{"messages": [{"role": "user", "content": "no answer"}]}]),
        "needs an assistant message",
        id="no-answer",
    ),
    pytest.param(
        jsonl([chat_line(1), {"input": {"messages": []}, "preferred_output": []}]),
        "line 2: is a preference example but line 1 is a chat example",
        id="mixed-formats",
    ),
    pytest.param(b"\n \n", "is empty", id="empty-file"),
]


@pytest.mark.parametrize(("content", "needle"), BAD_FILES)
def test_a_bad_file_is_a_400_naming_the_line_and_nothing_is_stored(
    stack: Stack, content: bytes, needle: str
) -> None:
    r = httpx.post(
        f"{stack.api}/v1/files",
        files={"file": ("bad.jsonl", content)},
        data={"purpose": "fine-tune"},
        headers={"Authorization": f"Bearer {stack.keys['trainer']}"},
        timeout=30,
    )
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert needle in error["message"] and error["param"] == "file", error
    assert stack.count("SELECT count(*) FROM train.training_file WHERE filename = 'bad.jsonl'") == 0


def test_wrong_purpose_too_big_and_bad_jobs_are_clear_4xx_with_nothing_stored(
    stack: Stack,
) -> None:
    trainer = stack.sdk(stack.keys["trainer"])
    before = {
        t: stack.count(f"SELECT count(*) FROM {t}")
        for t in (
            "train.training_file",
            "train.fine_tuning_job",
            "train.training_run",
            "train.dataset_snapshot",
        )
    }
    with pytest.raises(openai.BadRequestError) as exc:
        trainer.files.create(file=("a.jsonl", TRAIN), purpose="batch")
    assert exc.value.code == "invalid_purpose" and "fine-tune" in exc.value.message
    with pytest.raises(openai.APIStatusError) as big:
        trainer.files.create(
            file=("big.jsonl", TRAIN * (FILE_MAX // len(TRAIN) + 1)), purpose="fine-tune"
        )
    assert big.value.status_code == 413 and "CFT_FILE_MAX_BYTES" in big.value.message
    with pytest.raises(openai.APIStatusError) as huge:  # past the upload's body limit itself
        trainer.files.create(file=("big.jsonl", b"x" * (FILE_MAX + 100_000)), purpose="fine-tune")
    assert huge.value.status_code == 413

    good = trainer.files.create(file=("good.jsonl", TRAIN), purpose="fine-tune")
    pairs = jsonl(
        [
            {
                "input": {"messages": [{"role": "user", "content": "Hi"}]},
                "preferred_output": [{"role": "assistant", "content": "Hello!"}],
                "non_preferred_output": [{"role": "assistant", "content": "Go away."}],
            }
        ]
    )
    prefs = trainer.files.create(file=("prefs.jsonl", pairs), purpose="fine-tune")
    other = stack.sdk(stack.keys["b-trainer"]).files.create(
        file=("theirs.jsonl", TRAIN), purpose="fine-tune"
    )
    sup = {"type": "supervised", "supervised": {"hyperparameters": {}}}
    cases: list[tuple[dict[str, Any], type[Exception], str]] = [
        ({"training_file": "file-nope"}, openai.BadRequestError, "training_file"),
        ({"training_file": other.id}, openai.BadRequestError, "training_file"),
        ({"validation_file": "file-nope"}, openai.BadRequestError, "validation_file"),
        ({"model": "no-such-route"}, openai.NotFoundError, "model"),
        ({"model": "ft:x:y::z"}, openai.BadRequestError, "model"),
        ({"training_file": prefs.id}, openai.BadRequestError, "training_file"),
        (
            {"method": {"type": "dpo", "dpo": {"hyperparameters": {"beta": 0.2}}}},
            openai.BadRequestError,
            "training_file",
        ),
        ({"method": {"type": "reinforcement"}}, openai.UnprocessableEntityError, "method"),
        (
            {"method": sup | {"supervised": {"hyperparameters": {"n_epochs": 0}}}},
            openai.UnprocessableEntityError,
            "n_epochs",
        ),
        (
            {"method": sup | {"supervised": {"hyperparameters": {"batch_size": "big"}}}},
            openai.UnprocessableEntityError,
            "batch_size",
        ),
        (
            {"hyperparameters": {"learning_rate_multiplier": -1}},
            openai.UnprocessableEntityError,
            "learning_rate_multiplier",
        ),
        ({"suffix": "has:colon"}, openai.UnprocessableEntityError, "suffix"),
        ({"integrations": [{"type": "wandb"}]}, openai.UnprocessableEntityError, "integrations"),
    ]
    for over, error, field in cases:
        body = {"model": "support", "training_file": good.id} | over
        with pytest.raises(error) as caught:
            trainer.fine_tuning.jobs.create(**body)  # type: ignore[arg-type]
        err = caught.value.body
        assert isinstance(err, dict) and field in f"{err.get('param')} {err['message']}", (
            over,
            err,
        )
    # A route may not take a name the router reads as a fine-tuned model's.
    r = httpx.post(
        f"{stack.api}/v1/routes",
        json={"name": "ft:mine"},
        headers={"Authorization": f"Bearer {stack.keys['trainer']}"},
        timeout=30,
    )
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_route_name", r.text
    after = {t: stack.count(f"SELECT count(*) FROM {t}") for t in before}
    assert after == before | {"train.training_file": before["train.training_file"] + 3}

    # The file's examples arrive as cft's snapshot formats.
    job = trainer.fine_tuning.jobs.create(
        model="support", training_file=prefs.id, method={"type": "dpo"}
    )
    assert job.method is not None and job.method.dpo is not None
    assert job.method.dpo.hyperparameters.beta == 0.1  # type: ignore[union-attr]
    trainer.fine_tuning.jobs.cancel(job.id)
    with psycopg.connect(stack.db_url, autocommit=True, row_factory=dict_row) as c:
        snap = c.execute(
            "SELECT s.*, v.* FROM train.fine_tuning_job j"
            " JOIN train.training_run r ON r.id = j.training_run_id"
            " JOIN train.dataset_snapshot s ON s.id = r.snapshot_id,"
            " train.verify_snapshot(s.id) v WHERE j.id = %s",
            (job.id,),
        ).fetchone()
        example = c.execute(
            "SELECT example FROM train.dataset_example WHERE snapshot_id = %s", (snap["id"],)
        ).fetchone()
    assert snap["method"] == "dpo" and (snap["n_train"], snap["n_eval"]) == (1, 0)
    assert snap["set_hash_ok"] and snap["examples_ok"] and snap["split_ok"]
    assert example["example"] == {
        "prompt": [{"role": "user", "content": "Hi"}],
        "chosen": [{"role": "assistant", "content": "Hello!"}],
        "rejected": [{"role": "assistant", "content": "Go away."}],
    }
