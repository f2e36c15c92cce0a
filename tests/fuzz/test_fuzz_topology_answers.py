"""Nomad's node metadata and node answers: garbage gives the parsers' own error, never a wrong reading."""

from __future__ import annotations

from hypothesis import example, given, settings

from nomad_plugin.cli.topology import ClusterDataError, ClusterNode, cluster_topology, parse_node
from nomad_plugin.reconcile.nomad_api import NodeMetaView, NomadApiError, parse_node_meta
from tests.fuzz.strategies import DEADLINE, EXAMPLES, json_values


@settings(max_examples=EXAMPLES, deadline=DEADLINE)
@given(json_values)
@example({"Meta": {"a": 1}})
@example({"Meta": {}, "Dynamic": {"a": None}, "Static": {"b": None}})
@example({"Dynamic": ["x"]})
def test_node_meta_answer_parses_or_is_a_bad_response(raw):  # type: ignore[no-untyped-def]
    try:
        view = parse_node_meta(raw)
    except NomadApiError as exc:
        assert exc.kind == "bad-response"
        return
    assert isinstance(view, NodeMetaView)
    assert all(isinstance(v, str) for v in (*view.meta.values(), *view.static.values()))


@settings(max_examples=EXAMPLES, deadline=DEADLINE)
@given(json_values)
@example({"ID": "n", "NodeResources": {"Devices": [{"Instances": "x"}]}})
@example({"ID": "n", "NodeResources": {"Devices": [{"Instances": [{"ID": "a", "Healthy": "yes"}]}]}})
@example({"ID": "n", "Meta": ["x"]})
def test_node_answer_parses_or_is_a_cluster_data_error(raw):  # type: ignore[no-untyped-def]
    try:
        node = parse_node(raw)
    except ClusterDataError:
        return
    assert isinstance(node, ClusterNode)
    found = cluster_topology([node], {node.id: ["a"]})
    for level in found.domains.values():
        for domain in level:
            for counts in domain.totals().values():
                assert 0 <= counts.free <= counts.healthy <= counts.cards
