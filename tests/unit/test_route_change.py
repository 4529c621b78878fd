"""Parsing NOTIFY cft_route, and whether its snapshot sees an earlier transaction."""

from __future__ import annotations

import json
from decimal import Decimal

from app.gateway.table import Change

STATE = {
    "name": "r",
    "tenant_id": 7,
    "base_model": "m",
    "experiment": None,
    "prod": "r-v1",
    "canaries": [{"id": "r-v2", "traffic_pct": "12.50", "created_at": "2026-12-02T04:40:08+00:00"}],
}


def payload(**over: object) -> str:
    return json.dumps(
        {"tenant_id": 7, "route": "r", "xid": "105", "snapshot": "100:110:101,104"} | over
    )


def test_a_full_payload_carries_the_state():
    change = Change.parse(payload(state=STATE))
    assert change.complete and change.route == (7, "r") and change.xid == 105
    assert change.state is not None and change.state.prod == "r-v1"
    assert change.state.canaries[0].traffic_pct == Decimal("12.50")


def test_a_deleted_route_is_a_complete_change_to_none():
    change = Change.parse(payload(state=None))
    assert change.complete and change.state is None


def test_a_route_alone_means_read_it_and_garbage_names_no_route():
    # Too large for a NOTIFY: the tenant and the route, to read.
    assert Change.parse('{"tenant_id": 7, "route": "r"}') == Change((7, "r"))
    # A route is named by its tenant and its name (names are unique per tenant only): a
    # payload without both says only that something changed.
    assert Change.parse('{"route": "r"}') == Change(None)
    assert Change.parse("r") == Change(None)
    assert not Change.parse("[1]").complete


def test_sees_follows_the_snapshot():
    change = Change.parse(payload(state=STATE))
    assert change.sees(99)  # before xmin: committed before the snapshot
    assert change.sees(102) and change.sees(103)  # below xmax, not running
    assert not change.sees(101) and not change.sees(104)  # running at the snapshot
    assert not change.sees(110) and not change.sees(200)  # at or after xmax
    assert change.sees(105)  # its own transaction
    assert not Change((7, "r")).sees(1)
