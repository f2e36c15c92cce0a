"""Fixtures for the go-plugin tests: a freshly launched plugin per test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from goplugin_harness import Plugin, launch


@pytest.fixture
def plugin() -> Iterator[Plugin]:
    p = launch()
    try:
        yield p
    finally:
        p.close()
