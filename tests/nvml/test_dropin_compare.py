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
from tests.nvml.dropin import DECISIONS, Item, compare, expected, run_plugin, summarize
from tests.nvml.dropin_scenarios import SCENARIOS

__all__ = ["conformance_host"]

DOC = Path(__file__).resolve().parents[2] / "docs" / "nvidia-dropin.md"
WORKERS = 3  # plugins at once: each waits on its host most of the time


@pytest.fixture(scope="module")
def results(conformance_host: Path) -> Iterator[dict[str, list[Item]]]:
    def one(scenario):  # type: ignore[no-untyped-def]
        want = expected(scenario)
        return scenario.name, compare(scenario, want, run_plugin(scenario, conformance_host, want))

    with ThreadPoolExecutor(WORKERS) as pool:
        yield dict(pool.map(one, SCENARIOS))


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
