"""Suite-wide settings: deterministic property tests in CI.

Locally hypothesis explores new random examples on every run (that is how
the fuzz corpus grows); in CI (``CI`` set: ``.ci/run`` exports ``CI=1``, and
``tools/stress_suite.sh`` does too) the examples are derived from each
test's name, so a landing never depends on luck. Failures found either way
are kept as explicit examples or corpus cases. tests/test_ci_determinism.py
checks all of this.

The session also fails when a system path (tests/system_paths.py: the default
data_dir, XDM's socket tree, the unpack cache, the agent's configuration)
changed while it ran: tests write only under temporary directories.
"""

from __future__ import annotations

import os
import sys

import pytest
from hypothesis import settings

settings.register_profile("ci", derandomize=True, print_blob=True)
PROFILE = "ci" if os.environ.get("CI") else "default"
settings.load_profile(PROFILE)


def pytest_report_header() -> str:
    return f"hypothesis profile: {PROFILE} (derandomize={settings.default.derandomize})"


# --- system paths: no test may change them (tests/system_paths.py) ---------------------------

_SYSTEM_BEFORE: dict[str, tuple[object, ...]] = {}


def pytest_sessionstart(session: pytest.Session) -> None:
    from tests.system_paths import snapshot

    _SYSTEM_BEFORE.update(snapshot())


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    from tests.system_paths import changes, snapshot

    if not _SYSTEM_BEFORE or hasattr(session.config, "workerinput"):
        return
    changed = changes(_SYSTEM_BEFORE, snapshot())
    if not changed:
        return
    shown = "\n  ".join(changed[:20]) + (f"\n  ... and {len(changed) - 20} more" if len(changed) > 20 else "")
    sys.stderr.write(
        "\nsystem paths changed during the tests (tests must write only under temporary directories; "
        f"another process on this machine may also have written them):\n  {shown}\n"
    )
    session.exitstatus = pytest.ExitCode.TESTS_FAILED
