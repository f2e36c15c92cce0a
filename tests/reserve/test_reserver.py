"""Reserver with a fake backend: grants, journal, release routes (a), (c), (d), concurrency."""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from nomad_plugin.config.model import PluginConfig
from nomad_plugin.journal import EntryState, Journal
from nomad_plugin.model.errors import BackendRefused, GrantMismatch, PluginError, ReservationRejected
from nomad_plugin.model.grant import DeviceNode
from nomad_plugin.model.instances import Kind, share_id
from nomad_plugin.nomad.container import GrantRejected
from nomad_plugin.nomad.reserve import MountPolicy, Reserver
from tests.doubles.reserve_fakes import (
    UNAVAILABLE,
    FakeBackend,
    announce_steps,
    card_uuid,
    catalog,
    share_group,
    whole_group,
)
from tests.this_thread import in_this_thread

CAT = catalog(whole_group(4), share_group([4, 5]))


def make(tmp_path, backend=None, cat=CAT, **kw):
    backend = backend or FakeBackend()
    changes = []
    r = Reserver(
        backend,
        lambda: cat,
        Journal(tmp_path / "data"),
        PluginConfig(data_dir=str(tmp_path / "data")),
        lambda: changes.append(1),
        path_exists=lambda p: False,
        **kw,
    )
    return r, backend, changes


def test_empty_request_gives_empty_reservation(tmp_path):
    r, b, _ = make(tmp_path)
    resp = r.reserve([])
    assert resp.HasField("container_res") and not resp.container_res.envs
    assert b.allocate_calls == 0


def test_reserve_journals_grant_before_returning(tmp_path):
    r, b, changes = make(tmp_path)
    resp = r.reserve([card_uuid(1), card_uuid(3)])
    gid = resp.container_res.envs["LINGJUN_GRANT_ID"]
    assert set(b.grants) == {gid}
    assert [a.minor for a in b.grants[gid].asks] == [1, 3]
    on_disk = Journal(tmp_path / "data").entries()
    assert len(on_disk) == 1
    e = on_disk[0]
    assert (e.grant_id, e.state, e.device_ids, e.kind) == (
        gid,
        EntryState.GRANTED,
        (card_uuid(1), card_uuid(3)),
        "whole",
    )
    assert [d.minor for d in e.granted] == [1, 3]
    assert [d.host_path for d in resp.container_res.devices] == ["/dev/alixpu1", "/dev/alixpu3"]
    assert changes and r.counters.journal_size == 1


def test_rejection_makes_no_grant_and_no_entry(tmp_path):
    r, b, _ = make(tmp_path)
    with pytest.raises(ReservationRejected):
        r.reserve(["unknown"])
    assert b.allocate_calls == 0 and r.entries() == []


def test_route_a_same_ids_release_previous_holder(tmp_path):
    r, b, _ = make(tmp_path)
    first = r.reserve([card_uuid(0)]).container_res.envs["LINGJUN_GRANT_ID"]
    second = r.reserve([card_uuid(0)]).container_res.envs["LINGJUN_GRANT_ID"]
    assert first in b.released and set(b.grants) == {second}
    assert [e.grant_id for e in r.entries()] == [second]
    assert r.counters.grants_released_by_reserve == 1


def test_route_a_partial_overlap_releases_whole_old_grant(tmp_path):
    r, b, _ = make(tmp_path)
    old = r.reserve([card_uuid(0), card_uuid(1)]).container_res.envs["LINGJUN_GRANT_ID"]
    r.reserve([card_uuid(1)])
    assert old in b.released and len(b.grants) == 1


def test_other_shares_of_same_card_are_not_released(tmp_path):
    r, b, _ = make(tmp_path)
    a = r.reserve([share_id(card_uuid(4), 0)]).container_res.envs["LINGJUN_GRANT_ID"]
    r.reserve([share_id(card_uuid(4), 1)])
    assert a in b.grants and len(b.grants) == 2
    assert r.active_kinds() == {card_uuid(4): frozenset({Kind.SHARE})}
    view = r.active_kinds()
    r.reserve([share_id(card_uuid(4), 2)])
    assert r.active_kinds() == view, "a share on a card that holds shares already changes no card's kinds"
    r.reserve([card_uuid(0)])
    assert r.active_kinds() != view and r.active_kinds()[card_uuid(0)] == {Kind.WHOLE}


def test_allocate_refused_releases_and_drops_intent(tmp_path):
    r, b, _ = make(tmp_path)
    b.fail_allocate = BackendRefused("card busy", 8)
    with pytest.raises(BackendRefused):
        r.reserve([card_uuid(0)])
    assert r.entries() == [] and len(b.released) == 1  # idempotent release of the maybe-grant


def test_allocate_and_release_both_failing_keeps_releasing_entry(tmp_path):
    r, b, _ = make(tmp_path)
    b.fail_allocate = UNAVAILABLE
    b.fail_release = UNAVAILABLE
    with pytest.raises(PluginError):
        r.reserve([card_uuid(0)])
    [e] = r.entries()
    assert e.state is EntryState.RELEASING
    b.fail_release = None
    assert r.retry_pending() == 1 and r.entries() == []


def test_malformed_grant_is_released_and_never_reaches_task(tmp_path):
    from dataclasses import replace

    b = FakeBackend()
    b.mutate = lambda g: replace(g, device_nodes=(DeviceNode("/dev/../etc/shadow", "/dev/x"),))
    r, b, _ = make(tmp_path, b)
    with pytest.raises(GrantRejected, match=r"'\.\.'"):
        r.reserve([card_uuid(2)])
    assert b.grants == {} and len(b.released) == 1 and r.entries() == []


def crashed_mid_reserve_and_mid_release(tmp_path):
    """A kept grant, plus an intent and a releasing entry a crashed process left; a new Reserver on them."""
    from dataclasses import replace

    r, b, _ = make(tmp_path)
    kept = r.reserve([card_uuid(0)]).container_res.envs["LINGJUN_GRANT_ID"]
    e = r.entries()[0]
    r.journal.put(replace(e, grant_id="lost-1", device_ids=(card_uuid(1),), state=EntryState.INTENT))
    r.journal.put(replace(e, grant_id="lost-2", device_ids=(card_uuid(2),), state=EntryState.RELEASING))
    r2, _, _ = make(tmp_path, b)
    return r2, b, kept


def test_route_c_recover_releases_intent_and_keeps_granted(tmp_path):
    r2, b, kept = crashed_mid_reserve_and_mid_release(tmp_path)
    assert r2.recover() == 2
    assert [x.grant_id for x in r2.entries()] == [kept]
    assert {"lost-1", "lost-2"} <= set(b.released)
    assert r2.counters.grants_released_at_startup == 2


def test_route_d_release_is_idempotent(tmp_path):
    r, b, _ = make(tmp_path)
    gid = r.reserve([card_uuid(0)]).container_res.envs["LINGJUN_GRANT_ID"]
    assert r.release_grant(gid, "test")
    assert r.release_grant(gid, "test")  # not in journal any more: counts as released
    assert b.released.count(gid) == 1


def test_active_kinds(tmp_path):
    r, _, _ = make(tmp_path)
    r.reserve([card_uuid(0)])
    r.reserve([share_id(card_uuid(5), 2)])
    assert r.active_kinds() == {card_uuid(0): frozenset({Kind.WHOLE}), card_uuid(5): frozenset({Kind.SHARE})}


def test_storm_100_concurrent_reserves_no_double_grant(tmp_path):
    """16 cards x 10 shares: 100 Reserves of overlapping and disjoint IDs at once."""
    cat = catalog(share_group(list(range(16))))
    b = FakeBackend()
    b.allocate_delay = 0.002
    r, b, _ = make(tmp_path, b, cat)
    requests = []
    for n in range(100):
        card = n % 16
        requests.append([share_id(card_uuid(card), (n // 16) % 10)])
    requests[50] = list(requests[0])  # the same IDs twice: the older grant must go (route a)
    barrier = threading.Barrier(20)

    def go(ids):
        try:
            barrier.wait(timeout=5)
        except threading.BrokenBarrierError:
            pass
        return r.reserve(ids).container_res.envs["LINGJUN_GRANT_ID"]

    with ThreadPoolExecutor(max_workers=20) as pool:
        gids = list(pool.map(go, requests))
    assert len(set(gids)) == 100
    assert b.double_grants == []
    held: dict[str, str] = {}
    for e in r.entries():
        for d in e.device_ids:
            assert d not in held, f"{d} held by {held.get(d)} and {e.grant_id}"
            held[d] = e.grant_id
    assert len(r.entries()) == len(b.grants) == 99
    assert set(b.grants) == {e.grant_id for e in Journal(tmp_path / "data").entries()}


def _with_timeout(tmp_path, allocate_timeout):
    backend = FakeBackend()
    cfg = PluginConfig(data_dir=str(tmp_path / "data"), xdm_allocate_timeout=allocate_timeout)
    r = Reserver(backend, lambda: CAT, Journal(tmp_path / "data"), cfg, path_exists=lambda p: False)
    return r, backend


def _unknown_outcomes():
    from nomad_plugin.model.errors import BackendUnavailable

    return [
        BackendUnavailable("Allocate deadline exceeded", "timeout"),
        BackendUnavailable("XDM Allocate unavailable: the stream was reset (RST_STREAM)", "unavailable"),
        BackendUnavailable("XDM Allocate unavailable: Cancelled", "unavailable"),
        RuntimeError("a bug between the call and its answer"),
    ]


@pytest.mark.parametrize("error", _unknown_outcomes(), ids=lambda e: type(e).__name__ + ":" + str(e)[:20])
@pytest.mark.parametrize("allocate_timeout", [60.0, 2.0])
def test_an_allocate_without_xdms_answer_keeps_the_entry_until_xdm_can_no_longer_commit(
    tmp_path, allocate_timeout, error
):
    """Whatever the error, short of XDM's own answer: kept (releasing) a deadline past the call, released meanwhile."""
    r, b = _with_timeout(tmp_path, allocate_timeout)
    b.fail_allocate = error
    before = time.time()
    with pytest.raises(type(error)):
        r.reserve([card_uuid(0)])
    after = time.time()
    [e] = r.entries()
    assert e.state is EntryState.RELEASING and len(b.released) == 1
    # The intent promised two deadlines from its write; the failure came within them.
    assert before + 2 * allocate_timeout <= e.settle_until <= after + 2 * allocate_timeout
    assert r.retry_pending() == 0 and len(r.entries()) == 1  # still inside the window
    assert len(b.released) == 2, "released again each round while XDM could still commit it"
    r.journal.put(dataclasses.replace(e, settle_until=time.time() - 1))  # the window has closed
    assert r.retry_pending() == 1 and r.entries() == []


def test_every_intent_carries_the_time_until_which_xdm_may_commit_it(tmp_path):
    r, b = _with_timeout(tmp_path, 7.0)
    seen = []
    b.mutate = lambda g: (seen.extend(r.journal.entries()), g)[1]
    before = time.time()
    r.reserve([card_uuid(0)])
    [intent] = seen
    assert intent.state is EntryState.INTENT and before + 14.0 <= intent.settle_until <= time.time() + 14.0
    [granted] = r.entries()
    assert granted.state is EntryState.GRANTED and granted.settle_until == 0.0, "XDM answered: nothing to wait for"


@pytest.mark.parametrize(
    "error",
    [
        BackendRefused("card 1 has no free memory", 8),
        GrantMismatch("XDM granted card 2 for card 1 (allocation released)"),
        UNAVAILABLE,  # XDM's socket is missing: a daemon that is gone commits nothing later
    ],
    ids=["refused", "mismatch", "gone"],
)
def test_an_allocate_xdm_answered_or_never_got_is_released_and_forgotten_at_once(tmp_path, error):
    r, b = _with_timeout(tmp_path, 60.0)
    b.fail_allocate = error
    with pytest.raises(PluginError):
        r.reserve([card_uuid(0)])
    assert r.entries() == [] and len(b.released) == 1


def test_steps_are_announced_in_order_and_the_entry_names_its_group(tmp_path):
    steps = []
    r, _, _ = make(tmp_path)
    announce_steps(r, steps.append)
    r.reserve([card_uuid(0)])
    assert steps == ["before-allocate", "after-allocate", "after-journal"]
    assert [e.group for e in r.entries()] == ["alibaba/ppu/PPU 810E"]


def test_journal_size_is_known_from_the_start(tmp_path):
    r, _, _ = make(tmp_path)
    r.reserve([card_uuid(0)])
    r.reserve([card_uuid(1)])
    again, _, _ = make(tmp_path)
    assert again.counters.journal_size == 2


def test_the_fingerprint_engine_is_told_only_when_a_cards_granted_kinds_change(tmp_path):
    r, _, changes = make(tmp_path)

    def grant(device_id):
        return r.reserve([device_id]).container_res.envs["LINGJUN_GRANT_ID"]

    first = grant(share_id(card_uuid(4), 0))
    assert len(changes) == 1, "card 4 now holds a share"
    second = grant(share_id(card_uuid(4), 1))
    assert len(changes) == 1, "card 4 held a share already: no card's kinds changed"
    grant(share_id(card_uuid(5), 0))
    assert len(changes) == 2
    grant(card_uuid(0))
    assert len(changes) == 3
    assert r.release_grant(second, "test")
    assert len(changes) == 3, "card 4 still holds a share"
    assert r.release_grant(first, "test")
    assert len(changes) == 4, "card 4 holds nothing now"
    assert r.release_grant(first, "test"), "released already"
    assert len(changes) == 4


def test_a_failing_change_callback_is_logged_not_raised(tmp_path, caplog):
    backend = FakeBackend()

    def broken():
        raise RuntimeError("listener gone")

    r = Reserver(backend, lambda: CAT, Journal(tmp_path / "d"), PluginConfig(), broken, path_exists=lambda p: False)
    with caplog.at_level("ERROR", logger="nomad_plugin.nomad.reserve"):
        r.reserve([card_uuid(0)])
    assert [rec.getMessage() for rec in caplog.records] == ["on_grants_changed callback failed"]


def test_mounts_are_passed_on_only_when_configured_and_node_paths_are_checked_on_this_host(tmp_path):
    seen = []

    def exists(path):
        seen.append(path)
        return path == "/dev/alixpu"

    b = FakeBackend(style="env+mounts")  # no device nodes from XDM: the usual ones that exist are derived
    default = Reserver(b, lambda: CAT, Journal(tmp_path / "a"), PluginConfig(), path_exists=exists)
    res = default.reserve([card_uuid(0)]).container_res
    assert list(res.mounts) == [] and [d.host_path for d in res.devices] == ["/dev/alixpu"]
    assert "/dev/alixpu_ctl" in seen
    with_mounts = Reserver(
        b, lambda: CAT, Journal(tmp_path / "b"), PluginConfig(), mount_policy=MountPolicy("always"), path_exists=exists
    )
    res = with_mounts.reserve([card_uuid(1)]).container_res
    assert [(m.task_path, m.host_path) for m in res.mounts] == [("/usr/local/lj", "/opt/lj/lib")]


# -- the audit and warning lines of every release route (what an operator greps for) ----------


def released_lines(caplog):
    return {r.getMessage(): getattr(r, "fields", None) for r in caplog.records if " released: " in r.getMessage()}


def test_recover_names_why_each_entry_is_released_and_counts_them(tmp_path, caplog):
    r2, _, kept = crashed_mid_reserve_and_mid_release(tmp_path)
    with caplog.at_level("INFO"):
        assert r2.recover() == 2
    assert released_lines(caplog) == {
        "grant lost-1 released: left by a plugin that stopped mid-Reserve": {
            "grant_id": "lost-1",
            "reason": "left by a plugin that stopped mid-Reserve",
            "device_ids": [card_uuid(1)],
        },
        "grant lost-2 released: retry of an earlier failed release": {
            "grant_id": "lost-2",
            "reason": "retry of an earlier failed release",
            "device_ids": [card_uuid(2)],
        },
    }
    assert [x.grant_id for x in r2.entries()] == [kept]
    assert r2.counters.journal_size == 1
    assert r2.recover() == 0 and r2.counters.grants_released_at_startup == 2


def test_recover_goes_past_granted_entries(tmp_path):
    """Granted entries are skipped, not the end of the scan, wherever they sit in the journal."""
    from dataclasses import replace

    r, b, _ = make(tmp_path)
    for card in (0, 1, 2):
        r.reserve([card_uuid(card)])
    entries = r.entries()
    for e in entries[:2]:  # leave one granted entry last, two intents before it...
        r.journal.put(replace(e, state=EntryState.INTENT))
    r.journal.put(replace(entries[0], grant_id="zz-intent", device_ids=(card_uuid(3),), state=EntryState.INTENT))
    r2, _, _ = make(tmp_path, b)
    assert r2.recover() == 3
    assert [x.grant_id for x in r2.entries()] == [entries[2].grant_id]


def test_a_failed_release_warns_with_its_reason_and_is_journalled_as_releasing_once(tmp_path, caplog):
    r, b, _ = make(tmp_path)
    gid = r.reserve([card_uuid(0)]).container_res.envs["LINGJUN_GRANT_ID"]
    b.fail_release = UNAVAILABLE
    puts = []
    real_put = r.journal.put
    r.journal.put = lambda entry, remove=(): (puts.append(entry.state), real_put(entry, remove))[1]
    with caplog.at_level("WARNING"):
        assert not r.release_grant(gid, "allocation a1 of job default/web ended (complete)")
        assert not r.release_grant(gid, "retry of an earlier failed release")
    warnings = [x.getMessage() for x in caplog.records if x.levelname == "WARNING"]
    assert warnings == [
        f"release of grant {gid} failed (allocation a1 of job default/web ended (complete)); will retry: "
        "XDM socket missing",
        f"release of grant {gid} failed (retry of an earlier failed release); will retry: XDM socket missing",
    ]
    assert puts == [EntryState.RELEASING], "the releasing state is written once, not on every retry"
    [e] = r.entries()
    assert e.state is EntryState.RELEASING


def test_an_abandoned_grant_is_released_with_the_reason_it_was_abandoned(tmp_path, caplog):
    from dataclasses import replace

    b = FakeBackend()
    b.mutate = lambda g: replace(g, device_nodes=(DeviceNode("/dev/../etc/shadow", "/dev/x"),))
    r, b, _ = make(tmp_path, b)
    with caplog.at_level("INFO"), pytest.raises(GrantRejected):
        r.reserve([card_uuid(2)])
    [gid] = b.released
    abandoned = [x.getMessage() for x in caplog.records if "abandoned" in x.getMessage()]
    assert len(abandoned) == 1 and abandoned[0].startswith(f"grant {gid} abandoned (")
    assert abandoned[0].endswith("); releasing it")
    why = abandoned[0][len(f"grant {gid} abandoned (") : -len("); releasing it")]
    assert why.startswith("verification failed: ") and "'..'" in why
    assert list(released_lines(caplog)) == [f"grant {gid} released: {why}"]
    assert [x.levelname for x in caplog.records if "abandoned" in x.getMessage()] == ["WARNING"]


def test_holder_is_the_grant_holding_a_device(tmp_path):
    r, _, _ = make(tmp_path)
    gid = r.reserve([card_uuid(0), card_uuid(1)]).container_res.envs["LINGJUN_GRANT_ID"]
    assert _holder(r, card_uuid(1)).grant_id == gid
    assert _holder(r, card_uuid(0)).grant_id == gid
    assert _holder(r, card_uuid(2)) is None


def test_a_release_inside_the_late_grant_window_says_why_the_entry_stays(tmp_path, caplog):
    from nomad_plugin.model.errors import BackendUnavailable

    r, b = _with_timeout(tmp_path, 5.0)
    b.fail_allocate = BackendUnavailable("Allocate deadline exceeded", "timeout")
    with caplog.at_level("DEBUG", logger="nomad_plugin"), pytest.raises(BackendUnavailable):
        r.reserve([card_uuid(0)])
    [e] = r.entries()
    line = f"grant {e.grant_id} released for now; kept until XDM can no longer commit it late"
    assert [x.levelname for x in caplog.records if x.getMessage() == line] == ["DEBUG"], caplog.text
    assert not released_lines(caplog), "no audit line while the entry stays"


# -- the grant audit line and the mount policy's lines -------------------------------------------


def test_describe_limits_per_kind():
    from nomad_plugin.model.grant import DeviceAsk
    from nomad_plugin.nomad.reserve import describe_limits

    assert describe_limits("whole", ()) == "none"
    assert describe_limits("whole", (DeviceAsk(0),)) == "whole cards (no limit)"
    share = (DeviceAsk(4, core=10, memory_gib=9), DeviceAsk(5, core=30, memory_gib=27))
    assert describe_limits("share", share) == "10% compute and 9 GiB memory per card"  # the first card's
    mig = (DeviceAsk(1, slices=3, memory_gib=40), DeviceAsk(2, slices=1, memory_gib=10))
    assert describe_limits("mig", mig) == "3 MIG slices and 40 GiB memory per card"
    existing = (DeviceAsk(1, slices=2, mig_uuid="MIG-a"), DeviceAsk(2, slices=1))
    assert describe_limits("mig-instance", existing) == "instance MIG-a: 2 slices, instance 2: 1 slices"


def grant_made_lines(caplog):
    return [(r.getMessage(), getattr(r, "fields", None)) for r in caplog.records if " made: " in r.getMessage()]


def test_one_audit_line_per_grant_made_with_its_fields(tmp_path, caplog):
    r, _, _ = make(tmp_path)
    with caplog.at_level("INFO"):
        whole = r.reserve([card_uuid(1), card_uuid(0)]).container_res.envs["LINGJUN_GRANT_ID"]
        share = r.reserve([share_id(card_uuid(4), 3)]).container_res.envs["LINGJUN_GRANT_ID"]
    entries = {e.grant_id: e for e in r.entries()}
    assert grant_made_lines(caplog) == [
        (
            f"grant {whole} made: devices {card_uuid(1)}, {card_uuid(0)}; cards {', '.join(entries[whole].cards)}; "
            "mode whole; limits whole cards (no limit)",
            {
                "grant_id": whole,
                "device_ids": [card_uuid(1), card_uuid(0)],
                "cards": list(entries[whole].cards),
                "mode": "whole",
                "group": entries[whole].group,
                "limits": "whole cards (no limit)",
            },
        ),
        (
            f"grant {share} made: devices {share_id(card_uuid(4), 3)}; cards {card_uuid(4)}; mode share; "
            "limits 10% compute and 9 GiB memory per card",
            {
                "grant_id": share,
                "device_ids": [share_id(card_uuid(4), 3)],
                "cards": [card_uuid(4)],
                "mode": "share",
                "group": entries[share].group,
                "limits": "10% compute and 9 GiB memory per card",
            },
        ),
    ]
    assert entries[whole].group and entries[whole].group != entries[share].group


def test_the_audit_line_waits_for_the_reply_when_it_can(tmp_path, caplog):
    r, _, _ = make(tmp_path)
    deferred = []
    with caplog.at_level("INFO"):
        gid = r.reserve([card_uuid(0)], lambda fn: deferred.append(fn) or True).container_res.envs["LINGJUN_GRANT_ID"]
        assert grant_made_lines(caplog) == [], "written before the reply went out"
        assert len(deferred) == 1
        deferred[0]()
        assert [m for m, _ in grant_made_lines(caplog)] == [
            f"grant {gid} made: devices {card_uuid(0)}; cards {card_uuid(0)}; mode whole; limits whole cards (no limit)"
        ]
        refused = r.reserve([card_uuid(1)], lambda fn: False).container_res.envs["LINGJUN_GRANT_ID"]
        assert grant_made_lines(caplog)[-1][0].startswith(f"grant {refused} made: "), "a refused deferral writes it now"


def mounts_reserver(tmp_path, policy):
    b = FakeBackend(style="env+mounts")
    return Reserver(
        b,
        lambda: CAT,
        Journal(tmp_path),
        PluginConfig(),
        mount_policy=policy,
        path_exists=lambda p: p == "/dev/alixpu",
    )


def test_the_mount_policy_is_asked_with_the_instance_ids_and_its_lines(tmp_path, caplog):
    from nomad_plugin.nomad.reserve import MountPolicy
    from nomad_plugin.reconcile.alloc_volumes import VolumeVerdict

    asked = []
    verdicts = iter(
        [
            VolumeVerdict(True, True, "task a1/task has volume_mount"),
            VolumeVerdict(False, False, "the Nomad API could not be asked (x)"),
            VolumeVerdict(True, False, "task a2/task has no volume_mount"),
        ]
    )

    def lookup(ids):
        asked.append(list(ids))
        return next(verdicts)

    r = mounts_reserver(tmp_path, MountPolicy("auto", lookup))
    with caplog.at_level("INFO"):
        first = r.reserve([card_uuid(0)]).container_res
        second = r.reserve([card_uuid(1)]).container_res
        third = r.reserve([card_uuid(2)]).container_res
    assert asked == [[card_uuid(0)], [card_uuid(1)], [card_uuid(2)]]
    assert (len(first.mounts), len(second.mounts), len(third.mounts)) == (0, 0, 1)
    assert len(first.devices) == 1 and len(second.devices) == 1, "devices are passed when mounts are withheld"
    ids = [g.envs["LINGJUN_GRANT_ID"] for g in (first, second, third)]
    lines = [(x.levelname, x.getMessage()) for x in caplog.records]
    made = "made: devices {}; cards {}; mode whole; limits whole cards (no limit); XDM's 1 mount(s) "
    assert lines == [
        (
            "INFO",
            f"grant {ids[0]} {made.format(card_uuid(0), card_uuid(0))}withheld (task a1/task has volume_mount); "
            "its devices and env are passed",
        ),
        (
            "WARNING",
            f"grant {ids[1]}: XDM's 1 mount(s) withheld from the task (the Nomad API could not be asked (x)); "
            "its devices and env are passed",
        ),
        (
            "INFO",
            f"grant {ids[1]} {made.format(card_uuid(1), card_uuid(1))}withheld (the Nomad API could not be asked (x)); "
            "its devices and env are passed",
        ),
        ("INFO", f"grant {ids[2]} {made.format(card_uuid(2), card_uuid(2))}passed (task a2/task has no volume_mount)"),
    ], "one audit line per grant, with its mounts' fate; a warning of its own only when it could not be told"
    fields = [getattr(x, "fields", {}) for x in caplog.records if " made: " in x.getMessage()]
    assert [(f["mounts"], f["mounts_reason"]) for f in fields] == [
        ("withheld", "task a1/task has volume_mount"),
        ("withheld", "the Nomad API could not be asked (x)"),
        ("passed", "task a2/task has no volume_mount"),
    ]


def test_never_is_said_in_the_audit_line_and_no_mounts_means_no_question(tmp_path, caplog):
    from nomad_plugin.nomad.reserve import MountPolicy

    r = mounts_reserver(tmp_path / "a", MountPolicy("never"))
    with caplog.at_level("INFO"):
        gid = r.reserve([card_uuid(0)]).container_res.envs["LINGJUN_GRANT_ID"]
    lines = [(x.levelname, x.getMessage()) for x in caplog.records]
    assert lines == [
        (
            "INFO",
            f"grant {gid} made: devices {card_uuid(0)}; cards {card_uuid(0)}; mode whole; "
            f'limits whole cards (no limit); XDM\'s 1 mount(s) withheld (container_mounts = "never"); '
            "its devices and env are passed",
        )
    ]
    asked = []
    plain = Reserver(
        FakeBackend(),
        lambda: CAT,
        Journal(tmp_path / "b"),
        PluginConfig(),
        mount_policy=MountPolicy("auto", lambda ids: asked.append(ids)),
        path_exists=lambda p: False,
    )
    plain.reserve([card_uuid(1)])
    assert asked == [], "the Nomad API was asked although XDM returned no mounts"


def test_the_nomad_api_is_asked_after_a_grant_with_mounts_and_each_decision_counted(tmp_path):
    from nomad_plugin.nomad.reserve import MountPolicy
    from nomad_plugin.reconcile.alloc_volumes import VolumeVerdict

    backend = FakeBackend(style="env+mounts")
    allocated_before: list[int] = []
    used: list[str] = []

    def lookup(ids):
        allocated_before.append(backend.allocate_calls)
        return VolumeVerdict(True, False, "task a/task has no volume_mount")

    policy = MountPolicy("auto", lookup, lambda d: used.append(d.outcome))
    r = Reserver(
        backend, lambda: CAT, Journal(tmp_path), PluginConfig(), mount_policy=policy, path_exists=lambda p: True
    )
    try:
        first = r.reserve([card_uuid(0)]).container_res
        second = r.reserve([card_uuid(1)]).container_res
        assert allocated_before == [1, 2], "the question comes after XDM's grant"
        assert (len(first.mounts), len(second.mounts)) == (1, 1) and used == ["passed", "passed"]
        backend.style = "env+devices"  # XDM stops sending mounts
        third = r.reserve([card_uuid(2)]).container_res
        assert len(third.mounts) == 0 and allocated_before == [1, 2] and used == ["passed", "passed"]
    finally:
        policy.close()


def test_a_re_reserve_releases_every_earlier_holder_with_its_reason(tmp_path, caplog):
    r, b, _ = make(tmp_path)
    first = r.reserve([card_uuid(0)]).container_res.envs["LINGJUN_GRANT_ID"]
    second = r.reserve([card_uuid(1)]).container_res.envs["LINGJUN_GRANT_ID"]
    with caplog.at_level("INFO"):
        new = r.reserve([card_uuid(0), card_uuid(1)]).container_res.envs["LINGJUN_GRANT_ID"]
    why = "re-reserved: its device IDs were handed to a new allocation"
    assert set(released_lines(caplog)) == {f"grant {first} released: {why}", f"grant {second} released: {why}"}
    assert r.counters.grants_released_by_reserve == 2
    assert [e.grant_id for e in r.entries()] == [new] and set(b.grants) == {new}


def test_a_re_reserve_drops_the_released_holder_in_the_intents_write(tmp_path):
    """Two journal writes for a re-reserve: the intent (without the released holder), then the grant."""
    seen = []
    r, b, _ = make(tmp_path)
    announce_steps(r, lambda step: seen.append((step, Journal.snapshot(tmp_path / "data"))))
    old = r.reserve([card_uuid(0)]).container_res.envs["LINGJUN_GRANT_ID"]
    writes = []
    real_put, real_remove = r.journal.put, r.journal.remove
    r.journal.put = lambda entry, remove=(): (
        writes.append(("put", entry.state, tuple(remove))),
        real_put(entry, remove),
    )[1]
    r.journal.remove = lambda grant_id: (writes.append(("remove", grant_id)), real_remove(grant_id))[1]
    seen.clear()
    new = r.reserve([card_uuid(0)]).container_res.envs["LINGJUN_GRANT_ID"]
    assert writes == [("put", EntryState.INTENT, (old,)), ("put", EntryState.GRANTED, ())]
    step, on_disk = seen[0]
    assert step == "before-allocate" and [(e.grant_id, e.state) for e in on_disk] == [(new, EntryState.INTENT)]
    assert old in b.released and set(b.grants) == {new}


def test_retry_pending_releases_with_its_reason(tmp_path, caplog):
    r, b, _ = make(tmp_path)
    gid = r.reserve([card_uuid(0)]).container_res.envs["LINGJUN_GRANT_ID"]
    b.fail_release = UNAVAILABLE
    assert not r.release_grant(gid, "x")
    b.fail_release = None
    with caplog.at_level("INFO"):
        assert r.retry_pending() == 1
    assert list(released_lines(caplog)) == [f"grant {gid} released: retry of an earlier failed release"]


def test_journal_write_failures_say_where_and_what_it_means(tmp_path):
    from nomad_plugin.nomad.reserve import JournalWriteFailed

    r, b, _ = make(tmp_path)
    gid = r.reserve([card_uuid(0)]).container_res.envs["LINGJUN_GRANT_ID"]
    real_put = r.journal.put

    def failing_put(entry, remove=()):
        raise OSError(28, "No space left on device")

    r.journal.put = failing_put
    with pytest.raises(JournalWriteFailed) as info:
        r.reserve([card_uuid(1)])
    assert str(info.value) == (
        f"grant journal write failed in {r.journal.dir}: [Errno 28] No space left on device; no grant was made"
    )
    b.fail_release = UNAVAILABLE
    with pytest.raises(JournalWriteFailed) as info:
        r.release_grant(gid, "x")
    assert str(info.value) == (
        f"grant journal write failed in {r.journal.dir}: [Errno 28] No space left on device; "
        "the grant is being released"
    )
    r.journal.put = real_put


def test_a_grant_that_cannot_be_journalled_after_allocate_is_released(tmp_path):
    from nomad_plugin.nomad.reserve import JournalWriteFailed

    r, b, _ = make(tmp_path)
    real_put = r.journal.put

    def put(entry, remove=()):
        if entry.state is EntryState.GRANTED:
            raise OSError(5, "Input/output error")
        real_put(entry, remove)

    r.journal.put = put
    with pytest.raises(JournalWriteFailed) as info:
        r.reserve([card_uuid(0)])
    assert str(info.value) == (
        f"grant journal write failed in {r.journal.dir}: [Errno 5] Input/output error; the grant is being released"
    )
    assert r.entries() == [] and len(b.released) == 1 and b.grants == {}


def _record_durability(monkeypatch, backend):
    """What reaches the disk (fsyncs and renames, by name) and XDM (Allocate), in order."""
    from nomad_plugin.journal import store

    calls = []
    real_fsync, real_replace, real_allocate = os.fsync, os.replace, backend.allocate

    def fsync(fd):
        calls.append(("fsync", os.path.basename(os.readlink(f"/proc/self/fd/{fd}"))))
        real_fsync(fd)

    def replace(src, dst):
        calls.append(("rename", os.path.basename(dst)))
        real_replace(src, dst)

    def allocate(request):
        calls.append(("allocate", request.grant_id))
        return real_allocate(request)

    monkeypatch.setattr(store.os, "fsync", in_this_thread(fsync, real_fsync))
    monkeypatch.setattr(store.os, "replace", in_this_thread(replace, real_replace))
    backend.allocate = allocate
    return calls


def test_the_intent_is_durable_before_allocate_and_the_grant_before_reserve_returns(tmp_path, monkeypatch):
    """A power loss at any point leaves on disk every grant id XDM may hold (no lease needed to find it)."""
    r, b, _ = make(tmp_path)
    calls = _record_durability(monkeypatch, b)
    gid = r.reserve([card_uuid(0)]).container_res.envs["LINGJUN_GRANT_ID"]
    durable = [("rename", "journal.json"), ("fsync", "data")]  # after the temp file's own fsync
    assert [c for c in calls if c[0] != "fsync" or c[1] == "data"] == [*durable, ("allocate", gid), *durable]
    assert [c[1].startswith("journal.json.tmp-") for c in calls if c[0] == "fsync"] == [True, False, True, False]
    calls.clear()
    b.fail_release = UNAVAILABLE
    assert not r.release_grant(gid, "x")
    assert [e.state for e in r.entries()] == [EntryState.RELEASING]
    assert calls[-2:] == durable, "the releasing state is durable before the plugin relies on it"


def test_grant_ids_are_random_uuid4s(tmp_path):
    import uuid

    r, _, _ = make(tmp_path)
    ids = [r.reserve([card_uuid(i)]).container_res.envs["LINGJUN_GRANT_ID"] for i in range(3)]
    assert len(set(ids)) == 3 and all(uuid.UUID(g).version == 4 and str(uuid.UUID(g)) == g for g in ids)


def test_holder_and_active_kinds_follow_every_change_including_another_process(tmp_path):
    r, _, _ = make(tmp_path)
    whole = r.reserve([card_uuid(0)]).container_res.envs["LINGJUN_GRANT_ID"]
    share = r.reserve([share_id(card_uuid(4), 0)]).container_res.envs["LINGJUN_GRANT_ID"]
    assert _holder(r, card_uuid(0)).grant_id == whole and _holder(r, share_id(card_uuid(4), 0)).grant_id == share
    assert r.active_kinds() == {card_uuid(0): frozenset({Kind.WHOLE}), card_uuid(4): frozenset({Kind.SHARE})}
    Journal(tmp_path / "data").remove(whole)  # another process (an operator command) changed the journal
    assert _holder(r, card_uuid(0)) is None and r.active_kinds() == {card_uuid(4): frozenset({Kind.SHARE})}


def test_an_allocate_failure_is_logged_as_the_reason_the_grant_was_abandoned(tmp_path, caplog):
    import logging

    r, b, _ = make(tmp_path)
    b.fail_allocate = BackendRefused("card busy", 8)
    caplog.set_level(logging.WARNING, logger="nomad_plugin")
    with pytest.raises(BackendRefused) as err:
        r.reserve([card_uuid(0)])
    [gid] = b.released
    assert [rec.getMessage() for rec in caplog.records] == [
        f"grant {gid} abandoned (Allocate failed: {err.value}); releasing it"
    ]


def _holder(r, device_id):  # type: ignore[no-untyped-def]
    """The journalled grant holding ``device_id``, as the stats read it."""
    return next((e for e in r.entries() if device_id in e.device_ids), None)
