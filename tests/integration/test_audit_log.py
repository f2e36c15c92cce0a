"""The grant lifecycle reaches Nomad's log: the real plugin, its raw hclog JSON stderr.

At ``log_level = "info"`` every grant made and every release has one audit
line (grant id, devices, cards, mode, limits; grant id and why). At
``"warn"`` they are absent. A missing XDM socket is reported at info at once
(docs/reliability.md, "XDM down at start").
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from typing import Any

import grpc
import msgpack

from nomad_plugin._proto.nomad import base_pb2, base_pb2_grpc, device_pb2, device_pb2_grpc
from tests.doubles.nomad_api import NomadApiDouble
from tests.goplugin.goplugin_harness import Plugin, launch
from tests.integration.harness import Node

DEVICE = "nvidia/gpu/NVIDIA H800"


def entries(plugin: Plugin) -> list[dict[str, Any]]:
    out = []
    for line in list(plugin.stderr_lines):
        if line.strip():
            out.append(json.loads(line))  # every stderr line must be one hclog JSON object
    return out


def wait_for(what: str, check: Callable[[], bool], plugin: Plugin, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}; stderr tail:\n{plugin.stderr_text()[-3000:]}")


def configure(plugin: Plugin, config: dict[str, Any]) -> None:
    base = base_pb2_grpc.BasePluginStub(plugin.channel())
    base.SetConfig(
        base_pb2.SetConfigRequest(msgpack_config=msgpack.packb(config), plugin_api_version="v0.1.0"), timeout=5
    )


def first_device_ids(plugin: Plugin, n: int) -> tuple[list[str], grpc.Future]:
    """Open the Fingerprint stream (starts the engines); the first n instance IDs of the whole-card group."""
    stream = device_pb2_grpc.DevicePluginStub(plugin.channel()).Fingerprint(device_pb2.FingerprintRequest())
    for response in stream:
        for group in response.device_group:
            if f"{group.vendor}/{group.device_type}/{group.device_name}" == DEVICE and len(group.devices) >= n:
                return [d.ID for d in group.devices[:n]], stream
    raise AssertionError("the fingerprint stream ended")


def run_lifecycle(node: Node, api: NomadApiDouble, level: str) -> tuple[Plugin, str]:
    plugin = launch()
    configure(
        plugin,
        {
            "log_level": level,
            "backend": "xdm",
            "xdm_socket": str(node.sim.dp2mgr_path),
            "config_socket": str(node.sim.config_path),
            "data_dir": str(node.data_dir),
            "nvml_enrich": False,
            "reconcile": True,
            "nomad_address": api.address,
            "release_grace_period": "1s",
        },
    )
    ids, stream = first_device_ids(plugin, 2)
    api.add_alloc("alloc-audit", ids, "running", device=DEVICE, namespace="team-a", job="train")
    reply = device_pb2_grpc.DevicePluginStub(plugin.channel()).Reserve(
        device_pb2.ReserveRequest(device_ids=ids), timeout=30
    )
    grant_id = reply.container_res.envs["LINGJUN_GRANT_ID"]
    assert grant_id in node.sim.grants()
    state = node.data_dir / "reconciler-state.json"

    def claimed() -> bool:
        try:
            return grant_id in json.loads(state.read_text())["claims"]
        except (OSError, ValueError, KeyError):
            return False

    wait_for("the reconciler to see the allocation holding the grant", claimed, plugin)
    api.set_status("alloc-audit", "complete")
    wait_for("the grant's release at XDM", lambda: grant_id not in node.sim.grants(), plugin)
    stream.cancel()
    return plugin, grant_id


def test_audit_lines_at_info(node: Node, api: NomadApiDouble) -> None:
    plugin, grant_id = run_lifecycle(node, api, "info")
    try:
        made = f"grant {grant_id} made"
        released = f"grant {grant_id} released: allocation alloc-audit of job team-a/train ended (complete)"
        wait_for("the release audit line", lambda: any(released in e["@message"] for e in entries(plugin)), plugin)
        lines = entries(plugin)
        grant_lines = [e for e in lines if e["@message"].startswith(made)]
        release_lines = [e for e in lines if e["@message"].startswith(f"grant {grant_id} released")]
        assert len(grant_lines) == 1 and len(release_lines) == 1, [e["@message"] for e in lines]
        line = grant_lines[0]
        assert line["@level"] == "info" and line["@module"].startswith("nomad-device-lingjun.")
        assert line["grant_id"] == grant_id and line["mode"] == "whole" and len(line["device_ids"]) == 2
        assert len(line["cards"]) == 2 and line["limits"] == "whole cards (no limit)"
        assert "devices " in line["@message"] and "cards " in line["@message"] and "mode whole" in line["@message"]
        assert release_lines[0]["@level"] == "info" and release_lines[0]["grant_id"] == grant_id
        assert any("allocation view is complete" in e["@message"] for e in lines)
    finally:
        plugin.close()


def test_no_audit_lines_at_warn(node: Node, api: NomadApiDouble) -> None:
    plugin, grant_id = run_lifecycle(node, api, "warn")
    try:
        time.sleep(0.5)  # let any late line arrive; the assertion is an absence
        messages = [e["@message"] for e in entries(plugin)]
        audit = (f"grant {grant_id} made", f"grant {grant_id} released")
        assert not [m for m in messages if m.startswith(audit)], messages
        assert all(e["@level"] in ("warn", "error") for e in entries(plugin))
    finally:
        plugin.close()


def test_missing_xdm_socket_is_reported_at_info_at_once(tmp_path) -> None:
    plugin = launch()
    try:
        configure(
            plugin,
            {
                "log_level": "info",
                "backend": "xdm",
                "xdm_socket": str(tmp_path / "no-such" / "dp2mgr.sock"),
                "config_socket": str(tmp_path / "no-such" / "config-daemon.sock"),
                "data_dir": str(tmp_path / "data"),
                "nvml_enrich": False,
                "reconcile": False,
            },
        )
        stream = device_pb2_grpc.DevicePluginStub(plugin.channel()).Fingerprint(device_pb2.FingerprintRequest())

        def first_response() -> None:
            try:
                next(iter(stream), None)
            except grpc.RpcError:
                pass  # cancelled at the end of the test

        threading.Thread(target=first_response, daemon=True).start()

        def reported() -> bool:
            return any(
                e["@level"] == "info" and e["@message"].startswith("xdm unreachable: ") and "no-such" in e["@message"]
                for e in entries(plugin)
            )

        wait_for("an info line saying XDM is unreachable", reported, plugin, timeout=15)
        stream.cancel()
    finally:
        plugin.close()
