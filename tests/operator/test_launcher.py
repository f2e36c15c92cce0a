"""Launcher pieces: Nomad's config encoding, overrides, handshake parsing; xdm-probe over the simulator."""

from __future__ import annotations

import json
import shutil
import struct
import tempfile
from collections.abc import Iterator
from pathlib import Path

import msgpack
import pytest

from nomad_plugin import PLUGIN_NAME
from nomad_plugin.cli import xdm_probe
from nomad_plugin.config.decode import decode_config
from nomad_plugin.config.options import OPTIONS
from nomad_plugin.launcher.config import (
    LauncherConfigError,
    cty_number,
    full_config,
    load_config,
    msgpack_config,
    parse_override,
)
from nomad_plugin.launcher.process import LaunchError, parse_handshake
from nomad_plugin.sim import Simulator
from nomad_plugin.util.hcl import unquote

REPO = Path(__file__).resolve().parents[2]


def test_full_config_has_every_option_sorted_with_defaults() -> None:
    data = msgpack_config(full_config({"tdm_shares": 4}))
    raw = msgpack.unpackb(data)
    assert list(raw) == sorted(raw)
    assert set(raw) == {o.name for o in OPTIONS} | {"card"}
    assert raw["tdm_shares"] == 4 and raw["health_recovery_delay"] == "30s" and raw["card"] == []
    assert decode_config(data).tdm_shares == 4


def test_plugin_hcl_round_trips_through_the_plugin_decoder() -> None:
    config = decode_config(msgpack_config(load_config(REPO / "plugin.hcl")))
    assert config.backend == "auto" and config.xid_ignore == (13, 31, 43, 45, 68, 109)


def test_card_blocks_and_overrides(tmp_path: Path) -> None:
    path = tmp_path / "a.hcl"
    path.write_text(
        f'plugin "{PLUGIN_NAME}" {{\n config {{\n default_mode = "tdm"\n card {{\n match = "3"\n mode = "mig"\n }}\n }}\n}}\n'
    )
    cfg = load_config(path, ["tdm_shares=5", "group_by=numaNodes"])
    assert cfg["card"] == [{"match": "3", "mode": "mig", "shares": 0, "share_percent": 0}]
    decoded = decode_config(msgpack_config(cfg))
    assert decoded.default_mode == "tdm" and decoded.tdm_shares == 5 and decoded.group_by == "numaNodes"


def test_config_errors_name_the_problem(tmp_path: Path) -> None:
    path = tmp_path / "a.hcl"
    path.write_text('plugin "other" {\n}\n')
    with pytest.raises(LauncherConfigError, match=r"no plugin \"nomad-device-lingjun\" block.*'other'"):
        load_config(path)
    with pytest.raises(LauncherConfigError, match='unsupported argument "colour"'):
        full_config({"colour": "red"})
    with pytest.raises(LauncherConfigError, match="expected key=value"):
        parse_override("nonsense")


@pytest.mark.parametrize(
    ("text", "value"),
    [('default_mode="tdm"', "tdm"), ("default_mode=tdm", "tdm"), ("tdm_shares=4", 4), ("reconcile=false", False),
     ('mig_models=["A100", "H800"]', ["A100", "H800"]), ('xdm_socket="/a b/c.sock"', "/a b/c.sock")],
)  # fmt: skip
def test_overrides(text: str, value: object) -> None:
    assert parse_override(text)[1] == value


def test_cty_numbers() -> None:
    assert cty_number(3.0) == 3 and isinstance(cty_number(3.0), int)
    assert cty_number(0.5) == 0.5
    assert cty_number(0.1) == "0.1"  # not exact in float64: cty sends decimal text


def test_hcl_unquote() -> None:
    assert unquote('"a\\"b\\\\c\\n $${x} %%{y} \\u00e9"') == 'a"b\\c\n ${x} %{y} é'


def test_handshake_parsing() -> None:
    shake = parse_handshake("1|2|unix|/tmp/p/plugin.sock|grpc\n", 0.1)
    assert shake.address == "/tmp/p/plugin.sock"
    for bad, why in (
        ("1|1|unix|/x|grpc", "app protocol 1"),
        ("1|2|unix|/x|netrpc", "grpc"),
        ("hello", "bad handshake"),
    ):
        with pytest.raises(LaunchError, match=why):
            parse_handshake(bad)


def test_raw_text_shapes() -> None:
    # {1: 150, 2: "hi", 3: {1: 1}}
    data = bytes([0x08, 0x96, 0x01, 0x12, 0x02]) + b"hi" + bytes([0x1A, 0x02, 0x08, 0x01])
    assert xdm_probe.raw_text(data) == ["1 (varint): 150", "2 (len): 'hi'", "3 (len) {", "  1 (varint): 1", "}"]
    assert xdm_probe.raw_text(b"\x0f")[0].startswith("<not a protobuf message")
    fixed = b"\x25" + struct.pack("<f", 1.5) + b"\x29" + struct.pack("<d", -2.5) + b"\x08" + b"\xff" * 9 + b"\x01"
    assert xdm_probe.raw_text(fixed) == [
        "4 (fixed32): 0x0000c03f  (fixed32 1069547520, float 1.5)",
        "5 (fixed64): 0x00000000000004c0  (fixed64 -4610560118520545280, double -2.5)",
        "1 (varint): 18446744073709551615  (int64 -1)",
    ]


@pytest.mark.parametrize(
    "path", sorted(REPO.glob("tests/captures/*/raw/*.bin")), ids=lambda p: f"{p.parent.parent.name}/{p.stem}"
)
def test_raw_text_of_every_committed_capture_is_as_recorded(path: Path) -> None:
    assert xdm_probe.raw_text(path.read_bytes()) == path.with_suffix(".txt").read_text().splitlines()


@pytest.fixture
def sim() -> Iterator[Simulator]:
    directory = Path(tempfile.mkdtemp(prefix="probe-", dir="/tmp"))
    try:
        with Simulator(directory / "s", "m890p-8") as s:
            yield s
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def test_xdm_probe_raw(sim: Simulator, capsys: pytest.CaptureFixture[str]) -> None:
    assert xdm_probe.main(["--socket-dir", str(sim.socket_dir), "--raw", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["device_service"] == "xdm.XpuDeviceManagerService"
    rpcs = {c["rpc"]: c for c in doc["calls"]}
    assert set(rpcs) == {
        "ListSupportedXPUType",
        "ListGpuInfo",
        "ListAndWatch (first push)",
        "ExporterGetConfig",
        "ExporterGetStatus",
        "QueryStatus",
    }
    assert all(c["ok"] for c in rpcs.values())
    assert rpcs["ListSupportedXPUType"]["raw"] == ["1 (len): 'ppu'"]
    assert rpcs["QueryStatus"]["response"]["enabled"] is True
    assert any("'PPU M890P'" in line for line in rpcs["ListGpuInfo"]["raw"])


def test_xdm_probe_missing_sockets(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert xdm_probe.main(["--socket-dir", str(tmp_path), "--set", 'xdm_call_timeout="1s"']) == 1
    out = capsys.readouterr().out
    assert "PROBLEM (socket-missing)" in out


def test_xdm_probe_prints_the_binding_report(sim: Simulator, capsys: pytest.CaptureFixture[str]) -> None:
    assert xdm_probe.main(["--socket-dir", str(sim.socket_dir)]) == 0
    out = capsys.readouterr().out
    assert "XDM schema binding (source builtin" in out
    assert "  Device.uuid -> xdm.Device.uuid #2 string" in out and "  verdict: ok" in out
