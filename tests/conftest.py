"""Suite-wide settings: deterministic property tests in CI.

Locally hypothesis explores new random examples on every run (that is how
the fuzz corpus grows); in CI (``CI`` set: ``.ci/run`` exports ``CI=1``, and
``tools/stress_suite.sh`` does too) the examples are derived from each
test's name, so a landing never depends on luck. Failures found either way
are kept as explicit examples or corpus cases. tests/test_ci_determinism.py
checks all of this.
"""

from __future__ import annotations

import os

from hypothesis import settings

settings.register_profile("ci", derandomize=True, print_blob=True)
PROFILE = "ci" if os.environ.get("CI") else "default"
settings.load_profile(PROFILE)


def pytest_report_header() -> str:
    return f"hypothesis profile: {PROFILE} (derandomize={settings.default.derandomize})"
