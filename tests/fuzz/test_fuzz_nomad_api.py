"""Nomad API answers: garbage never releases a grant; only NomadApiError comes out of the client."""

from __future__ import annotations

import json

from hypothesis import example, given, settings
from hypothesis import strategies as st

from nomad_plugin.reconcile.nomad_api import AllocView, parse_alloc
from tests.fuzz.checks import check_nomad_page
from tests.fuzz.strategies import DEADLINE, EXAMPLES, json_values, mutated

HELD = ("GPU-aaaa", "GPU-bbbb")
HOLDER = {
    "ID": "alloc-1",
    "ClientStatus": "running",
    "AllocatedResources": {"Tasks": {"t": {"Devices": [{"Vendor": "nvidia", "DeviceIDs": list(HELD)}]}}},
}


@settings(max_examples=EXAMPLES, deadline=DEADLINE)
@given(json_values)
@example({"ID": "a", "ClientStatus": "running", "AllocatedResources": "x"})
@example({"ID": "a", "ClientStatus": "running", "AllocatedResources": {"Tasks": {"t": "x"}}})
@example({"ID": "a", "ClientStatus": "running", "AllocatedResources": {"Tasks": {"t": {"Devices": [1]}}}})
def test_parse_alloc_returns_a_view_or_value_error(raw):
    try:
        view = parse_alloc(raw)
    except ValueError:
        return
    assert isinstance(view, AllocView) and all(isinstance(d, str) for d in view.device_ids)


@settings(max_examples=EXAMPLES, deadline=DEADLINE)
@given(st.binary(max_size=200))
def test_random_bytes_release_nothing(body):
    assert check_nomad_page(body, HELD, contains_live_holder=False) in ("error", "released", "kept")


@settings(max_examples=EXAMPLES, deadline=DEADLINE)
@given(json_values)
@example({"not": "a list"})
@example([{"ID": "x"}])
def test_random_json_pages(value):
    outcome = check_nomad_page(json.dumps(value).encode(), HELD, contains_live_holder=False)
    if not isinstance(value, list):
        assert outcome == "error"


@settings(max_examples=EXAMPLES, deadline=DEADLINE)
@given(st.lists(json_values, max_size=4), st.integers(min_value=0, max_value=4))
def test_page_still_showing_the_holder_never_releases(junk, at):
    page = list(junk)
    page.insert(min(at, len(page)), HOLDER)
    check_nomad_page(json.dumps(page).encode(), HELD, contains_live_holder=True)


# A drifted holder: its DeviceIDs no longer read as the list Nomad sends. Before the
# fix in reconcile/nomad_api.py a string was iterated character by character, the
# allocation "held" devices G, P, U, ... and its grant was released under it.
DRIFTED = [
    {**HOLDER, "AllocatedResources": {"Tasks": {"t": {"Devices": [{"DeviceIDs": "GPU-aaaa"}]}}}},
    {**HOLDER, "AllocatedResources": {"Tasks": {"t": {"Devices": [{"DeviceIDs": ["GPU-aaaa", 7]}]}}}},
    {**HOLDER, "AllocatedResources": {"Tasks": {"t": {"Devices": {"DeviceIDs": list(HELD)}}}}},
    {**HOLDER, "AllocatedResources": {"Tasks": {"t": ["Devices"]}}},
    {**HOLDER, "AllocatedResources": ["Tasks"]},
]


@settings(max_examples=EXAMPLES, deadline=DEADLINE)
@given(st.sampled_from(DRIFTED), st.lists(json_values, max_size=3))
def test_drifted_holder_is_an_error_not_a_release(holder, junk):
    assert check_nomad_page(json.dumps([holder, *junk]).encode(), HELD, contains_live_holder=True) == "error"


@settings(max_examples=EXAMPLES, deadline=DEADLINE)
@given(mutated(json.dumps([HOLDER]).encode()))
def test_mutated_holder_page(body):
    check_nomad_page(body, HELD, contains_live_holder=False)
