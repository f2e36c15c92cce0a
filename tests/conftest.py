"""Suite-wide settings: deterministic property tests in CI.

Locally hypothesis explores new random examples on every run (that is how
the fuzz corpus grows); in CI (``CI`` set, as ``.ci/run`` runs) the examples
are derived from each test's name, so a landing never depends on luck.
Failures found either way are kept as explicit examples or corpus cases.
"""

from __future__ import annotations

import os

from hypothesis import settings

settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")
