"""The committed generated code must equal a fresh generation from proto/."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.skipif(importlib.util.find_spec("grpc_tools") is None, reason="grpcio-tools not installed")
def test_generated_code_is_fresh(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, str(ROOT / "tools" / "gen_protos.py"), "--out", str(tmp_path)], check=True, capture_output=True
    )
    fresh = {
        p.relative_to(tmp_path): p.read_bytes()
        for p in (tmp_path / "nomad_plugin" / "_proto").rglob("*")
        if p.is_file()
    }
    committed = {
        p.relative_to(ROOT): p.read_bytes()
        for p in (ROOT / "nomad_plugin" / "_proto").rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    }
    assert set(fresh) - {Path("nomad_plugin/_proto/__init__.py")} <= set(committed), (
        "missing generated files: run `make protos`"
    )
    stale = sorted(str(k) for k in fresh if k in committed and fresh[k] != committed[k] and k.name != "__init__.py")
    assert not stale, f"stale generated code (run `make protos`): {stale}"


def test_wire_names_match_nomad() -> None:
    from nomad_plugin._proto.nomad import base_pb2, device_pb2, hcl_spec_pb2

    assert (
        device_pb2.DESCRIPTOR.services_by_name["DevicePlugin"].full_name
        == "hashicorp.nomad.plugins.device.DevicePlugin"
    )
    assert (
        base_pb2.DESCRIPTOR.services_by_name["BasePlugin"].full_name == "hashicorp.nomad.plugins.base.proto.BasePlugin"
    )
    assert hcl_spec_pb2.Spec.DESCRIPTOR.fields_by_name["Attr"].number == 3
    assert device_pb2.DetectedDevice.DESCRIPTOR.fields_by_name["ID"].number == 1
    assert base_pb2.PluginType.Value("DEVICE") == 3
