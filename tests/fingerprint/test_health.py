"""HealthTracker hysteresis, outage verdicts and conflict marking (pure)."""

from __future__ import annotations

from nomad_plugin.config.model import CardRule, PluginConfig
from nomad_plugin.model.instances import Kind
from nomad_plugin.nomad.catalog import build_catalog
from nomad_plugin.nomad.fingerprint import (
    HEALTHY,
    HealthTracker,
    Verdict,
    conflict_reasons,
    instance_verdicts,
    iso_time,
    outage_verdict,
)

from .helpers import FakeClock, h800_node


def test_unhealthy_is_immediate_and_recovery_needs_n_checks():
    clock = FakeClock()
    t = HealthTracker(recovery_checks=3, recovery_delay=30.0, clock=clock)
    t.observe({"a": (True, ""), "b": (True, "")})
    assert t.verdicts() == {"a": HEALTHY, "b": HEALTHY}
    t.observe({"a": (False, "XID 79"), "b": (True, "")})
    assert t.verdicts()["a"] == Verdict(False, "XID 79")
    for n in (1, 2):
        t.observe({"a": (True, ""), "b": (True, "")})
        v = t.verdicts()["a"]
        assert not v.healthy and f"healthy {n}/3 checks" in v.description and "XID 79" in v.description
    t.observe({"a": (True, ""), "b": (True, "")})
    assert t.verdicts()["a"] == HEALTHY


def test_relapse_resets_the_count():
    t = HealthTracker(recovery_checks=2, recovery_delay=1000, clock=FakeClock())
    t.observe({"a": (False, "x")})
    t.observe({"a": (True, "")})
    t.observe({"a": (False, "y")})
    t.observe({"a": (True, "")})
    assert not t.verdicts()["a"].healthy
    t.observe({"a": (True, "")})
    assert t.verdicts()["a"].healthy


def test_recovery_by_continuous_health_delay():
    clock = FakeClock()
    t = HealthTracker(recovery_checks=100, recovery_delay=30.0, clock=clock)
    t.observe({"a": (False, "ecc")})
    assert t.next_deadline() is None
    clock.advance(5)
    t.observe({"a": (True, "")})  # continuous health starts now
    assert t.next_deadline() == clock() + 30
    clock.advance(29.9)
    assert not t.verdicts()["a"].healthy
    clock.advance(0.2)
    assert t.verdicts()["a"].healthy  # no further observation needed
    assert t.next_deadline() is None


def test_new_and_forgotten_cards():
    t = HealthTracker(clock=FakeClock())
    t.observe({"a": (False, "")})
    assert t.verdicts()["a"] == Verdict(False, "reported unhealthy")
    t.observe({"b": (True, "")})
    assert t.verdicts() == {"b": HEALTHY}


def test_outage_verdict_says_why_and_since_when():
    v = outage_verdict("xdm", "socket missing: /run/x.sock", 1_800_000_000.0)
    assert v == Verdict(False, "xdm unreachable since 2027-01-15T08:00:00Z: socket missing: /run/x.sock")
    assert iso_time(0) == "1970-01-01T00:00:00Z"


def test_conflict_marking_each_direction():
    inv = h800_node(3)
    u0, u1, u2 = (c.uuid for c in inv.cards)
    cfg = PluginConfig(cards=(CardRule("1", "tdm", shares=2), CardRule("2", "mig")))
    cat = build_catalog(inv, cfg)
    grants = {
        u0: frozenset({Kind.SHARE}),  # whole card while shares of it are granted (mode changed)
        u1: frozenset({Kind.WHOLE}),  # shares of a card held whole
        u2: frozenset({Kind.MIG, Kind.SHARE}),  # MIG units of a card also used by tdm
    }
    reasons = conflict_reasons(cat, grants)
    assert set(reasons) == {u0, f"{u1}-share-0", f"{u1}-share-1"} | {f"{u2}-mig-{i}" for i in range(7)}
    assert reasons[u0] == "card 0 has tdm shares granted (another mode); unavailable as whole"
    assert reasons[f"{u1}-share-0"] == "card 1 held whole (another mode); unavailable as share"
    assert "has tdm shares granted" in reasons[f"{u2}-mig-3"]
    # same-mode grants are Nomad's business, not a conflict
    assert conflict_reasons(cat, {u0: frozenset({Kind.WHOLE}), u2: frozenset({Kind.MIG})}) == {}


def _conflicts_by_scan(cat, grants):
    """The reference: every instance of the catalog against its card's granted kinds."""
    out = {}
    for group in cat.groups:
        for inst in group.instances:
            others = grants.get(inst.card_uuid, frozenset()) - {inst.kind}
            if others:
                out[inst.id] = others
    return out


def test_conflict_marking_names_exactly_the_instances_a_full_scan_finds():
    """Every combination of granted kinds on four cards in three modes marks what a full scan finds."""
    import itertools

    inv = h800_node(4)
    uuids = [c.uuid for c in inv.cards]
    cfg = PluginConfig(cards=(CardRule("1", "tdm", shares=2), CardRule("2", "mig"), CardRule("3", "tdm", shares=3)))
    cat = build_catalog(inv, cfg)
    kinds = [Kind.WHOLE, Kind.SHARE, Kind.MIG]
    kind_sets = [frozenset(c) for n in range(0, 3) for c in itertools.combinations(kinds, n)]
    with_conflicts = without = 0
    for combo in itertools.product(kind_sets, repeat=len(uuids)):
        grants = {u: ks for u, ks in zip(uuids, combo, strict=True) if ks}
        grants["not-a-card-of-this-catalog"] = frozenset({Kind.WHOLE})
        reasons = conflict_reasons(cat, grants)
        expected = _conflicts_by_scan(cat, grants)
        assert set(reasons) == set(expected), f"grants {grants}"
        for iid, others in expected.items():
            assert "another mode" in reasons[iid], reasons[iid]
            assert reasons[iid].endswith(f"unavailable as {cat.find(iid)[1].kind.value}")
        if expected:
            with_conflicts += 1
        else:
            without += 1
    assert with_conflicts and without, "the combinations cover both outcomes"


def test_instance_verdicts_combine_reasons():
    inv = h800_node(2)
    u0, u1 = (c.uuid for c in inv.cards)
    cat = build_catalog(inv, PluginConfig())
    out = instance_verdicts(cat, {u0: Verdict(False, "XID 48")}, {u0: "card 0 held whole"}, None)
    assert out[u0] == Verdict(False, "XID 48; card 0 held whole")
    assert out[u1] == HEALTHY
    down = outage_verdict("xdm", "timeout", 0)
    out = instance_verdicts(cat, {}, {}, down)
    assert all(v == Verdict(False, down.description) for v in out.values())


def test_tracker_defaults_are_the_config_defaults():
    """A tracker built without arguments behaves like the documented options (3 checks or 30s)."""
    cfg = PluginConfig()
    clock = FakeClock()
    t = HealthTracker(clock=clock)
    t.observe({"a": (False, "x")})
    for _ in range(cfg.health_recovery_checks - 1):
        t.observe({"a": (True, "")})
    assert not t.verdicts()["a"].healthy
    t.observe({"a": (True, "")})
    assert t.verdicts()["a"].healthy
    t.observe({"a": (False, "x")})
    t.observe({"a": (True, "")})
    assert t.next_deadline() == clock() + cfg.health_recovery_delay


def test_recovery_delay_is_inclusive():
    clock = FakeClock()
    t = HealthTracker(recovery_checks=100, recovery_delay=30.0, clock=clock)
    t.observe({"a": (False, "ecc")})
    t.observe({"a": (True, "")})
    clock.advance(30.0)
    assert t.verdicts()["a"].healthy


def test_zero_delay_recovers_on_the_first_healthy_report_and_checks_clamp_to_one():
    t = HealthTracker(recovery_checks=100, recovery_delay=0.0, clock=FakeClock())
    t.observe({"a": (False, "ecc")})
    t.observe({"a": (True, "")})
    assert t.verdicts()["a"].healthy
    t = HealthTracker(recovery_checks=0, recovery_delay=1000.0, clock=FakeClock())
    t.observe({"a": (False, "ecc")})
    t.observe({"a": (True, "")})
    assert t.verdicts()["a"].healthy


def test_outage_without_a_reason_has_no_dangling_colon():
    assert outage_verdict("xdm", "  ", 0) == Verdict(False, "xdm unreachable since 1970-01-01T00:00:00Z")


def test_conflict_with_several_other_modes_names_them_in_a_stable_order():
    inv = h800_node(1)
    u0 = inv.cards[0].uuid
    cat = build_catalog(inv, PluginConfig())
    reasons = conflict_reasons(cat, {u0: frozenset({Kind.SHARE, Kind.MIG_INSTANCE, Kind.MIG})})
    assert reasons[u0] == (
        "card 0 has MIG slices granted and has MIG instances granted and has tdm shares granted "
        "(another mode); unavailable as whole"
    )
