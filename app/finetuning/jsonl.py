"""Fine-tuning files in OpenAI's JSONL formats, checked line by line and turned into cft examples.

Two formats, one per file (its first line decides):
  * chat (supervised jobs): `{"messages": [...]}`. Every assistant message whose `weight` is
    not 0 is a training target; each becomes one SFT example, the conversation up to and
    including it (cft's trainer learns the last assistant turn of an example).
  * preference (dpo jobs): `{"input": {"messages": [...]}, "preferred_output": [one assistant
    message], "non_preferred_output": [one assistant message]}`, which becomes cft's pair
    example `{"prompt", "chosen", "rejected"}`.
Messages keep their role and text only. Tools, function calls, images and audio are refused
with a message that says so; so is anything else a line carries. The same checks run when a
file is uploaded and when a job reads it, so a job never meets a line its upload would refuse.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

from app.core.errors import BadRequest

Format = Literal["chat", "preference"]
# The job method each format trains.
METHOD_OF: dict[str, str] = {"chat": "supervised", "preference": "dpo"}

ROLES = ("system", "user", "assistant")
# OpenAI's "developer" role is the system prompt of newer models.
_ROLE_ALIASES = {"developer": "system"}
_CHAT_KEYS = {"messages", "tools", "parallel_tool_calls", "functions"}
_PREFERENCE_KEYS = {"input", "preferred_output", "non_preferred_output"}
_MESSAGE_KEYS = {"role", "content", "weight", "name"}
_UNSUPPORTED = {
    "tool_calls": "tool calls are not supported",
    "function_call": "function calls are not supported",
    "tool_call_id": "tool messages are not supported",
    "refusal": "refusals are not supported",
    "audio": "audio is not supported",
}
MAX_MESSAGES = 1000


class FileFormatError(BadRequest):
    """A line of a fine-tuning file is not in a format cft trains on (400, names the line)."""

    code = "invalid_file_format"


@dataclass(frozen=True)
class ParsedFile:
    """A checked file: its format, its lines (non-blank) and the cft examples they make."""

    format: Format
    lines: int
    examples: list[dict[str, Any]]


def parse(content: bytes, *, param: str = "file", name: str = "the file") -> ParsedFile:
    """Check every line of a fine-tuning file; FileFormatError names the first bad line."""
    fmt: Format | None = None
    first = 0
    lines = 0
    examples: list[dict[str, Any]] = []
    for n, raw in enumerate(content.split(b"\n"), 1):
        if not raw.strip():
            continue
        where = f"{name}, line {n}"
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise FileFormatError(f"{where}: not UTF-8 ({exc.reason})", param=param) from exc
        try:
            row = json.loads(text)
        except json.JSONDecodeError as exc:
            raise FileFormatError(
                f"{where}: not valid JSON ({exc.msg} at column {exc.colno}); each line must be"
                " one JSON object",
                param=param,
            ) from exc
        if not isinstance(row, dict):
            raise FileFormatError(f"{where}: must be a JSON object", param=param)
        kind: Format = "preference" if _PREFERENCE_KEYS & row.keys() else "chat"
        if fmt is None:
            fmt, first = kind, n
        elif kind != fmt:
            raise FileFormatError(
                f"{where}: is a {kind} example but line {first} is a {fmt} example; a file holds"
                " one format",
                param=param,
            )
        lines += 1
        try:
            examples += _chat(row) if kind == "chat" else [_preference(row)]
        except ValueError as exc:
            raise FileFormatError(f"{where}: {exc}", param=param) from exc
    if fmt is None:
        raise FileFormatError(
            f"{name} is empty: it needs one JSON example per line", code="empty_file", param=param
        )
    return ParsedFile(fmt, lines, examples)


def _chat(row: dict[str, Any]) -> list[dict[str, Any]]:
    _keys(row, _CHAT_KEYS, "a chat example")
    if row.get("tools") or row.get("functions"):
        raise ValueError("tools and functions are not supported: drop them")
    if "messages" not in row:
        raise ValueError(
            'needs "messages" (a chat example) or "input", "preferred_output" and'
            ' "non_preferred_output" (a preference example)'
        )
    messages = _messages(row["messages"], "messages")
    out = []
    for i, (message, trained) in enumerate(messages):
        if message["role"] == "assistant" and trained:
            if i == 0:
                raise ValueError(
                    "messages[0] is an assistant message: a trained answer needs a message"
                    " before it"
                )
            out.append({"messages": [m for m, _ in messages[: i + 1]]})
    if not out:
        raise ValueError(
            "needs an assistant message to learn (one without weight 0), after the prompt"
        )
    return out


def _preference(row: dict[str, Any]) -> dict[str, Any]:
    _keys(row, _PREFERENCE_KEYS, "a preference example")
    missing = sorted(_PREFERENCE_KEYS - row.keys())
    if missing:
        raise ValueError(f"a preference example needs {', '.join(missing)}")
    given = row["input"]
    if not isinstance(given, dict):
        raise ValueError('"input" must be an object with "messages"')
    _keys(given, {"messages", "tools", "parallel_tool_calls"}, '"input"')
    if given.get("tools"):
        raise ValueError("tools are not supported: drop input.tools")
    prompt = [m for m, _ in _messages(given.get("messages"), "input.messages")]
    if prompt[-1]["role"] == "assistant":
        raise ValueError("input.messages must end with a user or system message (the prompt)")
    return {
        "prompt": prompt,
        "chosen": _answer(row["preferred_output"], "preferred_output"),
        "rejected": _answer(row["non_preferred_output"], "non_preferred_output"),
    }


def _answer(value: Any, field: str) -> list[dict[str, str]]:
    if not isinstance(value, list) or len(value) != 1:
        raise ValueError(f"{field} must be a list of exactly one assistant message")
    ((message, _),) = _messages(value, field)
    if message["role"] != "assistant":
        raise ValueError(f"{field}[0].role must be assistant")
    return [message]


def _keys(obj: dict[str, Any], allowed: set[str], what: str) -> None:
    unknown = sorted(obj.keys() - allowed)
    if unknown:
        raise ValueError(
            f"unknown key {unknown[0]!r} in {what} (allowed: {', '.join(sorted(allowed))})"
        )


def _messages(value: Any, field: str) -> list[tuple[dict[str, str], bool]]:
    """(message as role and text, trained) for each message of a list."""
    if not isinstance(value, list) or not value:
        raise ValueError(f"{field} must be a non-empty list of messages")
    if len(value) > MAX_MESSAGES:
        raise ValueError(f"{field} has {len(value)} messages; at most {MAX_MESSAGES}")
    return [_message(m, f"{field}[{i}]") for i, m in enumerate(value)]


def _message(m: Any, where: str) -> tuple[dict[str, str], bool]:
    if not isinstance(m, dict):
        raise ValueError(f"{where} must be an object with role and content")
    for key, why in _UNSUPPORTED.items():
        if key in m:
            raise ValueError(f"{where}.{key}: {why}")
    _keys(m, _MESSAGE_KEYS, where)
    role = _ROLE_ALIASES.get(m.get("role"), m.get("role"))  # type: ignore[arg-type]
    if role not in ROLES:
        raise ValueError(f"{where}.role must be one of {', '.join(ROLES)} (got {m.get('role')!r})")
    content = _text(m.get("content"), where)
    weight = m.get("weight", 1)
    if weight not in (0, 1) or isinstance(weight, bool):
        raise ValueError(f"{where}.weight must be 0 or 1")
    if weight == 0 and role != "assistant":
        raise ValueError(f"{where}.weight is for assistant messages only")
    return {"role": str(role), "content": content}, weight == 1


def _text(content: Any, where: str) -> str:
    if isinstance(content, list):
        parts = []
        for i, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") != "text":
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise ValueError(
                    f"{where}.content[{i}]: only text parts are supported (got {kind!r})"
                )
            text = part.get("text")
            if not isinstance(text, str):
                raise ValueError(f"{where}.content[{i}].text must be a string")
            parts.append(text)
        content = "".join(parts)
    if not isinstance(content, str):
        raise ValueError(f"{where}.content must be a string")
    if "\x00" in content:
        raise ValueError(f"{where}.content holds a NUL character")
    return content
