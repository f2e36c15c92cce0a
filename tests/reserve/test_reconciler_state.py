"""``reconciler-state.json`` and the lifecycle counters: what ``grants`` and a restarted plugin read back.

The state file is the evidence a plugin restarted after SIGKILL uses to
release a grant whose allocation ended while it was down, and what
``nomad-device-lingjun grants`` shows while the plugin runs; the counters
feed the stats and Prometheus layer. Every field must survive the trip.
"""

from __future__ import annotations

import json
import os
from dataclasses import fields, replace
from pathlib import Path

import pytest

from nomad_plugin.reconcile.nomad_api import AllocView
from nomad_plugin.reconcile.reconciler import (
    Claim,
    LifecycleCounters,
    ReconcilerState,
    reconciler_state_path,
)


def full_state() -> ReconcilerState:
    """Every field set, none to its default."""
    return ReconcilerState(
        updated_at=1_700_000_123.5,
        grace=7.25,
        view_complete=False,
        view_reason="token lacks read-job in team-a",
        claims={"g-1": Claim("alloc-1", "team-a", "train"), "g-2": Claim("alloc-2", "default", "serve")},
        release_at={"g-3": 1_700_000_130.75},
        unverifiable=["g-4", "g-5"],
        allocs=[
            AllocView("alloc-1", "running", frozenset({"U2", "U1"}), "team-a", "train", 1_700_000_100.0),
            AllocView("alloc-9", "complete", frozenset(), "default", "batch", 1_700_000_050.5),
        ],
        leaked=["alloc-7"],
        pid=4242,
    )


DOCUMENT = {
    "version": 1,
    "pid": 4242,
    "updated_at": 1_700_000_123.5,
    "grace": 7.25,
    "view_complete": False,
    "view_reason": "token lacks read-job in team-a",
    "claims": {
        "g-1": {"alloc_id": "alloc-1", "namespace": "team-a", "job": "train"},
        "g-2": {"alloc_id": "alloc-2", "namespace": "default", "job": "serve"},
    },
    "release_at": {"g-3": 1_700_000_130.75},
    "unverifiable": ["g-4", "g-5"],
    "leaked": ["alloc-7"],
    "allocs": [
        {
            "id": "alloc-1",
            "namespace": "team-a",
            "job": "train",
            "client_status": "running",
            "modify_time": 1_700_000_100.0,
            "device_ids": ["U1", "U2"],
        },
        {
            "id": "alloc-9",
            "namespace": "default",
            "job": "batch",
            "client_status": "complete",
            "modify_time": 1_700_000_050.5,
            "device_ids": [],
        },
    ],
}


def test_the_file_lives_in_data_dir(tmp_path: Path) -> None:
    assert reconciler_state_path(tmp_path) == tmp_path / "reconciler-state.json"
    assert reconciler_state_path(str(tmp_path)) == tmp_path / "reconciler-state.json"


def test_every_field_survives_save_and_load(tmp_path: Path) -> None:
    path = reconciler_state_path(tmp_path)
    full_state().save(path)
    assert ReconcilerState.load(path) == full_state()
    complete = replace(full_state(), view_complete=True, view_reason="")
    complete.save(path)
    assert ReconcilerState.load(path) == complete


def test_from_json_names_what_it_refuses() -> None:
    with pytest.raises(ValueError) as info:
        ReconcilerState.from_json({**DOCUMENT, "version": 2})
    assert str(info.value) == "not a reconciler state of version 1"


def test_the_document_on_disk(tmp_path: Path) -> None:
    """Version 1, sorted keys (a stable file to diff), device ids sorted, readable by the owner only."""
    path = reconciler_state_path(tmp_path)
    full_state().save(path)
    text = path.read_text()
    assert json.loads(text) == DOCUMENT
    assert text == json.dumps(DOCUMENT, sort_keys=True)
    assert path.stat().st_mode & 0o777 == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["reconciler-state.json"], "temp file left behind"


def test_a_longer_leftover_temp_file_is_overwritten_not_patched(tmp_path: Path) -> None:
    """A killed writer's temp file (same pid: pid 1 in a container) must not leave its tail in the new file."""
    path = reconciler_state_path(tmp_path)
    (tmp_path / f"reconciler-state.json.tmp-{os.getpid()}").write_text("x" * 100_000)
    full_state().save(path)
    assert ReconcilerState.load(path) == full_state()


def test_the_pid_defaults_to_the_writing_process() -> None:
    state = ReconcilerState(updated_at=1.0, grace=5.0, view_complete=True, view_reason="")
    assert state.pid == os.getpid()
    assert (state.claims, state.release_at, state.unverifiable, state.allocs, state.leaked) == ({}, {}, [], [], [])


def test_a_file_without_leaked_reads_as_none_leaked(tmp_path: Path) -> None:
    """Files written before the leaked list existed still load."""
    path = reconciler_state_path(tmp_path)
    doc = {k: v for k, v in DOCUMENT.items() if k != "leaked"}
    path.write_text(json.dumps(doc))
    state = ReconcilerState.load(path)
    assert state is not None and state.leaked == [] and state.claims == full_state().claims


@pytest.mark.parametrize(
    "content",
    [
        None,  # no file
        "{not json",
        "[]",
        json.dumps({**DOCUMENT, "version": 2}),
        json.dumps({k: v for k, v in DOCUMENT.items() if k != "version"}),
        json.dumps({k: v for k, v in DOCUMENT.items() if k != "claims"}),
        json.dumps({**DOCUMENT, "claims": {"g-1": {"alloc_id": "a"}}}),
        json.dumps({**DOCUMENT, "grace": "soon"}),
        json.dumps({**DOCUMENT, "unverifiable": 3}),
    ],
    ids=[
        "missing",
        "not-json",
        "not-a-map",
        "version-2",
        "no-version",
        "no-claims",
        "short-claim",
        "bad-float",
        "bad-list",
    ],
)
def test_an_unreadable_file_means_nothing_known(tmp_path: Path, content: str | None) -> None:
    path = reconciler_state_path(tmp_path)
    if content is not None:
        path.write_text(content)
    assert ReconcilerState.load(path) is None


def test_counter_snapshot_holds_every_counter() -> None:
    counters = LifecycleCounters()
    names = [f.name for f in fields(LifecycleCounters) if not f.name.startswith("_")]
    assert counters.snapshot() == dict.fromkeys(names, 0)
    for n, name in enumerate(names, start=1):
        counters.inc(name, by=n)
    counters.inc("nomad_api_errors")  # default step 1
    counters.set("view_incomplete", 1)  # a gauge is set, not added to
    expected = {name: n for n, name in enumerate(names, start=1)}
    expected["nomad_api_errors"] += 1
    expected["view_incomplete"] = 1
    assert counters.snapshot() == expected
