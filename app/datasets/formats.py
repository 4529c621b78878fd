"""Snapshot exports in the formats other trainers read, and which snapshots fit each.

A snapshot's examples are stored in TRL's conversational formats (service.py): sft
`{"messages"}`, dpo/orpo/simpo `{"prompt", "chosen", "rejected"}`, kto `{"prompt",
"completion", "label"}`. An export writes them as one of FORMATS:

- cft: the stored example (every method);
- trl-conversational: `{"messages"}`, TRL's conversational language modeling (sft);
- trl-preference: `{"prompt", "chosen", "rejected"}`, TRL's conversational preference (dpo,
  orpo, simpo);
- trl-unpaired-preference: `{"prompt", "completion", "label"}`, TRL's unpaired preference, the
  format of its KTO trainer (kto);
- openai-chat: `{"messages"}`, OpenAI's supervised fine-tuning file (sft);
- openai-preference: `{"input": {"messages"}, "preferred_output", "non_preferred_output"}`,
  OpenAI's preference (DPO) fine-tuning file (dpo, orpo, simpo);
- parquet: the stored example's columns, one Parquet file per split (every method).

A format that does not fit the snapshot's method is refused (`check`), naming the ones that do.
"""

from __future__ import annotations

import hashlib
import io
import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, Literal, get_args

from app.core.errors import BadRequest
from app.datasets.methods import METHODS, Method

Format = Literal[
    "cft",
    "trl-conversational",
    "trl-preference",
    "trl-unpaired-preference",
    "openai-chat",
    "openai-preference",
    "parquet",
]
FORMATS: tuple[Format, ...] = get_args(Format)
_PAIRS: tuple[Method, ...] = ("dpo", "orpo", "simpo")
FITS: dict[str, tuple[Method, ...]] = {
    "cft": METHODS,
    "trl-conversational": ("sft",),
    "trl-preference": _PAIRS,
    "trl-unpaired-preference": ("kto",),
    "openai-chat": ("sft",),
    "openai-preference": _PAIRS,
    "parquet": METHODS,
}
# What an OpenAI fine-tuning file's message may carry (anything else a log kept is left out).
OPENAI_MESSAGE_KEYS = ("role", "content", "name", "tool_calls", "tool_call_id")
JSONL_MEDIA_TYPE = "application/x-ndjson"
PARQUET_MEDIA_TYPE = "application/vnd.apache.parquet"


def formats_for(method: str) -> list[Format]:
    """The formats a snapshot of method exports to."""
    return [f for f in FORMATS if method in FITS[f]]


def check(fmt: str, method: str) -> None:
    """BadRequest unless fmt is a format and fits a snapshot of method."""
    if fmt not in FITS:
        raise BadRequest(
            f"unknown export format {fmt!r}: choose one of {', '.join(FORMATS)}",
            code="unknown_format",
            param="format",
        )
    if method not in FITS[fmt]:
        raise BadRequest(
            f"a {method} snapshot cannot be exported as {fmt} (it is for"
            f" {', '.join(FITS[fmt])} snapshots): a {method} snapshot exports as"
            f" {', '.join(formats_for(method))}",
            code="format_mismatch",
            param="format",
        )


def _openai(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: m[k] for k in OPENAI_MESSAGE_KEYS if k in m} for m in messages]


def convert(fmt: str, example: dict[str, Any]) -> dict[str, Any]:
    """One stored example in fmt (check() first: the example must be of a method fmt fits)."""
    if fmt == "openai-chat":
        return {"messages": _openai(example["messages"])}
    if fmt == "openai-preference":
        return {
            "input": {"messages": _openai(example["prompt"])},
            "preferred_output": _openai(example["chosen"]),
            "non_preferred_output": _openai(example["rejected"]),
        }
    return example


def jsonl_lines(fmt: str, examples: Iterable[dict[str, Any]]) -> Iterator[str]:
    """One JSON document per line in fmt, keys sorted, non-ASCII kept."""
    for example in examples:
        yield json.dumps(convert(fmt, example), ensure_ascii=False, sort_keys=True) + "\n"


def _text(content: Any) -> Any:
    """A message's content as Parquet holds it: a string (text parts joined) or null."""
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            kind = part.get("type") if isinstance(part, dict) else None
            if kind != "text":
                raise BadRequest(
                    f"an example holds a {kind!r} content part, which Parquet's text columns"
                    " cannot: export this snapshot as JSONL (format cft)",
                    code="format_mismatch",
                    param="format",
                )
            texts.append(str(part.get("text", "")))
        return "".join(texts)
    return str(content)


def _columns(example: dict[str, Any]) -> dict[str, Any]:
    return {
        key: [m | {"content": _text(m.get("content"))} for m in value]
        if isinstance(value, list) and all(isinstance(m, dict) for m in value)
        else value
        for key, value in example.items()
    }


def parquet_bytes(examples: Iterable[dict[str, Any]]) -> bytes:
    """The examples as one Parquet file (one row each; messages as lists of structs)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [_columns(e) for e in examples]
    table = pa.Table.from_pylist(rows) if rows else pa.table({})
    buf = io.BytesIO()
    pq.write_table(table, buf)
    return buf.getvalue()


def dataset_card(splits: Iterable[str], config_name: str) -> str:
    """A README.md whose front matter names each split's file, so that
    `datasets.load_dataset(FOLDER)` reads the splits under their own names."""
    files = "".join(f"  - split: {s}\n    path: {s}.parquet\n" for s in splits)
    return (
        f"---\nconfigs:\n- config_name: {config_name}\n  data_files:\n"
        + files
        + "---\n\nA cft dataset snapshot, exported by `cft dataset export --format parquet`.\n"
    )


def write_parquet_folder(folder: Path, splits: dict[str, list[dict[str, Any]]]) -> dict[str, int]:
    """Write <split>.parquet for each split that has examples, and a README.md naming them,
    into folder; returns the examples written per split.

    The card's config is named after the files' content: `datasets` caches a folder's data
    under its config's name, so an export of other data into the same folder gets a name of
    its own instead of the cached rows of the last one.
    """
    folder.mkdir(parents=True, exist_ok=True)
    files = {split: parquet_bytes(rows) for split, rows in splits.items() if rows}
    for split in splits.keys() - files.keys():  # an empty split: no file of a past export
        (folder / f"{split}.parquet").unlink(missing_ok=True)
    digest = hashlib.sha256()
    for split, data in files.items():
        (folder / f"{split}.parquet").write_bytes(data)
        digest.update(split.encode() + b"\0" + hashlib.sha256(data).digest())
    (folder / "README.md").write_text(dataset_card(files, f"cft-{digest.hexdigest()[:16]}"))
    return {split: len(rows) for split, rows in splits.items() if rows}
