"""Short chaos soak in CI: the real plugin, the conformance host, the simulator and the Nomad API double.

Runs ``python -m tests.soak.soak`` for 75 s with a fixed seed (about 2 minutes
with start-up and wind-down) and fails on any invariant violation or leaked
grant. The long run is ``benchmarks/soak_long.sh``.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from tests.conformance.hostlib import REPO, built_host

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


def test_short_soak_has_no_violation_and_no_leak():
    if shutil.which("go") is None:
        pytest.skip("go is missing: install golang-go and the Debian packages in tests/conformance/README.md")
    built_host()
    proc = subprocess.run(
        [sys.executable, "-m", "tests.soak.soak", "--minutes", "1.25", "--seed", "3", "--warmup", "15"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=220,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    assert lines, f"no summary (rc={proc.returncode}); stderr tail:\n{proc.stderr[-3000:]}"
    summary = json.loads(lines[-1])
    assert summary["violations"] == 0, json.dumps(summary["violation_samples"], indent=1)
    assert summary["leaked_grants"] == 0
    assert proc.returncode == 0
    # The soak must really have exercised the faults it claims to survive.
    faults = summary["faults"]
    assert faults.get("reserve_storm", 0) >= 5 and summary["reserves"].get("ok", 0) >= 10, faults
    assert sum(v for k, v in faults.items() if k.startswith("sigkill")) >= 1, faults
    assert faults.get("xdm_restart", 0) + faults.get("xdm_crash", 0) >= 1, faults
    assert summary["plugin_processes"] >= 2
    assert summary["invariant_checks"]["journal_matches_xdm"] >= 2
