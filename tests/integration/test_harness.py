"""The one host violation the integration tests tolerate is recognised narrowly."""

from __future__ import annotations

from tests.conformance.hostlib import HostRun
from tests.integration.harness import stats_leading_fingerprint

GROUP = {"vendor": "alibaba", "type": "ppu", "name": "PPU M890P numa0", "devices": [{"id": "PPU-1"}]}


def _run(fp_at_ns: int, rule: str, detail: str) -> tuple[HostRun, dict[str, object]]:
    violation = {"event": "violation", "launch": 3, "t_mono_ns": 1_000_000_000, "rule": rule, "detail": detail}
    fp = {"event": "fingerprint", "launch": 3, "t_mono_ns": fp_at_ns, "groups": [GROUP]}
    return HostRun([violation, fp], 1, ""), violation


def test_stats_a_few_ms_ahead_of_their_fingerprint_are_recognised() -> None:
    run, v = _run(
        1_005_000_000, "stats.unknown_group", "stats group 0 alibaba/ppu/PPU M890P numa0 matches no fingerprinted group"
    )
    assert stats_leading_fingerprint(run, v)
    run, v = _run(
        1_005_000_000,
        "stats.unknown_instance",
        "stats for alibaba/ppu/PPU M890P numa0[PPU-1], an ID not fingerprinted in that group",
    )
    assert stats_leading_fingerprint(run, v)


def test_other_violations_are_not() -> None:
    late = 3_000_000_000
    run, v = _run(
        late, "stats.unknown_group", "stats group 0 alibaba/ppu/PPU M890P numa0 matches no fingerprinted group"
    )
    assert not stats_leading_fingerprint(run, v)
    run, v = _run(
        1_005_000_000,
        "stats.unknown_instance",
        "stats for alibaba/ppu/PPU M890P numa0[PPU-9], an ID not fingerprinted in that group",
    )
    assert not stats_leading_fingerprint(run, v)
    run, v = _run(
        1_005_000_000, "stats.unknown_group", "stats group 0 alibaba/ppu/other matches no fingerprinted group"
    )
    assert not stats_leading_fingerprint(run, v)
    run, v = _run(1_005_000_000, "fingerprint.stream_ended", "stream ended")
    assert not stats_leading_fingerprint(run, v)
