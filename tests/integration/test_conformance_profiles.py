"""Every simulator profile x every applicable card mode, end to end.

The real plugin executable runs under the Go conformance host (Nomad's three
launches, every answer checked against Nomad's rules) against a simulated XDM
node. For each case the test derives, from the simulator's own card list, the
exact device groups and instance IDs docs/fingerprint.md promises, reserves
from every kind of group the node advertises, and checks each grant XDM holds
(sim.grants()) against the environment the task would get.

The cases run concurrently in a module fixture (each has its own simulator,
plugin process and tmp dir); the parametrised tests then check one case each.
"""

from __future__ import annotations

import concurrent.futures
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from nomad_plugin.sim import GrantRecord
from nomad_plugin.sim.profiles import CardSpec
from tests.conformance.hostlib import Event, HostRun, start_host
from tests.integration.harness import (
    MIG_MEMORY_PARTS,
    MIG_UNITS,
    assert_conformant,
    attr_value,
    first_fingerprint_with_devices,
    group_attrs,
    group_map,
    reserve,
    set_of,
    sim_node,
)

GroupKey = tuple[str, str, str]
# A card's mode in a case: ("whole", 0), ("tdm", shares) or ("mig", 7).
ModeOf = Callable[[CardSpec], tuple[str, int]]

MIG_PROFILES = ("h800-8", "a100-8")
NON_MIG_PROFILES = ("m890p-8", "810e-16", "l20-8")
ALL_PROFILES = MIG_PROFILES + NON_MIG_PROFILES
TDM_SHARES = {"h800-8": 10, "a100-8": 4, "m890p-8": 8, "810e-16": 10, "l20-8": 5}
MIXED_SHARES = 4
FALLBACK_LOG = re.compile(r"mode mig \(.*\) but the model is not MIG-capable.*advertised whole")


@dataclass(frozen=True)
class Case:
    id: str
    profile: str
    sets: tuple[str, ...]
    mode_of: ModeOf
    group_by_numa: bool = False
    expect_fallback_log: bool = False


def _whole(_: CardSpec) -> tuple[str, int]:
    return ("whole", 0)


def _tdm(shares: int) -> ModeOf:
    return lambda _card: ("tdm", shares)


def _mig(card: CardSpec) -> tuple[str, int]:
    return ("mig", MIG_UNITS) if card.mig_capable else ("whole", 0)


def _mixed(card: CardSpec) -> tuple[str, int]:
    if card.minor == 0:
        return ("tdm", MIXED_SHARES)
    if card.minor == 1:
        return _mig(card)
    return ("whole", 0)


def _cases() -> list[Case]:
    cases: list[Case] = []
    for profile in ALL_PROFILES:
        cases.append(Case(f"{profile}-whole", profile, (), _whole))
        shares = TDM_SHARES[profile]
        tdm_sets = (set_of("default_mode", "tdm"),) + (() if shares == 10 else (set_of("tdm_shares", shares),))
        cases.append(Case(f"{profile}-tdm{shares}", profile, tdm_sets, _tdm(shares)))
        cases.append(Case(f"{profile}-numa", profile, (set_of("group_by", "numaNodes"),), _whole, group_by_numa=True))
        mixed = set_of("card", [{"match": "0", "mode": "tdm", "shares": MIXED_SHARES}, {"match": "1", "mode": "mig"}])
        cases.append(
            Case(f"{profile}-mixed", profile, (mixed,), _mixed, expect_fallback_log=profile in NON_MIG_PROFILES)
        )
        if profile in MIG_PROFILES:
            cases.append(Case(f"{profile}-mig", profile, (set_of("default_mode", "mig"),), _mig))
        else:
            cases.append(
                Case(
                    f"{profile}-mig-fallback", profile, (set_of("default_mode", "mig"),), _mig, expect_fallback_log=True
                )
            )
    return cases


CASES = _cases()


# ------------------------------------------------------------------ expectations


def expected_groups(cards: list[CardSpec], mode_of: ModeOf, group_by_numa: bool) -> dict[GroupKey, list[str]]:
    """Group key -> sorted instance IDs, as docs/fingerprint.md defines them."""
    groups: dict[GroupKey, list[str]] = {}
    for card in cards:
        mode, n = mode_of(card)
        if mode == "whole":
            name = f"{card.model} numa{card.numa_node}" if group_by_numa else card.model
            groups.setdefault((card.vendor, card.xpu_type, name), []).append(card.uuid)
        elif mode == "tdm":
            key = (card.vendor, f"{card.xpu_type}-share", f"{card.model} card{card.minor}")
            groups[key] = [f"{card.uuid}-share-{i}" for i in range(n)]
        else:
            key = (card.vendor, f"{card.xpu_type}-mig", f"{card.model} card{card.minor}")
            groups[key] = [f"{card.uuid}-mig-{i}" for i in range(n)]
    return {k: sorted(v) for k, v in groups.items()}


# ------------------------------------------------------------------ running a case


@dataclass
class Outcome:
    case: Case
    cards: list[CardSpec] = field(default_factory=list)
    fingerprint: Event = field(default_factory=dict)
    reserves: dict[str, Event] = field(default_factory=dict)
    reserve_ids: dict[str, list[str]] = field(default_factory=dict)
    grants: dict[str, GrantRecord] = field(default_factory=dict)
    numeric_stats: Event | None = None
    first_with_devices: Event = field(default_factory=dict)
    run: HostRun | None = None


def _numbers(summary: dict[str, Any]) -> list[Any]:
    return [v for k, v in summary.items() if k.endswith(("_numerator", "_val", "_value"))]


def _all_numeric(e: Event) -> bool:
    if e["event"] != "stats" or e["n_instances"] == 0:
        return False
    return all(_numbers(i["summary"]) for g in e["groups"] for i in g["instances"].values())


def _ids_by_group(fp: Event) -> dict[GroupKey, list[str]]:
    return {k: sorted(d["id"] for d in devs) for k, devs in group_map(fp).items()}


def _pick(fp: Event, type_suffix: str, count: int) -> tuple[GroupKey, list[str]] | None:
    """The first group of a kind with at least `count` healthy instances, and its first IDs."""
    for g in fp["groups"]:
        kind = g["type"].rpartition("-")[2] if "-" in g["type"] else ""
        if kind == type_suffix and sum(d["healthy"] for d in g["devices"]) >= count:
            ids = [d["id"] for d in g["devices"] if d["healthy"]][:count]
            return (g["vendor"], g["type"], g["name"]), ids
    return None


def run_case(case: Case, host_binary: Path) -> Outcome:
    out = Outcome(case)
    with sim_node(case.profile) as node:
        out.cards = list(node.sim.cards)
        args = [*node.plugin_args(*case.sets), "--duration", "0", "--stats-interval", "0.5"]
        proc = start_host(args, binary=host_binary)
        try:
            out.first_with_devices = first_fingerprint_with_devices(proc)
            # The XDM backend settles before it publishes cards (first resync and
            # first ListAndWatch push), so the first fingerprint with devices is
            # already the complete node: topology groups, driver version, health.
            fp = out.first_with_devices
            out.fingerprint = fp
            plan = {"whole": _pick(fp, "", 2), "share": _pick(fp, "share", 3), "mig": _pick(fp, "mig", MIG_UNITS)}
            for tag, picked in plan.items():
                if picked is None:
                    continue
                ids = picked[1]
                if tag == "mig":
                    out.reserve_ids["mig-5"] = ids[:5]
                    out.reserves["mig-5"] = reserve(proc, ids[:5], "mig-5", expect="error")
                    ids = ids[:3]
                out.reserve_ids[tag] = ids
                out.reserves[tag] = reserve(proc, ids, tag)
            # The stats stream catches up with the grants: a round where every
            # instance (granted ones included) has a numeric summary.
            after = max((e["t_mono_ns"] for e in out.reserves.values()), default=0)
            try:
                out.numeric_stats = proc.wait_for(lambda e: e["t_mono_ns"] > after and _all_numeric(e), timeout=60)
            except TimeoutError:
                pass
            out.grants = node.sim.grants()
        finally:
            out.run = proc.finish(timeout=30)
    return out


@pytest.fixture(scope="module")
def outcomes(conformance_host: Path) -> dict[str, Outcome | BaseException]:
    results: dict[str, Outcome | BaseException] = {}
    with concurrent.futures.ThreadPoolExecutor(max_workers=6) as pool:
        futures = {pool.submit(run_case, case, conformance_host): case.id for case in CASES}
        for future in concurrent.futures.as_completed(futures):
            try:
                results[futures[future]] = future.result()
            except BaseException as exc:
                results[futures[future]] = exc
    return results


def _outcome(outcomes: dict[str, Outcome | BaseException], case: Case) -> Outcome:
    got = outcomes[case.id]
    if isinstance(got, BaseException):
        raise got
    return got


# ------------------------------------------------------------------ the checks


def _check_attributes(out: Outcome, attrs: dict[GroupKey, dict[str, Any]]) -> None:
    by_uuid = {c.uuid: c for c in out.cards}
    for key, ids in group_map(out.fingerprint).items():
        a = attrs[key]
        card = by_uuid[ids[0]["id"].split("-share-")[0].split("-mig-")[0]]
        assert attr_value(a, "model") == card.model, key
        assert a["memory"] == {"value": card.memory_mib, "unit": "MiB", "kind": "int"}, key
        if key[1].endswith("-share"):
            n = len(ids)
            assert attr_value(a, "share_count") == n
            assert attr_value(a, "share_core_percent") == 100 // n
            assert a["share_memory"]["unit"] == "GiB" and a["share_memory"]["value"] == card.memory_gib // n
            assert attr_value(a, "minor") == card.minor
            assert attr_value(a, "uuid") == card.uuid
        elif key[1].endswith("-mig"):
            assert attr_value(a, "slice_units") == MIG_UNITS
            assert a["slice_memory"]["value"] == card.memory_gib // MIG_MEMORY_PARTS
            assert attr_value(a, "slice_sizes") == "1,2,3,4,7"
        elif out.case.group_by_numa:
            assert attr_value(a, "topology.numaNodes") == card.numa_node, key
            assert "minor" not in a and "uuid" not in a, key


def _check_grant(out: Outcome, tag: str, attrs: dict[GroupKey, dict[str, Any]]) -> None:
    event, ids = out.reserves[tag], out.reserve_ids[tag]
    assert event["ok"] is True, event
    envs = event["envs"]
    grant = out.grants[envs["LINGJUN_GRANT_ID"]]
    key = tuple(event["group"].split("/", 2))
    card_uuids = [i.split("-share-")[0].split("-mig-")[0] for i in ids]
    cards = [next(c for c in out.cards if c.uuid == u) for u in dict.fromkeys(card_uuids)]
    assert envs["LINGJUN_DEVICE_IDS"] == ",".join(ids)
    assert envs["LINGJUN_DEVICE_MINORS"] == ",".join(str(c.minor) for c in cards)
    assert grant.minors == tuple(c.minor for c in cards)
    vendor = cards[0].vendor
    if tag == "whole":
        assert (grant.core, grant.memory, grant.slice) == (0, 0, 0), grant
        assert envs["LINGJUN_MODE"] == "whole"
        assert len(grant.minors) == 2
    elif tag == "share":
        share_core = attr_value(attrs[key], "share_core_percent")
        share_mem = attr_value(attrs[key], "share_memory")
        assert (grant.core, grant.memory, grant.slice) == (min(100, 3 * share_core), 3 * share_mem, 0), grant
        assert envs["LINGJUN_MODE"] == "tdm"
        assert envs["LINGJUN_CORE_LIMIT_PERCENT"] == str(grant.core)
        assert envs["LINGJUN_MEMORY_LIMIT_GIB"] == str(grant.memory)
    else:
        slice_mem = attr_value(attrs[key], "slice_memory")
        assert (grant.slice, grant.memory) == (3, 3 * slice_mem), grant
        assert envs["LINGJUN_MODE"] == "mig" and envs["LINGJUN_MIG_SLICES"] == "3"
    if vendor == "nvidia":
        mig_uuids = [d.mig_uuid for d in grant.devices if d.mig_uuid]
        assert envs["NVIDIA_VISIBLE_DEVICES"] == ",".join(mig_uuids or [c.uuid for c in cards])
        assert "PPU_VISIBLE_DEVICES" not in envs
    else:
        assert "NVIDIA_VISIBLE_DEVICES" not in envs
        # The plugin's default is the minors; XDM's own envs may override it (the simulator names UUIDs).
        assert envs["PPU_VISIBLE_DEVICES"] in (",".join(str(c.minor) for c in cards), ",".join(c.uuid for c in cards))


@pytest.mark.timeout(900)  # the first case's setup runs every profile (6 plugins at once)
@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_profile_mode(outcomes: dict[str, Outcome | BaseException], case: Case) -> None:
    out = _outcome(outcomes, case)
    run = out.run
    assert run is not None
    assert_conformant(run)
    assert [s["launch"] for s in run.of("shutdown")] == [1, 2, 3], run.describe()

    # The first fingerprint is empty and immediate; then the node's real groups.
    fps = run.of("fingerprint")
    assert fps[0]["seq"] == 1
    fp = out.fingerprint
    got = _ids_by_group(fp)
    assert got == expected_groups(out.cards, case.mode_of, case.group_by_numa)
    # The first fingerprint with devices is already the complete node (checked
    # above: its groups are exactly the expected ones, healthy, with PCI IDs).
    assert fp is out.first_with_devices
    for key, devs in group_map(fp).items():
        for d in devs:
            assert d["healthy"] is True and d["health_description"] == "", (key, d)
            card = next(c for c in out.cards if d["id"].startswith(c.uuid))
            assert d["pci_bus_id"] == card.pci_bus_id.lower(), d
    attrs = group_attrs(fp)
    _check_attributes(out, attrs)

    # Stats: instance keys are fingerprinted IDs (the host enforces it) and every
    # instance of the node is reported with a numeric summary.
    fingerprinted = {d["id"] for devs in group_map(fp).values() for d in devs}
    stats = [s for s in run.of("stats") if s["n_instances"] > 0]
    assert stats, run.describe()
    last = stats[-1]
    seen = {i for g in last["groups"] for i in g["instances"]}
    assert seen == fingerprinted
    numeric = out.numeric_stats
    assert numeric is not None, "no stats round with a numeric summary for every instance: " + str(
        [(i, x["summary"]) for g in last["groups"] for i, x in g["instances"].items() if not _numbers(x["summary"])][:3]
    )
    assert numeric["t_mono_ns"] > max(e["t_mono_ns"] for e in out.reserves.values())
    for g in numeric["groups"]:
        for iid, inst in g["instances"].items():
            assert all(isinstance(v, int | float) for v in _numbers(inst["summary"])), (iid, inst)
            assert inst["timestamp_unix_ns"] > 0

    # Reserves: one from each kind of group the node advertises, checked against XDM.
    expected_tags = {k[1].rpartition("-")[2] for k in got if "-" in k[1]}
    if any(len(ids) >= 2 for k, ids in got.items() if "-" not in k[1]):
        expected_tags.add("whole")
    assert set(out.reserves) == expected_tags | ({"mig-5"} if "mig" in expected_tags else set())
    for tag in ("whole", "share", "mig"):
        if tag in out.reserves:
            _check_grant(out, tag, attrs)
    if "mig-5" in out.reserves:
        bad = out.reserves["mig-5"]
        assert bad["ok"] is False and bad["code"] == "InvalidArgument", bad
        assert "5 MIG units" in bad["message"] and "1, 2, 3, 4 or 7" in bad["message"], bad
    granted = {e["envs"]["LINGJUN_GRANT_ID"] for t, e in out.reserves.items() if t != "mig-5"}
    assert set(out.grants) == granted, out.grants

    fallback_logged = bool(FALLBACK_LOG.search(run.stderr))
    assert fallback_logged is case.expect_fallback_log, "mig fallback log line " + (
        "missing" if case.expect_fallback_log else "unexpected"
    )
