"""Adapters trained elsewhere (Axolotl, Unsloth, LLaMA-Factory, a TRL script): checked, stored
and registered as a candidate exactly as cft's trainer registers its own.

What an import checks, before anything is stored: the route is the caller's tenant's; the base
named (if any) is the route's; adapter_config.json names the route's base; the engines'
contract (app/engines/compat.py: LoRA only, no DoRA, rank within CFT_ENGINE_MAX_LORA_RANK, every
tensor a LoRA half with its pair); and, where the base's config.json is on this machine, that
every tensor fits the base's shapes and every targeted module has its weights. Only the two
files an engine loads are kept (adapter_config.json, adapter_model.safetensors), with a
manifest.json like the trainer's; the row records where the adapter came from (source
'imported', import_detail). From then on the evaluator, the gate, the reconciler and the router
treat it as any candidate.

Nothing is left behind by a refused import: the checks run before the store is written, and a
stored version whose registration fails is deleted (`discard` for a commit that fails later).
"""

from __future__ import annotations

import json
import logging
import secrets
import shutil
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath
from typing import Any

import psycopg

from app.adapters import archive
from app.adapters import service as adapters
from app.adapters.schemas import AdapterOut
from app.core import basemodels
from app.core.artefacts import (
    CONFIG_FILE,
    WEIGHTS_FILE,
    ArtefactError,
    LocalStore,
    S3Store,
    StoredVersion,
    write_manifest,
)
from app.core.config import Settings
from app.core.db import Connection
from app.core.errors import BadRequest, NotFound, PayloadTooLarge, Unavailable, Unprocessable
from app.datasets.methods import METHODS
from app.engines import compat

log = logging.getLogger(__name__)

# The largest adapter_config.json read (PEFT writes about 1 KB).
MAX_CONFIG_BYTES = 1_000_000


@dataclass(frozen=True)
class ImportSpec:
    """What the caller says about the adapter: where it goes and how it was trained."""

    route: str
    method: str
    base_model: str | None = None
    dataset_snapshot_id: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    # Where it came from, for the record: "upload NAME", a directory, an s3:// prefix.
    origin: str = ""
    # Who imported it: an API key (key=PREFIX role=ROLE) or "cli".
    actor: str = ""


def _route_base(conn: Connection, *, tenant_id: int, route: str) -> str:
    row = conn.execute(
        "SELECT base_model FROM serve.route WHERE tenant_id = %s AND name = %s",
        (tenant_id, route),
    ).fetchone()
    if row is None:
        raise NotFound(f"route {route!r} not found", code="route_not_found", param="route")
    return str(row["base_model"])


def _snapshot(conn: Connection, *, tenant_id: int, spec: ImportSpec) -> dict[str, Any] | None:
    if spec.dataset_snapshot_id is None:
        return None
    try:
        row = conn.execute(
            "SELECT id, route, method, set_hash, tainted_at FROM train.dataset_snapshot"
            " WHERE id = %s AND tenant_id = %s",
            (spec.dataset_snapshot_id, tenant_id),
        ).fetchone()
    except psycopg.errors.InvalidTextRepresentation:
        row = None
    if row is None:
        raise NotFound(
            f"dataset snapshot {spec.dataset_snapshot_id} not found",
            code="snapshot_not_found",
            param="dataset_snapshot_id",
        )
    if (row["route"], row["method"]) != (spec.route, spec.method):
        raise Unprocessable(
            f"dataset snapshot {row['id']} is a {row['method']} snapshot of route"
            f" {row['route']!r}, not a {spec.method} snapshot of {spec.route!r}",
            code="snapshot_mismatch",
            param="dataset_snapshot_id",
        )
    if row["tainted_at"] is not None:
        raise Unprocessable(
            f"dataset snapshot {row['id']} is tainted (a user it holds was forgotten): an"
            " adapter trained on it is not registered",
            code="snapshot_tainted",
            param="dataset_snapshot_id",
        )
    return dict(row)


def same_base(declared: str, base: str) -> bool:
    """Whether adapter_config.json's base_model_name_or_path names base: the same name, or the
    same last path component in any case ("HuggingFaceTB/SmolLM2-135M-Instruct" and a local
    "/models/smollm2-135m-instruct" both name "smollm2-135m-instruct")."""
    names = {base.lower(), PurePosixPath(base).name.lower()}
    return declared.lower() in names or PurePosixPath(declared).name.lower() in names


def _read_config(adapter_dir: Path) -> dict[str, Any]:
    path = adapter_dir / CONFIG_FILE
    if path.stat().st_size > MAX_CONFIG_BYTES:
        raise Unprocessable(f"{CONFIG_FILE} is over {MAX_CONFIG_BYTES} bytes", code="bad_adapter")
    try:
        cfg = json.loads(path.read_text())
    except (OSError, ValueError, RecursionError) as exc:
        raise Unprocessable(f"{CONFIG_FILE} is not valid JSON: {exc}", code="bad_adapter") from exc
    if not isinstance(cfg, dict):
        raise Unprocessable(f"{CONFIG_FILE} is not a JSON object", code="bad_adapter")
    return cfg


def _stage(adapter_dir: Path, staged: Path, *, max_bytes: int) -> dict[str, Any]:
    """Copy the two files an engine loads into staged; returns adapter_config.json."""
    if not (adapter_dir / WEIGHTS_FILE).is_file():
        found = sorted(p.name for p in adapter_dir.iterdir() if p.suffix in (".bin", ".pt"))
        hint = (
            f" ({', '.join(found)} is a pickle, which cft never loads: save the adapter with"
            " save_pretrained(..., safe_serialization=True))"
            if found
            else ""
        )
        raise Unprocessable(f"{WEIGHTS_FILE} is missing{hint}", code="bad_adapter")
    if (adapter_dir / WEIGHTS_FILE).stat().st_size > max_bytes:
        raise PayloadTooLarge(
            f"{WEIGHTS_FILE} is larger than {max_bytes} bytes (CFT_ADAPTER_IMPORT_MAX_BYTES)",
            code="adapter_too_large",
        )
    cfg = _read_config(adapter_dir)
    staged.mkdir(parents=True)
    for name in (CONFIG_FILE, WEIGHTS_FILE):
        shutil.copyfile(adapter_dir / name, staged / name)
    return cfg


def _check(staged: Path, cfg: dict[str, Any], *, base: str, settings: Settings) -> compat.Report:
    """What the engines' contract finds on base; Unprocessable listing every problem."""
    report = compat.check(
        staged,
        max_lora_rank=settings.engine_max_lora_rank,
        base_config=basemodels.config(base, settings.models_path),
    )
    declared = cfg.get("base_model_name_or_path")
    if isinstance(declared, str) and declared and not same_base(declared, base):
        raise Unprocessable(
            f"{CONFIG_FILE} says the adapter was trained on {declared!r}, but the route serves"
            f" {base!r} (if that is the same model, set base_model_name_or_path to {base!r})",
            code="base_mismatch",
        )
    if not report.ok:
        code = "base_mismatch" if any("another base" in p for p in report.problems) else None
        raise Unprocessable(
            "the adapter cannot be served: " + "; ".join(report.problems),
            code=code or "adapter_not_loadable",
        )
    return report


def _revision(conn: Connection, *, tenant_id: int, base: str, settings: Settings) -> str | None:
    """The revision cft's trainer records for base: from the base's files when they are here,
    else the one it recorded last for the tenant's adapters on that base."""
    try:
        return basemodels.revision(base, settings.models_path)
    except (OSError, RuntimeError, ValueError, KeyError):
        row = conn.execute(
            "SELECT base_revision FROM serve.adapter WHERE tenant_id = %s AND base_model = %s"
            " AND source = 'trained' AND base_revision IS NOT NULL"
            " ORDER BY created_at DESC LIMIT 1",
            (tenant_id, base),
        ).fetchone()
        return str(row["base_revision"]) if row else None


def adapter_name(tenant_id: int, route: str, now: datetime | None = None) -> str:
    """A new, never reused engine name (and artefact version) for an imported adapter:
    <route>-<yyyymmddHHMMSS>-t<tenant id>-i<random>."""
    stamp = (now or datetime.now(UTC)).strftime("%Y%m%d%H%M%S")
    return f"{route[:96]}-{stamp}-t{tenant_id}-i{secrets.token_hex(4)}"


def discard(store: LocalStore | S3Store, row: AdapterOut) -> None:
    """Delete the artefact an import stored (its registration did not commit)."""
    store.delete(
        StoredVersion(
            route=row.route,
            version=row.id,
            uri=str(row.weights_uri),
            modified_at=datetime.now(UTC),
        )
    )


def import_adapter(
    conn: Connection,
    *,
    tenant_id: int,
    source_dir: Path,
    spec: ImportSpec,
    store: LocalStore | S3Store,
    settings: Settings,
    work: Path,
) -> AdapterOut:
    """Check the adapter under source_dir, store it and register it as a candidate of the
    tenant's route, in the caller's transaction; returns its row.

    Raises NotFound (route, snapshot), Unprocessable (the adapter or a field is wrong: the
    message lists every problem) or Unavailable (the store); nothing stays stored then. If
    the caller's commit fails afterwards, it calls `discard` with the row.
    """
    if spec.method not in METHODS:
        raise BadRequest(
            f"unknown method {spec.method!r}: choose one of {', '.join(METHODS)}",
            param="method",
        )
    base = _route_base(conn, tenant_id=tenant_id, route=spec.route)
    if spec.base_model is not None and spec.base_model != base:
        raise Unprocessable(
            f"route {spec.route!r} serves {base!r}, not {spec.base_model!r}: import an adapter"
            " trained on the route's base model",
            code="base_mismatch",
            param="base_model",
        )
    snapshot = _snapshot(conn, tenant_id=tenant_id, spec=spec)
    staged = work / "artefact"
    cfg = _stage(
        archive.find_adapter_dir(source_dir), staged, max_bytes=settings.adapter_import_max_bytes
    )
    report = _check(staged, cfg, base=base, settings=settings)
    revision = _revision(conn, tenant_id=tenant_id, base=base, settings=settings)
    alpha = cfg["lora_alpha"]
    detail = {
        "origin": spec.origin,
        "imported_by": spec.actor,
        "declared_base": cfg.get("base_model_name_or_path"),
        "peft_version": cfg.get("peft_version") or cfg.get("revision"),
        "metadata": spec.metadata,
    }
    name = adapter_name(tenant_id, spec.route)
    write_manifest(
        staged,
        {
            "source": "imported",
            "base_model": base,
            "base_revision": revision,
            "method": spec.method,
            "snapshot_id": str(snapshot["id"]) if snapshot else None,
            "set_hash": snapshot["set_hash"] if snapshot else None,
            "training_run_id": None,
            "hyperparameters": {
                "rank": report.rank,
                "alpha": alpha,
                "target_modules": sorted(report.modules),
            },
            "metrics": {},
            "import": detail,
        },
    )
    try:
        stored = store.put_dir(staged, spec.route, name)
    except ArtefactError as exc:
        raise Unavailable(f"the artefact store refused the adapter: {exc}") from exc
    try:
        with conn.transaction():
            adapters.annotate(conn, reason=f"imported: {spec.origin}"[:1000], actor=spec.actor)
            adapters.register_candidate(
                conn,
                adapter_id=name,
                tenant_id=tenant_id,
                route=spec.route,
                base_model=base,
                base_revision=revision,
                rank=int(report.rank or 0),
                alpha=int(alpha) if float(alpha).is_integer() else None,
                target_modules=sorted(report.modules),
                method=spec.method,
                training_run_id=None,
                dataset_snapshot_id=snapshot["id"] if snapshot else None,
                weights_uri=stored.uri,
                sha256=stored.sha256,
                size_bytes=stored.size_bytes,
                eval_summary={},
                source="imported",
                import_detail=detail,
            )
    except BaseException as exc:
        try:
            store.delete(
                StoredVersion(
                    route=spec.route, version=name, uri=stored.uri, modified_at=datetime.now(UTC)
                )
            )
        except ArtefactError:
            log.exception("could not delete %s after its registration failed", stored.uri)
        if isinstance(exc, psycopg.errors.CheckViolation):
            raise Unprocessable(
                exc.diag.message_primary or str(exc), code="adapter_refused"
            ) from exc
        raise
    return adapters.get_adapter_or_raise(conn, adapter_id=name)


def fetch_s3(client: Any, uri: str, dest: Path, *, max_bytes: int) -> Path:
    """Download every object under an s3://bucket/prefix into dest (paths kept, each checked as
    an archive entry is; at most archive.MAX_MEMBERS objects and max_bytes in all)."""
    from botocore.exceptions import BotoCoreError, ClientError

    bucket, _, prefix = uri.removeprefix("s3://").partition("/")
    prefix = prefix if not prefix or prefix.endswith("/") else prefix + "/"
    try:
        objects: list[dict[str, Any]] = []
        token: dict[str, str] = {}
        while True:
            resp = client.list_objects_v2(Bucket=bucket, Prefix=prefix, **token)
            objects += resp.get("Contents", [])
            if len(objects) > archive.MAX_MEMBERS:
                raise Unprocessable(
                    f"{uri} holds more than {archive.MAX_MEMBERS} objects: point at the adapter's"
                    " own folder",
                    code="unsafe_archive",
                )
            if not resp.get("IsTruncated"):
                break
            token = {"ContinuationToken": resp["NextContinuationToken"]}
        if not objects:
            raise NotFound(f"nothing is stored under {uri}", code="adapter_not_found")
        if sum(int(o.get("Size", 0)) for o in objects) > max_bytes:
            raise PayloadTooLarge(
                f"{uri} holds more than {max_bytes} bytes (CFT_ADAPTER_IMPORT_MAX_BYTES)",
                code="adapter_too_large",
            )
        for obj in objects:
            parts = archive.relative_path(obj["Key"][len(prefix) :])
            if not parts:
                continue  # the folder marker
            target = dest.joinpath(*parts)
            target.parent.mkdir(parents=True, exist_ok=True)
            client.download_file(bucket, obj["Key"], str(target))
    except (ClientError, BotoCoreError) as exc:
        raise Unavailable(f"cannot read {uri}: {exc}") from exc
    return dest


def unpack_source(source: str, dest: Path, *, settings: Settings) -> Path:
    """The folder to import from: a local folder as it is, an archive unpacked into dest, or
    an s3:// prefix (read with the CFT_S3_* credentials) downloaded into dest."""
    if source.startswith("s3://"):
        return fetch_s3(
            S3Store.from_settings(settings).client,
            source,
            dest,
            max_bytes=settings.adapter_import_max_bytes,
        )
    path = Path(source)
    if path.is_dir():
        return path
    if not path.is_file():
        raise NotFound(f"{source} is neither a folder, an archive nor an s3:// prefix")
    with path.open("rb") as f:
        return archive.unpack(f, dest, max_bytes=settings.adapter_import_max_bytes)
