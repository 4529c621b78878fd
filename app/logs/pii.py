"""A small, fast PII detector for inference logs: a bitmask stored in obs.inference_log.pii_flags.

Rows with any flag never enter training sets, so the detector errs towards flagging. Each
detector is a regex that finds candidates plus, where a checksum exists, a validator that
drops false positives (Luhn for cards, ISO 7064 mod 97 for IBANs, octet ranges for IPv4,
`ipaddress` for IPv6). A cheap character test skips each regex on text that cannot match,
so clean text costs a few microseconds. Add a detector by appending to DETECTORS with a new
bit (smallint column: bits 0-14).

The patterns run on RE2 (google-re2), which matches in time linear in the text: user text
reaches this detector from every ingest path (REST, OTLP, the router's log writer), and a
backtracking engine turns input such as "@" + "a" * N into quadratic work that holds the GIL.
RE2's digit class is ASCII only, as the checksums below assume. A detector looks at no more
than MAX_CANDIDATES candidates of one text: past that it sets its bit (erring towards
flagging), so the Python work per text is bounded too.

| bit | value | name  | what matches |
|-----|-------|-------|--------------|
| 0   | 1     | email | local@domain.tld |
| 1   | 2     | phone | 9-15 digits with an optional leading +, spaces, dashes or () |
| 2   | 4     | card  | 13-19 digits (spaces or dashes allowed) passing the Luhn check |
| 3   | 8     | iban  | 2 letters, 2 check digits, 11-30 alphanumerics passing mod 97 |
| 4   | 16    | ipv4  | dotted quad, each octet 0-255 |
| 5   | 32    | ipv6  | a valid IPv6 address (at least two colons) |
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import re2

EMAIL = 1
PHONE = 2
CARD = 4
IBAN = 8
IPV4 = 16
IPV6 = 32

_DIGITS = "0123456789"


def _digit_count(text: str) -> int:
    # Ten str.count scans run at C speed; a regex `\d` scan is several times slower.
    return sum(map(text.count, _DIGITS))


def _luhn(digits: str) -> bool:
    total = 0
    for i, ch in enumerate(reversed(digits)):
        d = ord(ch) - 48
        if i % 2:
            d = d * 2 - 9 if d > 4 else d * 2
        total += d
    return total % 10 == 0


def _card(match: str) -> bool:
    digits = match.replace(" ", "").replace("-", "")
    return 13 <= len(digits) <= 19 and _luhn(digits)


def _iban(match: str) -> bool:
    s = match.replace(" ", "").upper()
    if not 15 <= len(s) <= 34:
        return False
    moved = s[4:] + s[:4]
    return int("".join(str(int(c, 36)) for c in moved)) % 97 == 1


def _phone(match: str) -> bool:
    n = sum(c.isdigit() for c in match)
    return 9 <= n <= 15


def _ipv4(match: str) -> bool:
    return all(int(part) <= 255 for part in match.split("."))


def _ipv6(match: str) -> bool:
    try:
        ipaddress.IPv6Address(match)
    except ValueError:
        return False
    return True


@dataclass(frozen=True)
class Detector:
    """One kind of PII: its bit, a regex for candidates and an optional validator."""

    name: str
    bit: int
    pattern: Any  # a compiled re2 pattern
    valid: Callable[[str], bool] | None = None
    # Cheap pre-test on the whole text and its number of digits: skip the regex when False.
    needs: Callable[[str, int], bool] | None = None
    consume: bool = False  # blank out valid matches before the next detectors run


DETECTORS: list[Detector] = [
    Detector(
        "email",
        EMAIL,
        re2.compile(r"[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+\.[A-Za-z]{2,}"),
        needs=lambda t, _: "@" in t,
    ),
    Detector(
        "ipv6",
        IPV6,
        re2.compile(r"[0-9A-Fa-f]*:[0-9A-Fa-f:]*:[0-9A-Fa-f]*"),
        _ipv6,
        needs=lambda t, _: t.count(":") >= 2,
    ),
    # Cards and IBANs are removed from the text once found, so their digits are not also
    # reported as a phone number.
    Detector(
        "card",
        CARD,
        re2.compile(r"\d(?:[ -]?\d){12,18}"),
        _card,
        needs=lambda _, n: n >= 13,
        consume=True,
    ),
    Detector(
        "iban",
        IBAN,
        re2.compile(r"[A-Za-z]{2}\d{2}(?: ?[A-Za-z0-9]){11,30}"),
        _iban,
        needs=lambda _, n: n >= 4,
        consume=True,
    ),
    Detector(
        "ipv4",
        IPV4,
        re2.compile(r"\d{1,3}\.\d{1,3}\.\d{1,3}\.\d{1,3}"),
        _ipv4,
        needs=lambda t, n: n >= 4 and t.count(".") >= 3,
        consume=True,
    ),
    Detector(
        "phone",
        PHONE,
        re2.compile(r"[+(\d][\d ()-]{7,20}\d"),
        _phone,
        needs=lambda _, n: n >= 9,
    ),
]

NAMES = {d.bit: d.name for d in DETECTORS}
# Candidates one detector validates in one text; ordinary text has a handful at most.
MAX_CANDIDATES = 1000


def _blank(text: str, spans: list[tuple[int, int]]) -> str:
    """text with each span replaced by spaces (one pass, whatever the number of spans)."""
    parts: list[str] = []
    at = 0
    for start, end in spans:
        parts += (text[at:start], " " * (end - start))
        at = end
    parts.append(text[at:])
    return "".join(parts)


def detect(text: str) -> int:
    """The PII bitmask of text (0 when nothing was found); linear in len(text)."""
    flags = 0
    digits = _digit_count(text)
    for d in DETECTORS:
        if d.needs is not None and not d.needs(text, digits):
            continue
        consumed: list[tuple[int, int]] = []
        for seen, m in enumerate(d.pattern.finditer(text)):
            if seen == MAX_CANDIDATES:
                flags |= d.bit
                break
            if d.valid is None or d.valid(m.group()):
                flags |= d.bit
                if not d.consume:
                    break
                consumed.append((m.start(), m.end()))
        if consumed:
            text = _blank(text, consumed)
    return flags


def names(flags: int) -> list[str]:
    """The detector names of a bitmask."""
    return [name for bit, name in NAMES.items() if flags & bit]
