"""The evaluator worker: claims eval requests (one is queued for every new candidate) and scores.

For one adapter it computes, like for like:
  * held-out metrics on the eval split of the adapter's own snapshot, with PEFT on the base: the
    adapter, the bare base (adapter disabled, same pass) and the route's current prod (on the
    CANDIDATE's split) -> eval_result suite_id 'heldout:<snapshot id>';
  * the pass rate of each task suite of the route, through the engine API (CFT_ENGINE_URLS) or
    in process when no engine is configured -> suite_id '<suite id>', metric 'pass_rate';
  * optionally an LLM judge's mean score (0-10) for judge suites, recorded with its judge_model
    and rubric version; a judge suite with a calibration set is calibrated first when its judge
    and rubric have no calibration yet (workers/evaluator/judge.py).
Its connections identify it to the database (cft.evaluator, honoured for the schema owner's
sessions only), which makes it the author of the results it writes (train.eval_result_author).
The current prod gets rows only where it lacks them. The bare base is not a serve.adapter row
(a pseudo-adapter could be canaried or promoted, and eval_result's FK would pin it in the
registry); its numbers go into the candidate's eval_summary under "base".
Workers wake on NOTIFY cft_eval and poll as a fallback.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import shutil
import socket
import tempfile
import threading
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from app import __version__
from app.core.artefacts import fetch_verified
from app.core.config import Settings, get_settings
from app.datasets import service as datasets
from workers import base_model
from workers.evaluator import judge as judge_mod
from workers.evaluator import scoring

log = logging.getLogger(__name__)

CHANNEL = "cft_eval"
EVALUATOR = f"cft-evaluator/{__version__}"


@dataclass
class EvalConfig:
    """How an evaluator behaves."""

    db_url: str
    models_dir: Path
    settings: Settings = field(default_factory=get_settings)
    engine_urls: list[str] = field(default_factory=list)
    worker_id: str = ""
    lease_s: float = 900.0
    poll_s: float = 5.0
    # While idle, score the bare base on looped routes' suites ahead of their candidates.
    warm: bool = True

    def __post_init__(self) -> None:
        if not self.worker_id:
            self.worker_id = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


def connect(url: str, worker_id: str) -> psycopg.Connection[Any]:
    """An autocommit connection that writes as the evaluator."""
    conn = psycopg.connect(
        url, autocommit=True, row_factory=dict_row, application_name="cft-evaluator"
    )
    # For the whole session: what this connection writes is the evaluator's.
    conn.execute("SELECT set_config('cft.evaluator', %s, false)", (f"{EVALUATOR} {worker_id}",))
    return conn


# The check suites of routes whose loop is on, once per base model, each with a digest of its
# cases (what the base's kept score depends on); a suite without cases has none.
_LOOPED_SUITES = (
    "SELECT DISTINCT ON (s.tenant_id, s.id, r.base_model) s.*, r.base_model,"
    " (SELECT md5(string_agg(c::text, ',' ORDER BY c.id)) FROM train.eval_case c"
    "   WHERE c.tenant_id = s.tenant_id AND c.suite_id = s.id) AS cases_digest"
    " FROM train.eval_suite s"
    " JOIN loop.policy p ON p.tenant_id = s.tenant_id AND p.enabled"
    " AND (s.route IS NULL OR s.route = p.route)"
    " JOIN serve.route r ON r.tenant_id = p.tenant_id AND r.name = p.route"
    " WHERE s.kind <> 'judge' ORDER BY s.tenant_id, s.id, r.base_model"
)


def _cases(conn: psycopg.Connection[Any], suite: dict[str, Any]) -> list[dict[str, Any]]:
    """A suite's cases, in order."""
    return conn.execute(
        "SELECT * FROM train.eval_case WHERE tenant_id = %s AND suite_id = %s ORDER BY id",
        (suite["tenant_id"], suite["id"]),
    ).fetchall()


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


class Evaluator:
    """Scores adapters; holds one copy of the base model between requests."""

    def __init__(self, cfg: EvalConfig) -> None:
        self.cfg = cfg
        self.stop = threading.Event()
        self._base: Any = None
        self._base_name: str | None = None
        self._tok: Any = None
        # The bare base's scores, which a new candidate does not change: per task suite (its
        # cases as they are now), and per held-out split (a settings sweep trains several
        # candidates on one snapshot). Keyed by what they depend on (BaseScores.key).
        self.base_scores = BaseScores()
        # The looped suites warm() has read, as (tenant, suite, base, digest of its cases).
        self._warmed: set[tuple[int, str, str, str]] = set()

    # -- queue ---------------------------------------------------------------------------------
    def run_once(self) -> int:
        """Process every claimable request; returns how many were processed."""
        n = 0
        with connect(self.cfg.db_url, self.cfg.worker_id) as conn:
            while not self.stop.is_set():
                req = conn.execute(
                    "SELECT * FROM train.claim_eval_request(%s, %s::interval)",
                    (self.cfg.worker_id, f"{self.cfg.lease_s} seconds"),
                ).fetchone()
                if req is None:
                    break
                self.process(conn, req)
                n += 1
        return n

    def run_forever(self) -> None:
        """Process requests until stopped, woken by NOTIFY cft_eval or the poll interval."""
        with connect(self.cfg.db_url, self.cfg.worker_id) as listen:
            listen.execute(f"LISTEN {CHANNEL}")
            while not self.stop.is_set():
                warmed = False
                try:
                    if self.run_once() == 0 and self.cfg.warm:
                        warmed = self._warm_once()
                except psycopg.Error as exc:
                    log.error("evaluator pass failed: %s", exc)
                # After a warm-up, look for requests at once (then warm the next suite).
                for _ in listen.notifies(timeout=0 if warmed else self.cfg.poll_s, stop_after=1):
                    pass

    def _warm_once(self) -> bool:
        with connect(self.cfg.db_url, self.cfg.worker_id) as conn:
            try:
                return self.warm(conn)
            except (httpx.HTTPError, RuntimeError) as exc:
                # The engine is not up yet, say: a request scores the base itself.
                log.warning("scoring the base ahead of candidates failed: %s", exc)
                return False

    def process(self, conn: psycopg.Connection[Any], req: dict[str, Any]) -> None:
        """Evaluate one request's adapter and record the outcome on the request."""
        try:
            summary = self.evaluate(conn, str(req["adapter_id"]))
        except Exception as exc:
            log.exception("evaluation of %s failed", req["adapter_id"])
            conn.execute(
                "UPDATE train.eval_request SET status = CASE WHEN attempts >= 3 THEN 'failed'"
                " ELSE 'queued' END, error = %s, lease_until = NULL,"
                " finished_at = CASE WHEN attempts >= 3 THEN now() END"
                " WHERE id = %s AND worker_id = %s",
                (f"{type(exc).__name__}: {exc}"[:2000], req["id"], self.cfg.worker_id),
            )
            return
        conn.execute(
            "UPDATE train.eval_request SET status = 'done', finished_at = now(), error = NULL"
            " WHERE id = %s AND worker_id = %s",
            (req["id"], self.cfg.worker_id),
        )
        log.info("evaluated %s: %s", req["adapter_id"], summary.get("results"))

    # -- evaluation ----------------------------------------------------------------------------
    def _load_base(self, name: str) -> tuple[Any, Any]:
        if self._base is None or self._base_name != name:
            self._tok = base_model.load_tokenizer(name, self.cfg.models_dir)
            self._base = base_model.load_model(name, self.cfg.models_dir).eval()
            self._base_name = name
        return self._base, self._tok

    def evaluate(self, conn: psycopg.Connection[Any], adapter_id: str) -> dict[str, Any]:
        """Score one adapter (and its route's prod where it lacks results); returns the summary."""
        cand = conn.execute("SELECT * FROM serve.adapter WHERE id = %s", (adapter_id,)).fetchone()
        if cand is None:
            raise LookupError(f"adapter {adapter_id} does not exist")
        if not cand["weights_uri"] or not cand["sha256"]:
            raise ValueError(f"adapter {adapter_id} has no verified weights to evaluate")
        prod = conn.execute(
            "SELECT * FROM serve.adapter WHERE tenant_id = %s AND route = %s AND status = 'prod'"
            " AND id <> %s",
            (cand["tenant_id"], cand["route"], adapter_id),
        ).fetchone()
        if prod is not None and (
            not prod["weights_uri"]
            or not prod["sha256"]
            or prod["base_model"] != cand["base_model"]
            or prod["base_revision"] != cand["base_revision"]
        ):
            log.warning("current prod %s cannot be evaluated like for like: skipped", prod["id"])
            prod = None
        base, tok = self._load_base(str(cand["base_model"]))
        mode = self.mode
        reused = self.base_scores.hits
        results: dict[str, dict[str, dict[str, Any]]] = {"candidate": {}, "current": {}, "base": {}}
        with tempfile.TemporaryDirectory(prefix="cft-eval-") as tmp:
            cand_dir = fetch_verified(
                cand["weights_uri"], cand["sha256"], Path(tmp) / "candidate", self.cfg.settings
            )
            prod_dir = None
            if prod is not None:
                prod_dir = fetch_verified(
                    prod["weights_uri"], prod["sha256"], Path(tmp) / "current", self.cfg.settings
                )
            with _peft(base, cand_dir, prod_dir) as model:
                if cand["dataset_snapshot_id"] is not None:
                    self._heldout(conn, model, tok, cand, prod, results)
                else:
                    log.info("%s has no dataset snapshot: no held-out metrics", adapter_id)
                suites = conn.execute(
                    "SELECT * FROM train.eval_suite WHERE tenant_id = %s"
                    " AND (route IS NULL OR route = %s) ORDER BY id",
                    (cand["tenant_id"], cand["route"]),
                ).fetchall()
                log.info("task suites of %s: %d, run %s", cand["route"], len(suites), mode)
                for suite in suites:
                    self._suite(conn, model, tok, suite, cand, prod, cand_dir, prod_dir, results)
        summary = {
            "evaluator": EVALUATOR,
            "mode": mode,
            "against": prod["id"] if prod else None,
            "results": results,
            # How many of the base's scores were kept from an earlier evaluation or warm-up.
            "base_scores_reused": self.base_scores.hits - reused,
        }
        with conn.transaction():
            write_results(conn, adapter_id, results["candidate"], replace=True)
            if prod is not None:
                write_results(conn, prod["id"], results["current"], replace=False)
            conn.execute(
                # Merged: the trainer's metrics stay next to the evaluator's.
                "UPDATE serve.adapter SET eval_summary = coalesce(eval_summary, '{}') || %s"
                " WHERE id = %s",
                (Jsonb(_json_safe(summary)), adapter_id),
            )
        return summary

    def _heldout(
        self,
        conn: psycopg.Connection[Any],
        model: Any,
        tok: Any,
        cand: dict[str, Any],
        prod: dict[str, Any] | None,
        results: dict[str, dict[str, dict[str, Any]]],
    ) -> None:
        snap = str(cand["dataset_snapshot_id"])
        suite = f"heldout:{snap}"
        method = conn.execute(
            "SELECT method FROM train.dataset_snapshot WHERE id = %s", (snap,)
        ).fetchone()
        method_name = str(method["method"]) if method else str(cand["method"] or "sft")
        examples = datasets.export_snapshot(conn, snapshot_id=snap, split="eval")  # type: ignore[arg-type]
        if not examples:
            log.warning("snapshot %s has an empty eval split: held-out metrics are NaN", snap)

        def score() -> dict[str, float]:
            # Likelihood of the held-out answers, and the model's own answers against them.
            got = scoring.heldout_metrics(model, tok, method_name, examples)
            gen = scoring.heldout_generation(model, tok, method_name, examples)
            return got | {"answer_similarity": gen["answer_similarity"]}

        model.set_adapter("candidate")
        results["candidate"][suite] = score()
        key = self.base_scores.key(cand, "in-process", suite, method_name)

        def base_score() -> dict[str, float]:
            with model.disable_adapter():
                return score()

        results["base"][suite] = self.base_scores.get_or_compute(key, base_score)
        if prod is not None and not _has(conn, prod["id"], suite):
            model.set_adapter("current")
            results["current"][suite] = score()

    def _suite(
        self,
        conn: psycopg.Connection[Any],
        model: Any,
        tok: Any,
        suite: dict[str, Any],
        cand: dict[str, Any],
        prod: dict[str, Any] | None,
        cand_dir: Path,
        prod_dir: Path | None,
        results: dict[str, dict[str, dict[str, Any]]],
    ) -> None:
        cases = _cases(conn, suite)
        judge = suite["kind"] == "judge"
        settings = self.cfg.settings
        if judge and not settings.eval_judge_url:
            log.info("suite %s needs a judge and none is configured: skipped", suite["id"])
            return
        if judge:
            cal = judge_mod.ensure_calibrated(conn, settings, suite)
            if cal is not None:
                log.info(
                    "judge %s on suite %s: kappa %s, accuracy %s (n=%s)",
                    cal.judge_model,
                    suite["id"],
                    cal.kappa,
                    cal.accuracy,
                    cal.n,
                )
        sid = str(suite["id"])
        who: list[tuple[str, str | None, Path | None]] = [
            ("candidate", str(cand["id"]), cand_dir),
            ("base", None, None),
        ]
        if prod is not None and prod_dir is not None:
            metric = "judge_score" if judge else "pass_rate"
            if not _has(conn, prod["id"], sid, metric):
                who.append(("current", str(prod["id"]), prod_dir))
        for role, name, path in who:
            run = partial(self._suite_score, model, tok, suite, cases, role, name, path)
            if role == "base":
                key = self._base_suite_key(cand, suite, cases)
                results[role][sid] = self.base_scores.get_or_compute(key, run)
            else:
                results[role][sid] = run()

    @property
    def mode(self) -> str:
        """Where suites are answered: the first engine speaking vLLM's API, else in process."""
        return f"engine {self.cfg.engine_urls[0]}" if self.cfg.engine_urls else "in-process"

    def _base_suite_key(
        self, base: dict[str, Any], suite: dict[str, Any], cases: list[dict[str, Any]]
    ) -> str:
        """The key of the bare base's score on a suite (`base`: base_model, base_revision)."""
        judged_by: tuple[str, ...] = ()
        if suite["kind"] == "judge":
            rubric = judge_mod.rubric_of(self.cfg.settings, suite)
            judged_by = (self.cfg.settings.eval_judge_model, rubric)
        return self.base_scores.key(base, self.mode, str(suite["id"]), cases, *judged_by)

    def _suite_score(
        self,
        model: Any,
        tok: Any,
        suite: dict[str, Any],
        cases: list[dict[str, Any]],
        role: str,
        name: str | None,
        path: Path | None,
    ) -> dict[str, Any]:
        """One model's score on a suite: the judge's mean, or the pass rate of its checks."""
        with self._answerer(model, tok, role, name, path) as answer:
            if suite["kind"] == "judge":
                return judge_mod.judge_suite(self.cfg.settings, suite, cases, answer)
            rate, outcomes = scoring.pass_rate(cases, answer)
            return {
                "pass_rate": rate,
                "n": len(outcomes),
                "passed": sum(o["passed"] for o in outcomes),
            }

    def warm(self, conn: psycopg.Connection[Any]) -> bool:
        """While no request waits: score the bare base on one check suite of a route whose loop
        is on, where no score is kept for its cases yet, so that the route's first candidate
        is compared at once (the observe phase's traffic accrues meanwhile). True when it
        scored one; one suite per call keeps a request that arrives from waiting long."""
        for suite in conn.execute(_LOOPED_SUITES).fetchall():
            base_name = str(suite["base_model"])
            # Each idle pass reads only the digests: a suite's cases are read once per change.
            seen = (suite["tenant_id"], suite["id"], base_name, suite["cases_digest"])
            if suite["cases_digest"] is None or seen in self._warmed:
                continue
            if len(self._warmed) >= BaseScores.LIMIT:
                self._warmed.clear()
            self._warmed.add(seen)
            try:
                _, revision = base_model.resolve(base_name, self.cfg.models_dir)
            except (OSError, ValueError) as exc:
                log.debug("base %s cannot be resolved here: %s", base_name, exc)
                continue
            cases = _cases(conn, suite)
            base = {"base_model": base_name, "base_revision": revision}
            key = self._base_suite_key(base, suite, cases)
            if key in self.base_scores:
                continue
            model, tok = (None, None) if self.cfg.engine_urls else self._load_base(base_name)
            score = self.base_scores.get_or_compute(
                key, partial(self._suite_score, model, tok, suite, cases, "base", None, None)
            )
            log.info("base %s on suite %s, ahead of a candidate: %s", base_name, suite["id"], score)
            return True
        return False

    @contextmanager
    def _answerer(
        self, model: Any, tok: Any, role: str, name: str | None, path: Path | None
    ) -> Iterator[scoring.Answer]:
        if not self.cfg.engine_urls:
            if role == "base":
                # A PEFT-wrapped base with its adapters off, or the bare base itself (warm).
                peft = hasattr(model, "disable_adapter")
                with model.disable_adapter() if peft else nullcontext():
                    yield scoring.local_answers(model, tok)
            else:
                model.set_adapter(role)
                yield scoring.local_answers(model, tok)
            return
        url = self.cfg.engine_urls[0].rstrip("/")
        with httpx.Client(base_url=url, timeout=self.cfg.settings.engine_timeout) as client:
            loaded_here = False
            if name is None:
                cards = client.get("/v1/models").raise_for_status().json()["data"]
                model_name = next(str(c["id"]) for c in cards if not c.get("parent"))
            else:
                model_name = name
                loaded_here = _engine_load(client, name, path, self.cfg.settings)
            try:
                yield _engine_answers(client, model_name, self.cfg.settings.eval_concurrency)
            finally:
                # Candidates are not the reconciler's: unload what this evaluation loaded.
                if loaded_here and role == "candidate":
                    client.post("/v1/unload_lora_adapter", json={"lora_name": name})


@contextmanager
def _peft(base: Any, cand_dir: Path, prod_dir: Path | None) -> Iterator[Any]:
    """The base wrapped with the candidate (and current prod) adapters; unwrapped after."""
    from peft import PeftModel

    model = PeftModel.from_pretrained(base, str(cand_dir), adapter_name="candidate")
    try:
        if prod_dir is not None:
            model.load_adapter(str(prod_dir), adapter_name="current")
        model.eval()
        yield model
    finally:
        model.unload()


def _engine_load(client: httpx.Client, name: str, path: Path | None, settings: Settings) -> bool:
    """Load a verified adapter into the engine under its id; False if it was already there."""
    cards = client.get("/v1/models").raise_for_status().json()["data"]
    if any(c["id"] == name for c in cards):
        return False
    if path is None:
        raise ValueError(f"no weights for {name}")
    # The engine reads the path itself: a copy under the serving directory every engine reads.
    target = settings.serving_path / "eval" / name
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(path, target)
    resp = client.post("/v1/load_lora_adapter", json={"lora_name": name, "lora_path": str(target)})
    if resp.status_code != 200 and "already been loaded" not in resp.text:
        raise RuntimeError(f"engine refused adapter {name}: {resp.status_code} {resp.text[:300]}")
    return True


def _engine_answers(client: httpx.Client, model_name: str, concurrency: int) -> scoring.Answer:
    """Greedy answers by the engine, up to `concurrency` requests in flight (the engine batches
    them)."""

    def one(chat: tuple[list[dict[str, Any]], int]) -> str:
        messages, max_tokens = chat
        resp = client.post(
            "/v1/chat/completions",
            json={
                "model": model_name,
                "messages": messages,
                "max_tokens": max_tokens,
                "temperature": 0,
            },
        )
        resp.raise_for_status()
        return str(resp.json()["choices"][0]["message"]["content"] or "")

    def answer(chats: list[tuple[list[dict[str, Any]], int]]) -> list[str]:
        if concurrency <= 1 or len(chats) <= 1:
            return [one(chat) for chat in chats]
        with ThreadPoolExecutor(min(concurrency, len(chats)), "cft-eval") as pool:
            return list(pool.map(one, chats))

    return answer


class BaseScores:
    """The bare base model's scores, kept between evaluations: a candidate is scored each
    cycle, the base it is compared with does not change until its inputs do. A key holds
    everything a score depends on (base model and revision, how it was generated, the suite
    or split and its content), so a changed case or another base is scored anew. Bounded:
    the oldest entry goes first."""

    LIMIT = 256

    def __init__(self) -> None:
        self._scores: dict[str, dict[str, Any]] = {}
        self.hits = 0

    @staticmethod
    def key(cand: dict[str, Any], mode: str, *parts: Any) -> str:
        """The key of a base score: the candidate's base and revision, the mode, the parts."""
        doc = [cand["base_model"], cand.get("base_revision"), mode, EVALUATOR, *parts]
        raw = json.dumps(_json_safe(doc), sort_keys=True, default=str)
        return hashlib.sha256(raw.encode()).hexdigest()

    def __contains__(self, key: str) -> bool:
        return key in self._scores

    def get_or_compute(self, key: str, compute: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        """The score under key, computed (and kept, when every number in it is finite) when
        missing: a NaN is scored again next time."""
        found = self._scores.get(key)
        if found is not None:
            self.hits += 1
            return dict(found)
        score = compute()
        if all(math.isfinite(v) for v in score.values() if isinstance(v, float)):
            self._scores[key] = dict(score)
            while len(self._scores) > self.LIMIT:
                del self._scores[next(iter(self._scores))]
        return score


def _has(
    conn: psycopg.Connection[Any],
    adapter_id: str,
    suite: str,
    metric: str | None = None,
    *,
    finite_only: bool = True,
) -> bool:
    row = conn.execute(
        # Only a trusted author's result counts as there (an untrusted one is scored again).
        "SELECT 1 FROM train.eval_result WHERE adapter_id = %s AND suite_id = %s"
        " AND (%s::text IS NULL OR metric = %s) AND (NOT %s OR score <> 'NaN')"
        " AND author_role = ANY (train.default_trusted_authors()) LIMIT 1",
        (adapter_id, suite, metric, metric, finite_only),
    ).fetchone()
    return row is not None


def write_results(
    conn: psycopg.Connection[Any],
    adapter_id: str,
    by_suite: dict[str, dict[str, Any]],
    *,
    replace: bool,
) -> None:
    """Record one adapter's scores as new results (replace=False: only where no trusted author's
    result is). Results are facts: a rescore is a new row, and the newest counts. NaN is written
    as NaN so the gate refuses it. Computed metrics have no judge_model."""
    for suite, metrics in by_suite.items():
        judge_model = metrics.get("_judge_model") or None
        rubric_version = metrics.get("_rubric_version")
        for metric, score in metrics.items():
            if metric.startswith("_") or metric in ("n", "passed"):
                continue
            if not replace and _has(conn, adapter_id, suite, metric, finite_only=False):
                continue
            conn.execute(
                "INSERT INTO train.eval_result"
                " (adapter_id, suite_id, metric, score, judge_model, rubric_version)"
                " VALUES (%s, %s, %s, %s, %s, %s)",
                (adapter_id, suite, metric, float(score), judge_model, rubric_version),
            )


def _json_safe(value: Any) -> Any:
    if isinstance(value, float):
        return _finite(value)
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_json_safe(v) for v in value]
    return value
