"""The journal file: random and mutated bytes are detected, set aside intact, never crash, never lose an entry."""

from __future__ import annotations

import json

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from nomad_plugin.journal import EntryState, JournalEntry
from nomad_plugin.journal.store import encode
from nomad_plugin.model.grant import DeviceAsk, GrantedDevice
from tests.fuzz.checks import check_journal_bytes
from tests.fuzz.strategies import DEADLINE, EXAMPLES, json_values, mutated

ENTRIES = [
    JournalEntry(
        grant_id=f"g-{n}",
        device_ids=(f"GPU-{n}-share-0", f"GPU-{n}-share-1"),
        group="nvidia/gpu/H800 share",
        kind="share",
        cards=(f"GPU-{n}",),
        asks=(DeviceAsk(minor=n, core=50, memory_gib=40),),
        created_at=1.7e9 + n,
        state=EntryState.GRANTED,
        granted=(GrantedDevice(minor=n, uuid=f"GPU-{n}", core=50, memory_gib=40),),
    )
    for n in range(3)
]
VALID = encode(ENTRIES)
SETTINGS = settings(max_examples=EXAMPLES // 2, deadline=DEADLINE, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(st.binary(max_size=300))
@example(b"")
@example(b"\xff\xfe{}")
def test_random_bytes(data):
    check_journal_bytes(data)


@SETTINGS
@given(mutated(VALID))
@example(VALID)
@example(VALID[:-1])
def test_mutated_valid_journal(data):
    check_journal_bytes(data)


@SETTINGS
@given(st.lists(json_values, max_size=3))
def test_checksummed_but_wrong_entries(body):
    # A correct checksum over wrong entries must still be refused, entry by entry.
    from nomad_plugin.journal.store import checksum

    data = json.dumps({"version": 1, "checksum": checksum(body), "entries": body}).encode()
    check_journal_bytes(data)
