"""The logs domain's public functions: validate, ingest, feedback, read.

The rules live in `validation`, `ingest`, `feedback` and `queries`; this module is the one
import other code needs (`from app.logs import service as logs`).
"""

from __future__ import annotations

from app.logs.feedback import give_feedback
from app.logs.ingest import (
    Staged,
    insert_prepared,
    insert_staged,
    log_batch,
    log_records,
    stage,
    summarize,
)
from app.logs.queries import get_log, get_log_or_raise, list_logs
from app.logs.validation import InvalidRecord, Prepared, prepare, records_of

__all__ = [
    "InvalidRecord",
    "Prepared",
    "Staged",
    "get_log",
    "get_log_or_raise",
    "give_feedback",
    "insert_prepared",
    "insert_staged",
    "list_logs",
    "log_batch",
    "log_records",
    "prepare",
    "records_of",
    "stage",
    "summarize",
]
