"""An empty allocation list means "nothing runs here" only for a node Nomad knows, on this host.

Nomad's ``/v1/node/<id>/allocations`` answers ``200 []`` for a node ID it has
never seen (``Node.GetAllocs`` reads ``AllocsByNode`` without looking the
node up), so a wrong ``nomad_node_id`` used to release every grant after the
grace period. ``GET /v1/node/<id>`` (``Node.GetNode``: 404 "node not found")
is checked first, with the ``node:read`` the list needs anyway.
"""

from __future__ import annotations

import uuid

import pytest

from nomad_plugin.config.model import PluginConfig
from nomad_plugin.journal import Journal
from nomad_plugin.nomad.reserve import Reserver
from nomad_plugin.reconcile.nomad_api import NomadApiError, NomadApiSettings, NomadClient
from nomad_plugin.reconcile.reconciler import Reconciler
from tests.doubles.nomad_api import NomadApiDouble
from tests.doubles.reserve_fakes import Clock, FakeBackend, card_uuid, catalog, whole_group

CAT = catalog(whole_group(4))
DOCUMENTED = 'namespace "*" { capabilities = ["read-job"] }\nnode { policy = "read" }\n'


def rig(tmp_path, api: NomadApiDouble, node_id: str, token: str = "", hostname: str | None = None):
    backend = FakeBackend()
    reserver = Reserver(backend, lambda: CAT, Journal(tmp_path), PluginConfig(), path_exists=lambda p: False)
    client = NomadClient(NomadApiSettings(address=api.address, token=token, timeout=10.0))
    clock = Clock()
    rec = Reconciler(
        reserver, client, lambda: CAT, grace=5.0, node_id=node_id, max_wait=0.2, clock=clock, hostname=hostname
    )
    gid = reserver.reserve([card_uuid(0)]).container_res.envs["LINGJUN_GRANT_ID"]
    return reserver, backend, rec, clock, gid


def rounds(rec: Reconciler, clock: Clock, n: int = 4) -> list[NomadApiError]:
    errors = []
    for _ in range(n):
        try:
            rec.round()
        except NomadApiError as exc:
            errors.append(exc)
        clock.now += 60  # far past the grace period
    return errors


def test_an_unknown_node_id_releases_nothing_and_says_why(tmp_path) -> None:
    with NomadApiDouble() as api:
        wrong = str(uuid.uuid4())
        reserver, backend, rec, clock, gid = rig(tmp_path, api, wrong)
        errors = rounds(rec, clock)
        assert [e.kind for e in errors] == ["no-such-node"] * 4
        assert f"Nomad has no node {wrong}" in str(errors[0]) and "no grant is released" in str(errors[0])
        assert [e.grant_id for e in reserver.entries()] == [gid] and backend.released == []
        assert not any(path.startswith(f"/v1/node/{wrong}/allocations") for path, _ in api.requests), (
            "the empty list of an unknown node was never even read"
        )


def test_a_node_of_another_host_releases_nothing(tmp_path) -> None:
    with NomadApiDouble(hostname="some-other-host") as api:
        _reserver, backend, rec, clock, _gid = rig(tmp_path, api, api.node_id, hostname="this-host")
        errors = rounds(rec, clock)
        assert errors and all(e.kind == "wrong-node" for e in errors)
        assert "'some-other-host', not on this host 'this-host'" in str(errors[0])
        assert backend.released == []


def test_the_right_node_is_proven_once_per_period_and_then_absence_counts(tmp_path) -> None:
    with NomadApiDouble() as api:
        _reserver, backend, rec, clock, gid = rig(tmp_path, api, api.node_id)
        assert rounds(rec, clock, 3) == []
        assert [p for p, _ in api.requests].count(f"/v1/node/{api.node_id}") == 1, "checked again only later"
        assert backend.released == [gid], "with the node proven, an empty list is evidence (ACLs off)"
        clock.now += rec.visibility_period
        rec.round()
        assert [p for p, _ in api.requests].count(f"/v1/node/{api.node_id}") == 2


def test_the_documented_token_may_read_the_node(tmp_path) -> None:
    with NomadApiDouble() as api:
        api.enable_acls()
        api.add_policy("lingjun-plugin", DOCUMENTED)
        api.add_token("plugin-token", ["lingjun-plugin"])
        api.add_token("no-node-read", [])
        client = NomadClient(NomadApiSettings(address=api.address, token="plugin-token", timeout=10.0))
        assert client.node(api.node_id) is not None
        assert client.node(str(uuid.uuid4())) is None
        client.close()
        other = NomadClient(NomadApiSettings(address=api.address, token="no-node-read", timeout=10.0))
        with pytest.raises(NomadApiError) as err:
            other.node(api.node_id)
        assert err.value.kind == "forbidden" and "node:read" in str(err.value)
        other.close()
