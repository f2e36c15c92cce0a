"""The host's own Go unit tests (spec conversion, HCL v1 reshaping, msgpack
bytes, Nomad's validation rules), compiled by ``make go-tools`` with Debian's Go
in GOPATH mode and run here."""

from __future__ import annotations

from pathlib import Path

from tests.conformance.hostlib import build_module


def test_go_unit_tests_pass(conformance_host: Path) -> None:
    output = build_module().go_test()
    assert "--- PASS" in output and output.rstrip().endswith("PASS"), output
