"""Health, live: simulator faults reach the host's Fingerprint stream.

The real plugin runs under the conformance host in --stdin mode (streams stay
open) against a simulated H800 node. Card faults, XDM crashes and restarts
are injected in the simulator; the test watches what Nomad would see.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from datetime import datetime, timezone
from pathlib import Path

import pytest

from tests.conformance.hostlib import Event, HostProcess, start_host
from tests.integration.harness import (
    Node,
    assert_conformant,
    first_fingerprint_with_devices,
    set_of,
    sim_node,
)

SINCE = re.compile(r"xdm unreachable since (\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ): (.+)")
TDM_CARD = 3
# Deadlines only bound a wait for a condition; a loaded box may be many times slower.
DEADLINE_S = 60
TDM_SHARES = 4


def devices(fp: Event) -> dict[str, dict[str, object]]:
    return {d["id"]: d for g in fp["groups"] for d in g["devices"]}


def fp_after(t_ns: int, predicate: Callable[[Event], bool]) -> Callable[[Event], bool]:
    """A fingerprint received after wall time `t_ns` that satisfies `predicate`."""
    return lambda e: e["event"] == "fingerprint" and e["recv_unix_ns"] >= t_ns and predicate(e)


def all_healthy(fp: Event) -> bool:
    return all(d["healthy"] and not d["health_description"] for d in devices(fp).values())


@pytest.fixture
def live(conformance_host: Path) -> Iterator[Callable[..., tuple[Node, HostProcess]]]:
    """`live(*sets)` -> (node, host process) with a settled first fingerprint; cleaned up after."""
    opened: list[tuple[object, HostProcess]] = []

    def _open(*sets: str) -> tuple[Node, HostProcess]:
        ctx = sim_node("h800-8")
        node = ctx.__enter__()
        args = [*node.plugin_args(*sets, phase="run"), "--duration", "0", "--stats-interval", "0.5"]
        proc = start_host(args, binary=conformance_host)
        opened.append((ctx, proc))
        first = first_fingerprint_with_devices(proc)
        try:
            if not all_healthy(first):
                proc.wait_for(
                    lambda e: e["event"] == "fingerprint" and all_healthy(e) and e["n_devices"] > 0, timeout=DEADLINE_S
                )
        except TimeoutError:
            fps = [e for e in proc.events if e["event"] == "fingerprint"]
            raise AssertionError(f"node never settled all healthy; last fingerprint: {fps[-1:]}") from None
        return node, proc

    yield _open
    for ctx, proc in opened:
        if proc.proc.poll() is None:
            proc.finish(timeout=10)
        ctx.__exit__(None, None, None)  # type: ignore[attr-defined]


def _finish_clean(proc: HostProcess) -> None:
    run = proc.finish()
    assert_conformant(run)
    assert run.of("run_end")[-1]["reason"] == "stop command"  # the streams never ended on their own


def test_card_fault_marks_its_instances_then_clears(live: Callable[..., tuple[Node, HostProcess]]) -> None:
    """checks=1: unhealthy at once on the fault, eligible again on the first healthy report."""
    node, proc = live(
        set_of("health_recovery_checks", 1),
        set_of("health_recovery_delay", "1s"),
        set_of("card", [{"match": str(TDM_CARD), "mode": "tdm", "shares": TDM_SHARES}]),
    )
    tdm_uuid = node.sim.cards[TDM_CARD].uuid
    whole_uuid = node.sim.cards[5].uuid

    flipped = time.time_ns()
    node.sim.set_health(TDM_CARD, False, "XID 79")
    fp = proc.wait_for(fp_after(flipped, lambda e: not all_healthy(e)), timeout=DEADLINE_S)
    bad = {i: d for i, d in devices(fp).items() if not d["healthy"]}
    assert set(bad) == {f"{tdm_uuid}-share-{i}" for i in range(TDM_SHARES)}, bad
    assert all("XID 79" in str(d["health_description"]) for d in bad.values())

    node.sim.set_health(5, False, "XID 48 double-bit ECC")
    fp = proc.wait_for(
        lambda e: e["event"] == "fingerprint" and devices(e).get(whole_uuid, {"healthy": True})["healthy"] is False,
        timeout=DEADLINE_S,
    )
    assert "XID 48" in str(devices(fp)[whole_uuid]["health_description"])

    cleared = time.time_ns()
    node.sim.set_health(TDM_CARD, True)
    node.sim.set_health(5, True)
    fp = proc.wait_for(fp_after(cleared, all_healthy), timeout=DEADLINE_S)
    _finish_clean(proc)


def test_recovery_waits_for_the_hysteresis_delay(live: Callable[..., tuple[Node, HostProcess]]) -> None:
    """checks=100, delay=1s: 'recovering from' first, eligible after ~1 s of continuous health."""
    node, proc = live(set_of("health_recovery_checks", 100), set_of("health_recovery_delay", "1s"))
    uuid = node.sim.cards[2].uuid
    node.sim.set_health(2, False, "XID 79")
    proc.wait_for(
        lambda e: e["event"] == "fingerprint" and devices(e).get(uuid, {"healthy": True})["healthy"] is False,
        timeout=DEADLINE_S,
    )

    healthy_again = time.time_ns()
    node.sim.set_health(2, True)
    recovering = proc.wait_for(
        lambda e: (
            e["event"] == "fingerprint" and "recovering from" in str(devices(e).get(uuid, {}).get("health_description"))
        ),
        timeout=DEADLINE_S,
    )
    assert devices(recovering)[uuid]["healthy"] is False
    assert "XID 79" in str(devices(recovering)[uuid]["health_description"])
    ok = proc.wait_for(fp_after(healthy_again, all_healthy), timeout=DEADLINE_S)
    waited = (ok["recv_unix_ns"] - healthy_again) / 1e9
    assert waited >= 0.9, f"eligible {waited:.2f} s after health returned, before the 1 s recovery delay"
    _finish_clean(proc)


def _outage_fp(proc: HostProcess, since_ns: int, timeout: float) -> Event:
    """The first fingerprint after `since_ns` with every device unhealthy because XDM is unreachable."""

    def outage(e: Event) -> bool:
        found = devices(e).values()
        return bool(found) and all(not d["healthy"] and SINCE.search(str(d["health_description"])) for d in found)

    return proc.wait_for(fp_after(since_ns, outage), timeout=timeout)


def _since_of(fp: Event) -> datetime:
    text = str(next(iter(devices(fp).values()))["health_description"])
    match = SINCE.search(text)
    assert match, text
    return datetime.strptime(match.group(1), "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc)


def test_xdm_crash_makes_everything_unhealthy_and_revive_recovers(
    live: Callable[..., tuple[Node, HostProcess]],
) -> None:
    node, proc = live(set_of("health_recovery_checks", 3), set_of("health_recovery_delay", "30s"))
    before = devices([e for e in proc.events if e["event"] == "fingerprint"][-1])
    crashed = time.time()
    node.sim.crash()
    fp = _outage_fp(proc, int(crashed * 1e9), timeout=DEADLINE_S)
    # Same devices as before (kept through the outage), all unhealthy, naming XDM and since when.
    assert set(devices(fp)) == set(before)
    # "since" (whole seconds) lies between the crash and the fingerprint that reports it.
    assert int(crashed) <= _since_of(fp).timestamp() <= fp["recv_unix_ns"] / 1e9, (crashed, fp)
    # The stats stream keeps going during the outage.
    outage_at = fp["t_mono_ns"]
    proc.wait_for(lambda e: e["event"] == "stats" and e["t_mono_ns"] > outage_at, timeout=DEADLINE_S)

    revived_at = time.time_ns()
    node.sim.revive()
    # An outage is not a card fault: instances follow card health at once (no 30 s hysteresis).
    revived = proc.wait_for(fp_after(revived_at, lambda e: all_healthy(e) and e["n_devices"] > 0), timeout=DEADLINE_S)
    assert revived["n_devices"] == fp["n_devices"]
    _finish_clean(proc)


def test_xdm_restart_recovers_without_operator(live: Callable[..., tuple[Node, HostProcess]]) -> None:
    node, proc = live(set_of("health_recovery_checks", 3), set_of("health_recovery_delay", "30s"))
    restarted = time.time_ns()
    node.sim.restart(downtime=0.5)
    outage = _outage_fp(proc, restarted, timeout=DEADLINE_S)
    fp = proc.wait_for(fp_after(restarted, lambda e: all_healthy(e) and e["n_devices"] > 0), timeout=DEADLINE_S)
    # While the sockets were gone the node said so; once back, all healthy again.
    assert fp["t_mono_ns"] > outage["t_mono_ns"]
    assert fp["n_devices"] == outage["n_devices"] == 8
    _finish_clean(proc)
