"""The host's own Go unit tests (spec conversion, HCL v1 reshaping, msgpack
bytes, Nomad's validation rules), run with Debian's Go in GOPATH mode."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from tests.conformance.hostlib import HERE


def test_go_unit_tests_pass(conformance_host: Path) -> None:
    spec = importlib.util.spec_from_file_location("conformance_build", HERE / "build.py")
    assert spec is not None and spec.loader is not None
    build = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build)
    output = build.go_test()
    assert output.startswith("ok"), output
