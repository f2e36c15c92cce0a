"""The node metadata publisher against the Nomad API double (one client agent).

Writes only what differs, unsets vanished keys, never touches keys outside
its prefix, survives an agent restart, spaces its writes, and fails soft:
a 403 is logged once and the thread carries on.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from nomad_plugin.config.model import PluginConfig
from nomad_plugin.model.card import Inventory, node_meta, parse_topology
from nomad_plugin.reconcile.node_meta import NodeMetaPublisher, load_publisher_state
from nomad_plugin.reconcile.nomad_api import NomadApiSettings, NomadClient
from tests.doubles.nomad_api import NomadApiDouble
from tests.topology.test_node_meta_keys import sim_inventory
from tests.waiting import wait_until

LOGGER = "nomad_plugin.reconcile.node_meta"


class Source:
    """The backend's ``inventory()``, changed by the test."""

    def __init__(self, inventory: Inventory) -> None:
        self.inventory = inventory

    def __call__(self) -> Inventory:
        return self.inventory


@pytest.fixture
def api() -> Iterator[NomadApiDouble]:
    with NomadApiDouble(static_meta={"rack": "r1"}, meta_batch=(0.05, 0.05)) as double:
        yield double


def publisher(api: NomadApiDouble, source: Source, token: str = "", **kw: object) -> NodeMetaPublisher:
    client = NomadClient(NomadApiSettings(address=api.address, token=token))
    options: dict[str, object] = {"refresh_period": 60.0, "settle": 0.0, "min_interval": 0.0, **kw}
    return NodeMetaPublisher(client, source, PluginConfig(node_meta=True), **options)  # type: ignore[arg-type]


def with_leaf(inventory: Inventory, leaf: str | None) -> Inventory:
    """Every card moved behind ``leaf`` (None: the level disappears)."""
    cards = []
    for card in inventory.cards:
        levels = [
            {"level": lvl.level, "name": lvl.name, f"topo{lvl.level}": lvl.domain}
            for lvl in card.topology.levels
            if lvl.name != "leafSwitch"
        ]
        if leaf is not None:
            levels.append({"level": 21, "name": "leafSwitch", "topo21": leaf})
        cards.append(replace(card, topology=parse_topology(json.dumps({"levels": levels}))))
    return replace(inventory, cards=tuple(cards))


def test_writes_everything_once_then_only_what_changed(api: NomadApiDouble) -> None:
    source = Source(sim_inventory("m890p-8"))
    pub = publisher(api, source)
    try:
        assert pub.sync() is True
        wanted = dict(node_meta(source.inventory, PluginConfig()).keys)
        assert api.meta.posts == [wanted]
        assert pub.sync() is False and len(api.meta.posts) == 1  # nothing differs: no write

        source.inventory = with_leaf(source.inventory, "asw-009")
        assert pub.sync() is True
        assert api.meta.posts[-1] == {"lingjun.leaf_switch": "asw-009"}

        source.inventory = with_leaf(source.inventory, None)
        pub.sync()
        assert api.meta.posts[-1] == {"lingjun.leaf_switch": None}
        meta = api.meta.read()["Meta"]
        assert "lingjun.leaf_switch" not in meta and meta["lingjun.hyper_node"] == "hypernode-001"
    finally:
        pub.stop()


def test_keys_outside_the_prefix_are_never_written(api: NomadApiDouble) -> None:
    api.meta.apply({"lingjunx.other": "mine", "team": "ml", "lingjun.stale": "old"})
    pub = publisher(api, Source(sim_inventory("h800-8")))
    try:
        pub.sync()
        written = {k for post in api.meta.posts[1:] for k in post}
        assert all(k.startswith("lingjun.") for k in written)
        assert api.meta.posts[-1]["lingjun.stale"] is None
        meta = api.meta.read()["Meta"]
        assert meta["lingjunx.other"] == "mine" and meta["team"] == "ml" and meta["rack"] == "r1"
    finally:
        pub.stop()


def test_nothing_is_published_or_unset_before_the_backend_answers(api: NomadApiDouble) -> None:
    api.meta.apply({"lingjun.card_count": "8"})  # what the previous plugin process wrote
    source = Source(Inventory(reachable=False, unreachable_reason="socket-missing: no dp2mgr.sock"))
    pub = publisher(api, source)
    try:
        assert pub.sync() is False
        assert not any("client/metadata" in path for path, _ in api.requests)
        assert api.meta.read()["Meta"]["lingjun.card_count"] == "8"
    finally:
        pub.stop()


def test_an_agent_restart_keeps_the_keys_and_a_lost_state_is_written_again(api: NomadApiDouble) -> None:
    source = Source(sim_inventory("810e-16"))
    pub = publisher(api, source)
    try:
        pub.sync()
        api.restart_agent()
        assert pub.sync() is False  # Nomad persisted them: nothing to write
        api.restart_agent(lose_state=True)
        assert pub.sync() is True
        assert api.meta.posts[-1] == api.meta.posts[0]
    finally:
        pub.stop()


def test_the_thread_follows_changes_and_refreshes(api: NomadApiDouble, tmp_path: Path) -> None:
    source = Source(sim_inventory("h800-8"))
    pub = publisher(api, source, refresh_period=0.2, state_file=tmp_path / "node-meta-state.json")
    pub.start()
    try:
        wait_until(lambda: api.registered_meta().get("lingjun.point_of_delivery") == "pod-a01-p1", "first publish")
        source.inventory = with_leaf(source.inventory, "asw-777")
        pub.notify()
        wait_until(lambda: api.registered_meta().get("lingjun.leaf_switch") == "asw-777", "the change")
        api.restart_agent(lose_state=True)
        wait_until(lambda: api.registered_meta().get("lingjun.leaf_switch") == "asw-777", "the refresh rewrite")
        state = load_publisher_state(tmp_path / "node-meta-state.json")
        assert state is not None and state.in_sync and state.wanted["lingjun.leaf_switch"] == "asw-777"
    finally:
        pub.stop()


def test_writes_are_spaced_by_the_minimum_interval(api: NomadApiDouble) -> None:
    now = [100.0]
    source = Source(sim_inventory("h800-8"))
    pub = publisher(api, source, min_interval=5.0, clock=lambda: now[0])
    waits: list[float] = []

    def waited(timeout: float | None = None) -> bool:  # the stop event's wait, on the fake clock
        waits.append(timeout or 0.0)
        now[0] += timeout or 0.0
        return False

    pub._stop.wait = waited  # type: ignore[method-assign]
    try:
        pub.sync()
        now[0] += 1.0
        source.inventory = with_leaf(source.inventory, "asw-002")
        pub.sync()
        assert waits == [pytest.approx(4.0)]
        assert len(api.meta.posts) == 2
    finally:
        pub._stop.set()
        pub.stop()


def test_a_token_without_node_write_is_reported_once_and_the_thread_goes_on(
    api: NomadApiDouble, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    api.enable_acls()
    api.add_policy("reader", 'node { policy = "read" }')
    api.add_token("read-token", ["reader"])
    source = Source(sim_inventory("h800-8"))
    path = tmp_path / "node-meta-state.json"
    pub = publisher(api, source, "read-token", forbidden_retry=0.05, state_file=path)
    with caplog.at_level(logging.INFO, logger=LOGGER):
        pub.start()
        try:
            wait_until(lambda: pub.rounds >= 5, "several rounds against the 403")
            errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
            assert len(errors) == 1, errors
            assert "node:write" in errors[0] and 'node { policy = "write" }' in errors[0]
            assert "keeps serving" in errors[0] and "node-meta" in errors[0]
            state = load_publisher_state(path)
            assert state is not None and not state.in_sync and "node:write" in state.hint

            api.add_policy("reader", 'node { policy = "write" }')  # the operator fixes the policy
            wait_until(lambda: api.meta.read()["Meta"].get("lingjun.model") == "NVIDIA H800", "publishing again")
            # The write lands before the line that says so: wait for the line too.
            wait_until(lambda: any("publishing again" in r.getMessage() for r in caplog.records), "the log line")
        finally:
            pub.stop()


def test_a_token_without_node_read_names_node_read(api: NomadApiDouble, caplog: pytest.LogCaptureFixture) -> None:
    api.enable_acls()
    api.add_token("no-rights", [])
    pub = publisher(api, Source(sim_inventory("h800-8")), "no-rights", forbidden_retry=0.05)
    with caplog.at_level(logging.ERROR, logger=LOGGER):
        pub.start()
        try:
            wait_until(lambda: pub.rounds >= 3, "several rounds against the 403")
        finally:
            pub.stop()
    errors = [r.getMessage() for r in caplog.records]
    assert len(errors) == 1 and "lacks node:read" in errors[0], errors


def test_an_unreachable_agent_backs_off_and_recovers(api: NomadApiDouble) -> None:
    source = Source(sim_inventory("h800-8"))
    api.set_down(True)
    pub = publisher(api, source)
    pub.backoff = replace(pub.backoff, initial=0.05, cap=0.1)
    pub.start()
    try:
        wait_until(lambda: pub.state.last_error, "the first failure")
        api.set_down(False)
        wait_until(lambda: pub.state.in_sync, "recovery")
        assert api.meta.read()["Meta"]["lingjun.card_count"] == "8"
    finally:
        pub.stop()


def test_level_keys_are_kept_until_the_topology_arrives(api: NomadApiDouble) -> None:
    """A restarted plugin whose XDM has answered ListGpuInfo but not yet pushed ListAndWatch."""
    full = sim_inventory("m890p-8")
    api.meta.apply(dict(node_meta(full, PluginConfig()).keys))  # what the last process published
    bare = replace(full, cards=tuple(replace(c, topology=parse_topology(None)) for c in full.cards))
    source = Source(bare)
    pub = publisher(api, source)
    try:
        pub.sync()
        meta = api.meta.read()["Meta"]
        assert meta["lingjun.point_of_delivery"] == "pod-g13-p1" and meta["lingjun.hyper_node"] == "hypernode-001"
        source.inventory = with_leaf(full, "asw-002")
        pub.sync()
        assert api.meta.posts[-1] == {"lingjun.leaf_switch": "asw-002"}
    finally:
        pub.stop()
