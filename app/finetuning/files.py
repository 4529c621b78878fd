"""Fine-tuning files: upload (checked line by line), list, read, delete (one tenant's, by RLS).

Files are kept in PostgreSQL (train.training_file.content), not the artefact store: a file is
bounded (CFT_FILE_MAX_BYTES), it is stored in the same transaction that checks it, offboarding a
tenant deletes it with the rest of the tenant's rows, and a backup of the database holds it. A
job freezes the examples it trains on into a snapshot, so deleting a file never changes a job.
"""

from __future__ import annotations

import hashlib
import secrets
import string
from typing import Any, Literal

from app.core.db import Connection
from app.core.errors import BadRequest, NotFound, PayloadTooLarge
from app.finetuning import jsonl
from app.finetuning.schemas import FileDeleted, FileList, FileObject

_ALPHABET = string.ascii_letters + string.digits
_COLUMNS = "id, bytes, filename, created_at"


def new_id(prefix: str) -> str:
    """An OpenAI-style id: prefix, a dash, 24 random letters and digits."""
    return f"{prefix}-" + "".join(secrets.choice(_ALPHABET) for _ in range(24))


def _out(row: dict[str, Any]) -> FileObject:
    return FileObject(
        id=row["id"],
        bytes=row["bytes"],
        created_at=int(row["created_at"].timestamp()),
        filename=row["filename"],
    )


def create(
    conn: Connection,
    *,
    tenant_id: int,
    filename: str,
    purpose: str,
    content: bytes,
    max_bytes: int,
) -> FileObject:
    """Check and store a fine-tuning file (400 naming the first bad line; nothing stored)."""
    if purpose != "fine-tune":
        raise BadRequest(
            f"purpose {purpose!r} is not supported: cft keeps files for fine-tuning only"
            " (purpose=fine-tune)",
            code="invalid_purpose",
            param="purpose",
        )
    if len(content) > max_bytes:
        raise PayloadTooLarge(
            f"the file is {len(content)} bytes; a fine-tuning file may be at most {max_bytes}"
            " bytes (CFT_FILE_MAX_BYTES): split it or raise the limit",
            param="file",
        )
    name = filename.strip() or "upload.jsonl"
    if len(name) > 255 or "\x00" in name:
        raise BadRequest(
            "the file's name must be at most 255 characters, without NUL", param="file"
        )
    parsed = jsonl.parse(content, param="file", name=name)
    row = conn.execute(
        "INSERT INTO train.training_file (id, tenant_id, filename, purpose, format, lines,"
        " bytes, sha256, content) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)"
        f" RETURNING {_COLUMNS}",
        (
            new_id("file"),
            tenant_id,
            name,
            purpose,
            parsed.format,
            parsed.lines,
            len(content),
            hashlib.sha256(content).hexdigest(),
            content,
        ),
    ).fetchone()
    assert row is not None
    return _out(row)


def get(conn: Connection, *, file_id: str) -> dict[str, Any] | None:
    """One file of the tenant with its content, or None."""
    row: dict[str, Any] | None = conn.execute(
        "SELECT * FROM train.training_file WHERE id = %s", (file_id,)
    ).fetchone()
    return row


def get_or_raise(conn: Connection, *, file_id: str) -> dict[str, Any]:
    """One file of the tenant with its content (404 if absent)."""
    row = get(conn, file_id=file_id)
    if row is None:
        raise NotFound(f"no file {file_id!r}", code="file_not_found")
    return row


def read(conn: Connection, *, file_id: str) -> FileObject:
    """One file (404 if absent)."""
    return _out(get_or_raise(conn, file_id=file_id))


def list_files(
    conn: Connection,
    *,
    purpose: str | None,
    limit: int,
    after: str | None,
    order: Literal["asc", "desc"],
) -> FileList:
    """The tenant's files, newest first unless order=asc; after: the last id of a page."""
    if purpose is not None and purpose != "fine-tune":
        return FileList(data=[], has_more=False, first_id=None, last_id=None)
    cmp, direction = (">", "ASC") if order == "asc" else ("<", "DESC")
    rows = conn.execute(
        f"SELECT {_COLUMNS} FROM train.training_file f"
        " WHERE %(after)s::text IS NULL OR (f.created_at, f.id)"
        f" {cmp} (SELECT a.created_at, a.id FROM train.training_file a WHERE a.id = %(after)s)"
        f" ORDER BY f.created_at {direction}, f.id {direction} LIMIT %(n)s",
        {"after": after, "n": limit + 1},
    ).fetchall()
    data = [_out(r) for r in rows[:limit]]
    return FileList(
        data=data,
        has_more=len(rows) > limit,
        first_id=data[0].id if data else None,
        last_id=data[-1].id if data else None,
    )


def delete(conn: Connection, *, file_id: str) -> FileDeleted:
    """Delete a file (the jobs that used it keep their frozen examples)."""
    row = conn.execute(
        "DELETE FROM train.training_file WHERE id = %s RETURNING id", (file_id,)
    ).fetchone()
    if row is None:
        raise NotFound(f"no file {file_id!r}", code="file_not_found")
    return FileDeleted(id=file_id, deleted=True)
