"""A relapse during recovery starts the recovery over: timer and check count.

A card that faults again while "recovering" must earn its full delay (or
its full run of healthy checks) from the relapse on, not from when it first
looked healthy: a flapping card would otherwise come back early, between
two faults.
"""

from __future__ import annotations

from nomad_plugin.nomad.fingerprint import HealthTracker

FAULT, OK = {"c": (False, "XID 79")}, {"c": (True, "")}


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_relapse_restarts_the_recovery_delay():
    clock = Clock()
    tracker = HealthTracker(recovery_checks=100, recovery_delay=10.0, clock=clock)
    tracker.observe(FAULT)
    clock.now += 1
    tracker.observe(OK)  # recovering since t+1
    clock.now += 7
    tracker.observe(FAULT)  # relapse at t+8
    clock.now += 1
    tracker.observe(OK)  # recovering again since t+9
    assert tracker.next_deadline() == clock.now + 10.0
    clock.now += 4  # t+13: 12 s after the first healthy report, only 4 s after the relapse
    verdict = tracker.verdicts()["c"]
    assert not verdict.healthy and "recovering from: XID 79" in verdict.description, verdict
    clock.now += 6  # t+19: 10 s of continuous health since the relapse
    assert tracker.verdicts()["c"].healthy


def test_relapse_restarts_the_check_count():
    clock = Clock()
    tracker = HealthTracker(recovery_checks=3, recovery_delay=3600.0, clock=clock)
    tracker.observe(FAULT)
    tracker.observe(OK)
    tracker.observe(OK)  # 2 of 3 healthy checks
    tracker.observe(FAULT)  # relapse: back to 0
    tracker.observe(OK)
    tracker.observe(OK)
    assert not tracker.verdicts()["c"].healthy, "eligible after 2 checks since the relapse"
    tracker.observe(OK)
    assert tracker.verdicts()["c"].healthy
