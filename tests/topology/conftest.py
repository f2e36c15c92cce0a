"""Fixtures for the topology, node metadata and Runtime Kit tests: the conformance host, built once."""

from __future__ import annotations

from tests.conformance.conftest import conformance_host, plugin_executable

__all__ = ["conformance_host", "plugin_executable"]
