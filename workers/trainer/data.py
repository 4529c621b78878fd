"""The examples of one run: JSONL rows checked against the method's format, as TRL wants them.

SFT trains on the answer only: `{"messages": [...]}` becomes TRL's conversational
prompt-completion format (prompt = every turn before the last, completion = the last assistant
turn), which SFTTrainer trains with completion-only loss. (`assistant_only_loss` would need
`{% generation %}` markers, which SmolLM2's ChatML template lacks.)
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


class TrainingDataError(ValueError):
    """The examples do not fit the method's format."""


def read_jsonl(path: Path | None) -> list[dict[str, Any]]:
    """The rows of a JSONL file ([] when there is none)."""
    if path is None or not path.exists():
        return []
    rows = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise TrainingDataError(f"{path.name} line {n}: not JSON ({exc})") from exc
    return rows


_KEYS = {
    "sft": ("messages",),
    "dpo": ("prompt", "chosen", "rejected"),
    "orpo": ("prompt", "chosen", "rejected"),
    "simpo": ("prompt", "chosen", "rejected"),
    "kto": ("prompt", "completion", "label"),
}


def check_rows(method: str, rows: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    """The rows in the method's TRL format (TrainingDataError when one lacks a key)."""
    keys = _KEYS[method]
    out = []
    for n, row in enumerate(rows, 1):
        missing = [k for k in keys if k not in row]
        if missing:
            raise TrainingDataError(
                f"{name} example {n} lacks {', '.join(missing)} for method {method}"
                f" (expected keys: {', '.join(keys)})"
            )
        out.append({k: row[k] for k in keys})
    if method == "kto" and rows and len({bool(r["label"]) for r in out}) < 2:
        log.warning("kto: every example has the same label; TRL needs both to weigh them")
    if method == "sft":
        out = [_prompt_completion(r["messages"], n, name) for n, r in enumerate(out, 1)]
    return out


def _prompt_completion(messages: Any, n: int, name: str) -> dict[str, Any]:
    """A chat as TRL's prompt-completion pair, so that only the last answer is trained on."""
    if (
        not isinstance(messages, list)
        or len(messages) < 2
        or not all(isinstance(m, dict) for m in messages)
    ):
        raise TrainingDataError(f"{name} example {n}: messages must be a list of 2+ turns")
    if messages[-1].get("role") != "assistant":
        raise TrainingDataError(f"{name} example {n}: the last message must be the assistant's")
    return {"prompt": messages[:-1], "completion": messages[-1:]}
