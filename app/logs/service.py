"""The logs domain's public functions: validate, ingest, feedback, read.

The rules live in `validation`, `ingest`, `feedback` and `queries`; this module is the one
import other code needs (`from app.logs import service as logs`).
"""

from __future__ import annotations

from app.logs.feedback import give_feedback
from app.logs.ingest import insert_prepared, log_batch, log_records, summarize
from app.logs.queries import get_log, get_log_or_raise, list_logs
from app.logs.validation import InvalidRecord, Prepared, prepare, records_of

__all__ = [
    "InvalidRecord",
    "Prepared",
    "get_log",
    "get_log_or_raise",
    "give_feedback",
    "insert_prepared",
    "list_logs",
    "log_batch",
    "log_records",
    "prepare",
    "records_of",
    "summarize",
]
