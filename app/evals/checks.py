"""The checks of task-suite cases: validated once when a suite is stored, run by the evaluator.

Patterns are tenant-written and run by the evaluator every tenant shares, so they go through
RE2 (google-re2), which matches in time linear in the text: a backtracking engine lets one
case such as `(.+)+Z` hold the evaluator for hours. JSON schemas validate with RE2 for
`pattern` too; `patternProperties` is refused (jsonschema matches its keys with Python's `re`).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import jsonschema
import re2
from jsonschema import Draft202012Validator, ValidationError, validators

MAX_PATTERN = 1000  # characters of one regex
MAX_EXPECTED_BYTES = 20_000  # the JSON of one case's expected value


class CheckError(ValueError):
    """A case's check cannot run as written; the message says what to fix."""


def _re2(pattern: str) -> Any:
    if len(pattern) > MAX_PATTERN:
        raise CheckError(f"the pattern is {len(pattern)} characters; at most {MAX_PATTERN}")
    try:
        return re2.compile(pattern)
    except re2.error as exc:
        raise CheckError(
            f"pattern {pattern[:80]!r} is not an RE2 expression ({exc}); RE2 has no"
            " backreferences or lookaround"
        ) from None


def _pattern(
    validator: Any, pattern: str, instance: Any, schema: dict[str, Any]
) -> Iterator[ValidationError]:
    if validator.is_type(instance, "string") and _re2(pattern).search(instance) is None:
        yield ValidationError(f"{instance[:80]!r} does not match {pattern[:80]!r}")


_Validator = validators.extend(Draft202012Validator, {"pattern": _pattern})  # type: ignore[no-untyped-call]


def _walk(schema: Any) -> Iterator[tuple[str, Any]]:
    if isinstance(schema, dict):
        for key, value in schema.items():
            yield key, value
            yield from _walk(value)
    elif isinstance(schema, list):
        for value in schema:
            yield from _walk(value)


def validate_case(kind: str, expected: Any) -> None:
    """Raise CheckError unless the case's check can run (bounded, linear-time patterns)."""
    if len(json.dumps(expected)) > MAX_EXPECTED_BYTES:
        raise CheckError(f"expected is larger than {MAX_EXPECTED_BYTES} bytes of JSON")
    if kind == "regex":
        if not isinstance(expected, str):
            raise CheckError("a regex check's expected value is the pattern, a string")
        _re2(expected)
    elif kind == "json_schema":
        if not isinstance(expected, dict):
            raise CheckError("a json_schema check's expected value is a JSON schema object")
        try:
            Draft202012Validator.check_schema(expected)
        except jsonschema.SchemaError as exc:
            raise CheckError(f"not a valid JSON schema: {exc.message}") from None
        for key, value in _walk(expected):
            if key == "patternProperties":
                raise CheckError("patternProperties is not supported: name the properties")
            if key == "pattern" and isinstance(value, str):
                _re2(value)
    elif kind == "max_length" and (
        not isinstance(expected, int) or isinstance(expected, bool) or expected < 0
    ):
        raise CheckError("a max_length check's expected value is a non-negative integer")


def check(kind: str, expected: Any, text: str) -> bool:
    """Whether one answer passes one case's check."""
    if kind == "exact":
        return text.strip() == str(expected).strip()
    if kind == "contains":
        needles = expected if isinstance(expected, list) else [expected]
        return all(str(n).lower() in text.lower() for n in needles)
    if kind == "regex":
        return _re2(str(expected)).search(text) is not None
    if kind == "max_length":
        return len(text) <= int(expected)
    if kind == "json_schema":
        try:
            _Validator(expected).validate(json.loads(text))
        except (ValueError, ValidationError, CheckError):
            return False
        return True
    raise ValueError(f"unknown check kind {kind!r}")
