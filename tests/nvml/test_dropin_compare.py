"""The real plugin against the restated nomad-device-nvidia, item by item, on every scenario.

Every scenario of ``dropin_scenarios`` runs the real plugin executable under
the Go conformance host on the NVML double (three at a time), and the oracle
on the same double. Each item either matches or differs for a decision that
docs/nvidia-dropin.md documents; none may differ otherwise, and no decision
is of critical or high severity.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.conformance.conftest import conformance_host
from tests.nvml.dropin import DECISIONS, Item, Observed, compare, expected, run_plugin, summarize
from tests.nvml.dropin_scenarios import SCENARIOS

__all__ = ["conformance_host"]

DOC = Path(__file__).resolve().parents[2] / "docs" / "nvidia-dropin.md"
WORKERS = 3  # plugins at once: each waits on its host most of the time


@pytest.fixture(scope="module")
def runs(conformance_host: Path) -> Iterator[dict[str, tuple[list[Item], Observed]]]:
    def one(scenario):  # type: ignore[no-untyped-def]
        want = expected(scenario)
        got = run_plugin(scenario, conformance_host, want)
        return scenario.name, (compare(scenario, want, got), got)

    with ThreadPoolExecutor(WORKERS) as pool:
        yield dict(pool.map(one, SCENARIOS))


@pytest.fixture(scope="module")
def results(runs: dict[str, tuple[list[Item], Observed]]) -> dict[str, list[Item]]:
    return {name: items for name, (items, _) in runs.items()}


@pytest.mark.parametrize(
    ("scenario", "warning"),
    [
        ("enabled-false", "enabled = false: no device is fingerprinted"),
        ("period-0s", "fingerprint_period = 0s: cards are re-read every 1 s"),
        ("period-negative", "fingerprint_period = -1s: cards are re-read every 1 s"),
        ("mig-on-no-instances", "holds no MIG instance, so nothing of it is offered"),
        ("ignored", "which is in MIG mode: as in nomad-device-nvidia this hides none of its MIG instances"),
        ("h100-x8", "NVML backend, a drop-in for nomad-device-nvidia except on purpose"),
    ],
)
def test_the_plugin_warns_where_it_departs_on_purpose(
    runs: dict[str, tuple[list[Item], Observed]], scenario: str, warning: str
) -> None:
    stderr = runs[scenario][1].run.stderr
    lines = [line for line in stderr.splitlines() if warning in line]
    assert lines and all("[WARN]" in line for line in lines), stderr[-3000:]


@pytest.mark.parametrize("scenario", [s.name for s in SCENARIOS])
def test_every_item_matches_or_is_a_documented_decision(results: dict[str, list[Item]], scenario: str) -> None:
    items = results[scenario]
    undocumented = summarize(items)["undocumented"]
    assert not undocumented, "\n".join(undocumented)
    assert items, f"{scenario}: nothing was compared"


def test_no_decision_left_is_critical_or_high_and_each_is_in_the_doc(results: dict[str, list[Item]]) -> None:
    used = {i.decision for items in results.values() for i in items if i.decision}
    doc = DOC.read_text()
    anchors = set(re.findall(r'<a id="([a-z0-9-]+)"></a>', doc))
    for key in used:
        decision = DECISIONS[key]
        assert decision.severity in ("medium", "low"), f"{key} is {decision.severity}"
        assert decision.anchor in anchors, f"docs/nvidia-dropin.md has no section {decision.anchor!r} for {key}"


def test_the_comparison_reaches_groups_attributes_stats_and_reserves(results: dict[str, list[Item]]) -> None:
    items = [i for group in results.values() for i in group]
    kinds = {
        "attribute": [i for i in items if " attribute " in i.what],
        "stat": [i for i in items if i.what.startswith("stats ") and i.what.count(" ") >= 2],
        "reserve": [i for i in items if i.what.startswith("reserve ")],
        "device": [i for i in items if i.what.startswith("device ")],
    }
    for kind, found in kinds.items():
        assert found and all(i.matches or i.decision for i in found), kind
    summary = summarize(items)
    assert summary["match"] > 0.9 * summary["items"], summary
