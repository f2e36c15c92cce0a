"""Release only on evidence: the reconciler under Nomad ACLs (the API double enforces them).

Nomad's ``/v1/node/:id/allocations`` needs ``node:read`` and then silently
leaves out allocations in namespaces where the token lacks ``read-job``,
still answering 200. A token with only ``node:read``/``agent:read`` (what the
docs once recommended) therefore saw a running allocation in ``team-a`` as
gone, and its grant was released.
"""

from __future__ import annotations

from nomad_plugin.config.model import PluginConfig
from nomad_plugin.journal import Journal
from nomad_plugin.nomad.reserve import Reserver
from nomad_plugin.reconcile.nomad_api import NomadApiSettings, NomadClient
from nomad_plugin.reconcile.reconciler import Reconciler
from nomad_plugin.testing.nomad_api import NomadApiDouble
from nomad_plugin.util.backoff import Backoff
from tests.reserve.fakes import FakeBackend, card_uuid, catalog, whole_group

CAT = catalog(whole_group(8))
NARROW = 'namespace "default" { policy = "read" }\nnode { policy = "read" }\nagent { policy = "read" }\n'
DOCUMENTED = 'namespace "*" { capabilities = ["read-job"] }\nnode { policy = "read" }\nagent { policy = "read" }\n'


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def acl_api(rules: str) -> NomadApiDouble:
    api = NomadApiDouble().start()
    api.enable_acls()
    api.add_policy("lingjun-plugin", rules)
    api.add_token("plugin-token", ["lingjun-plugin"])
    return api


def setup(tmp_path, api, clock, *, grace=5.0, token="plugin-token"):
    backend = FakeBackend()
    reserver = Reserver(backend, lambda: CAT, Journal(tmp_path), PluginConfig(), path_exists=lambda p: False)
    client = NomadClient(NomadApiSettings(address=api.address, token=token, timeout=2.0))
    rec = Reconciler(
        reserver, client, lambda: CAT, grace=grace, max_wait=0.2, backoff=Backoff(initial=0.05, cap=0.2), clock=clock
    )
    return reserver, backend, rec


def grant_of(reserver, ids):
    return reserver.reserve(ids).container_res.envs["LINGJUN_GRANT_ID"]


def test_running_job_in_unreadable_namespace_keeps_its_grant(tmp_path):
    """The bug of issue 13: without read-job on team-a, team-a's running job lost its grant."""
    api = acl_api(NARROW)
    try:
        clock = Clock()
        reserver, backend, rec = setup(tmp_path, api, clock)
        hidden = grant_of(reserver, [card_uuid(0)])
        api.add_alloc("alloc-team-a", [card_uuid(0)], namespace="team-a", job="train")
        for _ in range(4):
            rec.round()
            clock.now += 60  # far past the 5 s grace period
        rec.round()
        assert hidden in backend.grants, "the grant of a running allocation was released"
        assert [e.grant_id for e in reserver.entries()] == [hidden]
    finally:
        api.stop()
