"""``nomad-device-lingjun xdm-probe --capture DIR`` as an operator runs it, against a real simulator."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from nomad_plugin.sim import Simulator
from nomad_plugin.xdm.capture import CaptureBundle
from tests.captures.oracle import decode
from tests.doubles.drifted_schemas import served_schema

ROOT = Path(__file__).resolve().parents[2]
CMD = [sys.executable, "-m", "nomad_plugin.cli.main", "xdm-probe"]


@pytest.fixture
def short_dir():
    path = Path(tempfile.mkdtemp(prefix="cc", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _capture(sock: Path, out: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CMD, "--socket-dir", str(sock), "--capture", str(out), *extra],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_foreign_schema_without_reflection_is_captured_as_far_as_it_goes(short_dir):
    sock = short_dir / "s"
    with Simulator(sock, "h800-8", schema=served_schema("foreign"), control=False) as sim:
        out = _capture(sock, short_dir / "b1")
        assert out.returncode == 1, out.stderr
        assert "reflection on dp2mgr: none (UNIMPLEMENTED" in out.stdout
        assert "ListAndWatch           FAILED: UNIMPLEMENTED under every candidate service" in out.stdout
        bundle = CaptureBundle(short_dir / "b1")
        assert bundle.manifest["ok"] is False and bundle.raw("ListAndWatch") is None
        # the operator names the service: the device socket's RPCs are captured, raw
        named = _capture(sock, short_dir / "b2", "--set", f'xdm_service="{sim.schema.device_service}"')
        calls = {c["rpc"]: c for c in CaptureBundle(short_dir / "b2").manifest["calls"]}
        assert calls["ListAndWatch"]["ok"] and calls["ExporterDataStream"]["ok"], named.stdout
        assert not calls["QueryStatus"]["ok"]  # the config package is still unknown without reflection
        sim.set_reflection(True)
        full = _capture(sock, short_dir / "b3")
        assert full.returncode == 0, full.stdout + full.stderr
        bundle = CaptureBundle(short_dir / "b3")
        assert bundle.manifest["services"]["QueryStatus"] == "ljrk.controller.v1.AmpConfigService"
        assert decode(bundle, "ListGpuInfo").gpuInfos[0].uuid == sim.cards[0].uuid
        assert json.loads((short_dir / "b3" / "binding-report.json").read_text())
        assert sim.grants() == {}


def test_capture_into_a_file_path_fails_clearly(short_dir):
    target = short_dir / "file"
    target.write_text("x")
    out = _capture(short_dir / "s", target)
    assert out.returncode == 2 and "--capture" in out.stderr and out.stdout == ""
