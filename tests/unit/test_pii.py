"""The PII detector: one case per detector, checksums reject look-alikes."""

from __future__ import annotations

import pytest

from app.logs import pii


@pytest.mark.parametrize(
    ("text", "flags"),
    [
        ("write to ana.lopez@example.com please", pii.EMAIL),
        ("call me on +34 612 345 678", pii.PHONE),
        ("tel (555) 123-4567", pii.PHONE),
        ("my card is 4111 1111 1111 1111", pii.CARD),
        ("IBAN GB82 WEST 1234 5698 7654 32", pii.IBAN),
        ("DE89370400440532013000", pii.IBAN),
        ("server 192.168.1.10 is down", pii.IPV4),
        ("via 2001:db8::1 today", pii.IPV6),
        ("mail a@b.io from 10.0.0.1", pii.EMAIL | pii.IPV4),
    ],
)
def test_each_detector_sets_its_bit(text: str, flags: int) -> None:
    assert pii.detect(text) == flags


@pytest.mark.parametrize(
    "text",
    [
        "how do I reset my password?",
        "card 4111 1111 1111 1112",  # fails Luhn
        "DE88370400440532013000",  # fails mod 97 (DE89... is valid)
        "version 999.1.1.1",  # octet out of range
        "meet at 12:30:45 on 2024-01-15",
        "order 12345",
    ],
)
def test_clean_text_and_checksum_failures_are_not_flagged(text: str) -> None:
    assert pii.detect(text) == 0


def test_names_of_a_bitmask() -> None:
    assert pii.names(pii.EMAIL | pii.CARD) == ["email", "card"]
