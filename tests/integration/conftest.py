"""Fixtures for the cross-layer integration tests: the conformance host (built once), an h800-8
simulator node and a Nomad API double; a test file that needs another node defines its own."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.conformance.conftest import conformance_host, plugin_executable
from tests.doubles.nomad_api import NomadApiDouble
from tests.integration.harness import Node, sim_node

__all__ = ["api", "conformance_host", "node", "plugin_executable"]


@pytest.fixture
def node() -> Iterator[Node]:
    with sim_node("h800-8") as n:
        yield n


@pytest.fixture
def api() -> Iterator[NomadApiDouble]:
    with NomadApiDouble() as double:
        yield double
