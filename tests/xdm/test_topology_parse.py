"""parse_topology: the API reference's topology examples (GPU 0 of M890P and 810E) and property tests (R9)."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from nomad_plugin.model.card import Topology, TopologyLevel, parse_topology
from tests.seed_topologies import E810_GPU0, M890P_GPU0


def test_golden_m890p_gpu0() -> None:
    topo = parse_topology(M890P_GPU0)
    assert topo.error == ""
    assert topo.levels == (
        TopologyLevel(1, "pcieSwitches", (0,), (0, 1)),
        TopologyLevel(2, "numaNodes", (0,), (0, 1)),
        TopologyLevel(3, "cpuSockets", (0,), (0, 1, 2, 3)),
        TopologyLevel(11, "hyperNode", "hypernode-001", None),
        TopologyLevel(21, "leafSwitch", "asw-001", None),
        TopologyLevel(22, "pointOfDelivery", "pod-g13-p1", None),
    )
    assert topo.domain("leafSwitch") == "asw-001"
    assert topo.domain("pcieSwitches") == "0"


def test_golden_810e_gpu0() -> None:
    topo = parse_topology(E810_GPU0)
    assert topo.error == ""
    assert [lvl.name for lvl in topo.levels] == [
        "icnLink2",
        "icnLink4",
        "icnLink8",
        "pcieSwitches",
        "numaNodes",
        "cpuSockets",
        "leafSwitch",
        "pointOfDelivery",
    ]
    assert topo.level("icnLink2") == TopologyLevel(1, "icnLink2", (0,), (0, 3))
    assert topo.level("pcieSwitches") == TopologyLevel(4, "pcieSwitches", (4,), (0, 1, 2, 3))
    assert topo.level("numaNodes") == TopologyLevel(5, "numaNodes", (1,), (0, 1, 2, 3, 8, 9, 10, 11))
    assert topo.level("cpuSockets") == TopologyLevel(6, "cpuSockets", (0,), None)  # no peers in the seed
    assert topo.domain("pointOfDelivery") == "VM-SQA-G10-P2"
    assert topo.level("hyperNode") is None


def test_empty_and_none_give_empty_topology_without_error() -> None:
    assert parse_topology(None) == Topology()
    assert parse_topology("  ") == Topology()


def test_malformed_json_names_the_problem() -> None:
    topo = parse_topology('{"levels": [')
    assert topo.levels == () and "not valid JSON" in topo.error


def test_wrong_shapes_are_errors_not_exceptions() -> None:
    assert "JSON object" in parse_topology("[1,2]").error
    assert 'no "levels"' in parse_topology("{}").error
    assert "must be a list" in parse_topology('{"levels": 3}').error


def test_single_int_topo_and_unknown_level_kept() -> None:
    text = json.dumps(
        {"levels": [{"level": 15, "name": "rack2", "topo15": 7}, {"level": 1, "name": "x", "topo1": [2]}]}
    )
    topo = parse_topology(text)
    assert topo.error == ""
    assert topo.levels == (TopologyLevel(1, "x", (2,), None), TopologyLevel(15, "rack2", (7,), None))


def test_levels_missing_name_or_level_are_skipped_with_a_note() -> None:
    text = json.dumps(
        {
            "levels": [
                {"name": "noLevel", "topo1": [0]},
                {"level": 2, "topo2": [0]},
                {"level": 3, "name": "ok", "topo3": "a"},
            ]
        }
    )
    topo = parse_topology(text)
    assert [lvl.name for lvl in topo.levels] == ["ok"]
    assert "levels[0]" in topo.error and "levels[1]" in topo.error


def test_deeply_nested_json_does_not_raise() -> None:
    topo = parse_topology("[" * 100000 + "]" * 100000)
    assert topo.levels == () and topo.error


_domain = st.one_of(
    st.lists(st.integers(-5, 64), max_size=4),
    st.text(min_size=1, max_size=12),
    st.integers(0, 64),
)


@st.composite
def _level(draw: st.DrawFn) -> dict[str, object]:
    number = draw(st.integers(0, 40))
    item: dict[str, object] = {"level": number, "name": draw(st.text(min_size=1, max_size=10).filter(str.strip))}
    item[f"topo{number}"] = draw(_domain)
    if draw(st.booleans()):
        item["peers"] = draw(st.lists(st.integers(0, 15), max_size=8))
    return item


@settings(max_examples=150, deadline=None)
@given(st.lists(_level(), max_size=8), st.randoms())
def test_any_order_is_sorted_and_everything_kept(levels: list[dict[str, object]], rnd: object) -> None:
    shuffled = list(levels)
    rnd.shuffle(shuffled)  # type: ignore[attr-defined]
    topo = parse_topology(json.dumps({"levels": shuffled}))
    assert topo.error == ""
    assert [lvl.level for lvl in topo.levels] == sorted(int(lv["level"]) for lv in levels)  # type: ignore[call-overload]
    for raw in levels:
        number = raw["level"]
        match = [lvl for lvl in topo.levels if lvl.level == number and lvl.name == raw["name"]]
        assert match
        value = raw[f"topo{number}"]
        expected = value if isinstance(value, str) else tuple(value) if isinstance(value, list) else (value,)
        assert any(lvl.domain == expected for lvl in match)
        if "peers" not in raw:
            assert any(lvl.peers is None for lvl in match)


_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(
    st.one_of(
        st.text(max_size=200), _json_values.map(json.dumps), _json_values.map(lambda v: json.dumps({"levels": v}))
    )
)
def test_bad_topology_never_raises(text: str) -> None:
    topo = parse_topology(text)
    assert isinstance(topo, Topology)
    assert [lvl.level for lvl in topo.levels] == sorted(lvl.level for lvl in topo.levels)
