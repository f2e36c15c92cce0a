"""CI runs the property tests deterministically, as tests/conftest.py promises.

Checked through the real entry points: ``.ci/run`` must hand ``CI`` to
``make`` (a ``make`` shim on PATH records what it got), and with ``CI`` set
two separate interpreters must draw the very same hypothesis examples.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

DRAW = """
import json, sys
import tests.conftest  # noqa: F401  (selects the profile from CI, as pytest does)
from hypothesis import given, settings, strategies as st
seen = []
@settings(max_examples=25, database=None)
@given(st.integers(min_value=0, max_value=2**62))
def probe(x):
    seen.append(x)
probe()
print(json.dumps({"derandomize": settings.default.derandomize, "seen": seen}))
"""


def _draw(ci: bool) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    if ci:
        env["CI"] = "1"
    out = subprocess.run([sys.executable, "-c", DRAW], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_ci_entry_point_sets_ci_for_make(tmp_path: Path) -> None:
    record = tmp_path / "make-env"
    shim = tmp_path / "make"
    shim.write_text(f'#!/bin/sh\nprintf "%s|%s" "${{CI-unset}}" "$*" > {record}\n')
    shim.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    env["PATH"] = f"{tmp_path}:{env['PATH']}"
    done = subprocess.run([str(REPO / ".ci" / "run")], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert record.read_text() == "1|test", "`.ci/run` must run `make test` with CI=1"


def test_ci_profile_draws_the_same_examples_in_every_process() -> None:
    first, second = _draw(ci=True), _draw(ci=True)
    assert first["derandomize"] is True
    assert len(first["seen"]) >= 10
    assert first["seen"] == second["seen"]


def test_without_ci_examples_are_random() -> None:
    """The contrast that shows the check above can fail: locally each run explores anew."""
    first, second = _draw(ci=False), _draw(ci=False)
    assert first["derandomize"] is False
    assert first["seen"] != second["seen"]
