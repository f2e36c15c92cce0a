"""Fixtures for the Go-oracle tests (tests/jobspec/oracle/README.md)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.jobspec.oracle import build
from tests.jobspec.oracle.client import GoOracle


@pytest.fixture(scope="session")
def go_oracle() -> Iterator[GoOracle]:
    """The oracle ``make go-tools`` built. Nothing is built here: a cold Go build outlasts a test's
    timeout on a loaded box. Skips only outside CI when Go or go-version is absent (CI installs
    both through `make go-deps`); a missing or stale oracle fails the tests, naming the make target."""
    why = build.missing()
    if why and not os.environ.get("CI"):
        pytest.skip(f"no Go oracle: {why}")
    why = why or build.problem()
    if why:
        pytest.fail(f"no Go oracle: {why}", pytrace=False)
    oracle = GoOracle(build.BINARY)
    yield oracle
    oracle.close()
