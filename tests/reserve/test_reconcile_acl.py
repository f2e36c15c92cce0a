"""Release only on evidence: the reconciler under Nomad ACLs (the API double enforces them).

Nomad's ``/v1/node/:id/allocations`` needs ``node:read`` and then silently
leaves out allocations in namespaces where the token lacks ``read-job``,
still answering 200. A token with only ``node:read``/``agent:read`` (what the
docs once recommended) therefore saw a running allocation in ``team-a`` as
gone, and its grant was released.
"""

from __future__ import annotations

import httpx

from nomad_plugin.config.model import PluginConfig
from nomad_plugin.journal import Journal
from nomad_plugin.nomad.reserve import Reserver
from nomad_plugin.reconcile.nomad_api import NomadApiSettings, NomadClient
from nomad_plugin.reconcile.reconciler import Reconciler
from nomad_plugin.util.threads import Backoff
from tests.doubles.nomad_api import NomadApiDouble
from tests.doubles.reserve_fakes import Clock, FakeBackend, card_uuid, catalog, whole_group

CAT = catalog(whole_group(8))
NARROW = 'namespace "default" { policy = "read" }\nnode { policy = "read" }\nagent { policy = "read" }\n'
DOCUMENTED = 'namespace "*" { capabilities = ["read-job"] }\nnode { policy = "read" }\nagent { policy = "read" }\n'


def acl_api(rules: str) -> NomadApiDouble:
    api = NomadApiDouble().start()
    api.enable_acls()
    api.add_policy("lingjun-plugin", rules)
    api.add_token("plugin-token", ["lingjun-plugin"])
    return api


def setup(tmp_path, api, clock, *, grace=5.0, token="plugin-token"):
    backend = FakeBackend()
    reserver = Reserver(backend, lambda: CAT, Journal(tmp_path), PluginConfig(), path_exists=lambda p: False)
    client = NomadClient(NomadApiSettings(address=api.address, token=token, timeout=30.0))
    rec = Reconciler(
        reserver, client, lambda: CAT, grace=grace, max_wait=0.2, backoff=Backoff(initial=0.05, cap=0.2), clock=clock
    )
    return reserver, backend, rec


def grant_of(reserver, ids):
    return reserver.reserve(ids).container_res.envs["LINGJUN_GRANT_ID"]


def test_running_job_in_unreadable_namespace_keeps_its_grant(tmp_path):
    """Without read-job on team-a, team-a's running job keeps its grant: the missing allocation proves nothing."""
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


def test_documented_policy_sees_every_namespace_and_releases_the_ended_job(tmp_path):
    api = acl_api(DOCUMENTED)
    try:
        clock = Clock()
        reserver, backend, rec = setup(tmp_path, api, clock)
        ended = grant_of(reserver, [card_uuid(0)])
        running = grant_of(reserver, [card_uuid(1)])
        never_claimed = grant_of(reserver, [card_uuid(2)])
        api.add_alloc("a-ended", [card_uuid(0)], namespace="team-a", job="train")
        api.add_alloc("a-running", [card_uuid(1)], namespace="team-b", job="serve")
        rec.round()
        assert rec.view_complete and reserver.counters.view_incomplete == 0
        api.set_status("a-ended", "complete")
        rec.round()
        clock.now += 6
        rec.round()
        assert ended not in backend.grants and never_claimed not in backend.grants  # absence is evidence here
        assert running in backend.grants
    finally:
        api.stop()


def test_incomplete_view_releases_only_what_it_saw_end(tmp_path, caplog):
    api = acl_api(NARROW)
    try:
        clock = Clock()
        reserver, backend, rec = setup(tmp_path, api, clock)
        seen = grant_of(reserver, [card_uuid(0)])
        collected = grant_of(reserver, [card_uuid(1)])
        unclaimed = grant_of(reserver, [card_uuid(2)])
        api.add_alloc("a-seen", [card_uuid(0)], namespace="default", job="web")
        api.add_alloc("a-gc", [card_uuid(1)], namespace="default", job="batch")
        with caplog.at_level("INFO"):
            rec.round()
            assert not rec.view_complete and reserver.counters.view_incomplete == 1
            assert "allocation view is INCOMPLETE" in caplog.text and 'namespace "*"' in caplog.text
            api.set_status("a-seen", "failed")
            api.remove_alloc("a-gc")
            rec.round()
            clock.now += 6
            rec.round()
        assert seen not in backend.grants and collected not in backend.grants
        assert unclaimed in backend.grants, "a grant was released on absence with an incomplete view"
        assert reserver.counters.unverifiable_grants == 1 and rec.unverifiable == (unclaimed,)
        assert f"grant {unclaimed} is kept" in caplog.text
        assert "allocation a-seen of job default/web ended (failed)" in caplog.text
        assert "allocation a-gc of job default/batch ended (garbage-collected)" in caplog.text

    finally:
        api.stop()


def test_claims_survive_a_restart_as_evidence(tmp_path):
    api = acl_api(NARROW)
    try:
        clock = Clock()
        state = tmp_path / "reconciler-state.json"
        reserver, backend, rec = setup(tmp_path, api, clock)
        rec.state_path = state
        gid = grant_of(reserver, [card_uuid(0)])
        api.add_alloc("a1", [card_uuid(0)], namespace="default", job="web")
        rec.round()
        assert state.exists()
        # the plugin dies; the allocation ends meanwhile; a new process starts
        api.set_status("a1", "complete")
        client = NomadClient(NomadApiSettings(address=api.address, token="plugin-token", timeout=30.0))
        again = Reconciler(reserver, client, lambda: CAT, grace=5, max_wait=0.2, clock=clock, state_path=state)
        again._restore_claims()
        again.round()
        clock.now += 6
        again.round()
        assert gid not in backend.grants
    finally:
        api.stop()


def test_pending_and_unknown_allocations_are_live(tmp_path):
    api = NomadApiDouble().start()
    try:
        clock = Clock()
        reserver, backend, rec = setup(tmp_path, api, clock, token="")
        pending = grant_of(reserver, [card_uuid(0)])
        unknown = grant_of(reserver, [card_uuid(1)])
        api.add_alloc("p", [card_uuid(0)], status="pending")
        api.add_alloc("u", [card_uuid(1)], status="unknown")
        for _ in range(3):
            rec.round()
            clock.now += 60
        assert pending in backend.grants and unknown in backend.grants
    finally:
        api.stop()


def test_reappearing_allocation_restarts_the_orphan_timer(tmp_path):
    api = NomadApiDouble().start()
    try:
        clock = Clock()
        reserver, backend, rec = setup(tmp_path, api, clock, grace=30, token="")
        gid = grant_of(reserver, [card_uuid(0)])
        api.add_alloc("a", [card_uuid(0)])
        rec.round()
        api.set_status("a", "unknown")  # a client that lost contact: still live
        api.remove_alloc("a")
        rec.round()  # orphaned from t=1000
        clock.now += 20
        api.add_alloc("a", [card_uuid(0)])  # it is back (live): the timer must restart
        rec.round()
        clock.now += 5
        api.remove_alloc("a")
        rec.round()  # orphaned again from t=1025
        clock.now += 10  # t=1035: 35 s after the first orphaning, 10 s after the second
        rec.round()
        assert gid in backend.grants, "the orphan timer was not restarted when the allocation reappeared"
        clock.now += 21
        rec.round()
        assert gid not in backend.grants
    finally:
        api.stop()


def test_index_going_backwards_is_reset(tmp_path):
    api = NomadApiDouble().start()
    try:
        clock = Clock()
        _reserver, _backend, rec = setup(tmp_path, api, clock, token="")
        for i in range(8):
            api.add_alloc(f"x{i}", [f"foreign-{i}"])
        rec.round()
        high = rec.index
        assert high >= 9
        api.reset_index(3)  # a server restored from an older snapshot
        rec.round()
        assert rec.index == 0, "an index that went backwards was kept"
        api.add_alloc("new", ["foreign-new"])
        n = len(api.requests)
        rec.round()
        assert f"index={high}" not in api.requests[n][0]
        assert "new" in {a.id for a in rec.last_page.allocs}
    finally:
        api.stop()


def test_wait_is_sent_as_a_go_duration(tmp_path):
    from nomad_plugin.reconcile.nomad_api import wait_duration
    from tests.doubles.nomad_api import parse_wait

    assert [wait_duration(x) for x in (0.3, 5, 10.0, 0.0001, 1.25)] == ["300ms", "5s", "10s", "1ms", "1250ms"]
    for text in ("300ms", "5s", "1250ms"):
        assert parse_wait(text) > 0
    api = NomadApiDouble().start()
    try:
        client = NomadClient(NomadApiSettings(address=api.address))
        page = client.node_allocations(api.node_id)
        client.node_allocations(api.node_id, page.index, wait=0.3)
        client.node_allocations(api.node_id, page.index, wait=1.0)
        sent = [p for p, _ in api.requests if "wait=" in p]
        assert any("wait=300ms" in p for p in sent) and any("wait=1s" in p for p in sent), sent
        # Nomad answers 400 "Invalid wait time" to a bare number (what a whole-seconds client sent)
        bare = httpx.get(f"{api.address}/v1/node/{api.node_id}/allocations?index=1&wait=5")
        assert bare.status_code == 400 and "Invalid wait time" in bare.text
    finally:
        api.stop()


def test_claimed_allocation_hidden_by_a_policy_change_is_not_taken_for_gone(tmp_path):
    """Absent from the list is not garbage-collected: GET /v1/allocation/<id> must say 404."""
    api = acl_api(NARROW.replace('namespace "default"', 'namespace "team-b" { policy = "read" }\nnamespace "default"'))
    try:
        clock = Clock()
        reserver, backend, rec = setup(tmp_path, api, clock)
        gid = grant_of(reserver, [card_uuid(0)])
        api.add_alloc("a-b", [card_uuid(0)], namespace="team-b", job="etl")
        rec.round()
        assert "a-b" in {a.id for a in rec.last_page.allocs}
        api.add_policy("lingjun-plugin", NARROW)  # team-b is no longer readable: the allocation vanishes
        for _ in range(3):
            rec.round()
            clock.now += 60
        assert gid in backend.grants, "a claimed allocation hidden by a policy change was taken for gone"
        api.remove_alloc("a-b")  # now Nomad really garbage-collects it: the lookup answers 404
        rec.round()
        clock.now += 6
        rec.round()
        assert gid not in backend.grants
    finally:
        api.stop()
