"""Fixtures for the Go-oracle tests (tests/jobspec/oracle/README.md)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.jobspec.oracle import build
from tests.jobspec.oracle.client import GoOracle


@pytest.fixture(scope="session")
def go_oracle() -> Iterator[GoOracle]:
    """The oracle, built once per session. Skips only when Go or go-version is
    absent (CI installs both through `make go-deps`); any other build failure
    fails the tests."""
    why = build.missing()
    if why:
        pytest.skip(f"no Go oracle: {why}")
    try:
        binary = build.build()
    except build.BuildError as exc:
        pytest.fail(f"building the Go oracle failed: {exc}", pytrace=False)
    oracle = GoOracle(binary)
    yield oracle
    oracle.close()
