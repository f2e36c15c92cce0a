"""Topology JSON from XDM's extenderResources: never raises, whatever arrives."""

from __future__ import annotations

import json

from hypothesis import example, given, settings
from hypothesis import strategies as st

from tests.fuzz.checks import check_topology
from tests.fuzz.strategies import DEADLINE, EXAMPLES, json_values, mutated

SEED = json.dumps(
    {
        "numaNodes": [{"id": 0, "devices": [0, 1, 2, 3]}, {"id": 1, "devices": [4, 5, 6, 7]}],
        "pcieSwitches": [{"id": "sw0", "devices": [0, 1]}],
        "topo3": {"0": [1, 2], "1": [0]},
    }
).encode()


@settings(max_examples=EXAMPLES, deadline=DEADLINE)
@given(st.one_of(st.text(max_size=200), st.none()))
@example('{"numaNodes": 1e999}')
@example('{"numaNodes": [{"id": 1e400, "devices": [NaN, Infinity]}]}')
@example("[" * 5000 + "]" * 5000)
def test_random_text(text):
    check_topology(text)


@settings(max_examples=EXAMPLES, deadline=DEADLINE)
@given(json_values)
def test_random_json(value):
    check_topology(json.dumps(value))


@settings(max_examples=EXAMPLES, deadline=DEADLINE)
@given(mutated(SEED))
def test_mutated_seed(data):
    check_topology(data.decode("utf-8", "replace"))


# The shape parse_topology reads today: a "levels" list, given far level first.
LEVELS_SEED = json.dumps(
    {
        "levels": [
            {"level": 5, "name": "rack", "topo5": "rack-07"},
            {"level": 2, "name": "pcie-switch", "topo2": [0, 1], "peers": [1]},
            {"level": 1, "name": "nvlink", "topo1": 0},
        ]
    }
).encode()


@settings(max_examples=EXAMPLES, deadline=DEADLINE)
@given(mutated(LEVELS_SEED))
@example(LEVELS_SEED)
def test_mutated_levels_seed(data):
    check_topology(data.decode("utf-8", "replace"))
