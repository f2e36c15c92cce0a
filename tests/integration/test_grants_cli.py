"""``grants`` and ``grants release`` against the real plugin, a simulated XDM and the Nomad API double with ACLs.

A token without read-job on ``team-a`` keeps team-a's
running job's grant past any grace period, and the incomplete view is
reported (log line, ``grants``); a grant can be released by hand while the
plugin runs (through its request watcher) and while it is stopped (the
command holds the journal's owner lock), journalled like any release, and no
later journal write brings it back.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import time
from typing import Any

import httpx
import pytest

from nomad_plugin._proto.nomad import device_pb2, device_pb2_grpc
from nomad_plugin.cli import doctor, grants
from nomad_plugin.journal import Journal, plugin_running
from tests.doubles.nomad_api import NomadApiDouble
from tests.goplugin.goplugin_harness import Plugin, launch
from tests.integration.harness import Node
from tests.integration.test_audit_log import DEVICE, configure, entries, first_device_ids, wait_for

NARROW = 'namespace "default" { policy = "read" }\nnode { policy = "read" }\nagent { policy = "read" }\n'
DOCUMENTED = 'namespace "*" { capabilities = ["read-job"] }\nnode { policy = "read" }\nagent { policy = "read" }\n'
GRACE_S = 1.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def acl_api(rules: str) -> NomadApiDouble:
    api = NomadApiDouble().start()
    api.enable_acls()
    api.add_policy("lingjun", rules)
    api.add_token("plugin-token", ["lingjun"])
    return api


def plugin_config(node: Node, api: NomadApiDouble) -> dict[str, Any]:
    return {
        "log_level": "info",
        "backend": "xdm",
        "xdm_socket": str(node.sim.dp2mgr_path),
        "config_socket": str(node.sim.config_path),
        "data_dir": str(node.data_dir),
        "nvml_enrich": False,
        "reconcile": True,
        "nomad_address": api.address,
        "nomad_token": "plugin-token",
        "release_grace_period": f"{GRACE_S:g}s",
    }


def cli_sets(config: dict[str, Any]) -> list[str]:
    out = []
    for key in ("xdm_socket", "config_socket", "data_dir", "nvml_enrich", "reconcile", "nomad_address", "nomad_token"):
        out += ["--set", f"{key}={json.dumps(config[key])}"]
    return out


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = grants.main(list(argv), environ={})
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def listing(capsys: pytest.CaptureFixture[str], sets: list[str]) -> dict[str, Any]:
    code, out, err = run_cli(capsys, "--json", *sets)
    assert code == 0, err
    doc: dict[str, Any] = json.loads(out)
    return doc


def reserve(plugin: Plugin, api: NomadApiDouble, ids: list[str], alloc: str, namespace: str) -> str:
    api.add_alloc(alloc, ids, "running", device=DEVICE, namespace=namespace, job=f"job-{alloc}")
    stub = device_pb2_grpc.DevicePluginStub(plugin.channel())
    reply = stub.Reserve(device_pb2.ReserveRequest(device_ids=ids), timeout=30)
    return str(reply.container_res.envs["LINGJUN_GRANT_ID"])


def claimed(node: Node, grant_id: str) -> bool:
    try:
        return grant_id in json.loads((node.data_dir / "reconciler-state.json").read_text())["claims"]
    except (OSError, ValueError, KeyError):
        return False


def test_incomplete_view_keeps_hidden_grant_and_release_by_hand_while_running(
    node: Node, capsys: pytest.CaptureFixture[str]
) -> None:
    api = acl_api(NARROW)
    plugin = launch()
    try:
        config = plugin_config(node, api)
        config["metrics_port"] = free_port()
        configure(plugin, config)
        sets = cli_sets(config)
        ids, stream = first_device_ids(plugin, 4)
        hidden = reserve(plugin, api, ids[0:1], "alloc-hidden", "team-a")
        seen = reserve(plugin, api, ids[1:2], "alloc-seen", "default")
        wait_for("the reconciler to see alloc-seen", lambda: claimed(node, seen), plugin)
        time.sleep(GRACE_S * 3)  # well past the grace period
        assert {hidden, seen} <= set(node.sim.grants()), "a running allocation's grant was released"
        assert any("allocation view is INCOMPLETE" in e["@message"] for e in entries(plugin))
        assert any(e["@message"].startswith(f"grant {hidden} is kept") for e in entries(plugin))

        def gauges_report_it() -> bool:
            text = httpx.get(f"http://127.0.0.1:{config['metrics_port']}/metrics", timeout=5).text
            return (
                "lingjun_plugin_nomad_view_incomplete 1.0" in text and "lingjun_plugin_unverifiable_grants 1.0" in text
            )

        wait_for("the Prometheus gauges of the incomplete view", gauges_report_it, plugin)

        doc = listing(capsys, sets)
        assert doc["plugin_running"] is True and doc["nomad"]["view_complete"] is False
        assert 'namespace "*"' in doc["nomad"]["policy_to_add"]
        status = {g["grant_id"]: g for g in doc["grants"]}
        assert status[hidden]["status"] == "unverifiable"
        assert status[seen]["status"] == "live" and status[seen]["alloc_id"] == "alloc-seen"
        assert status[seen]["namespace"] == "default" and status[seen]["client_status"] == "running"

        assert doctor.main(["--json", *sets]) == 0
        findings = {f["check"]: f for f in json.loads(capsys.readouterr().out)["findings"]}
        assert findings["nomad visibility"]["status"] == "warn"
        assert 'namespace "*" { capabilities = ["read-job"] }' in findings["nomad visibility"]["next_step"]
        assert findings["grants"]["status"] == "warn" and hidden in findings["grants"]["summary"]

        code, _, err = run_cli(capsys, "release", seen, *sets)
        assert code == 1 and "alloc-seen" in err and "--force" in err
        code, _, err = run_cli(capsys, "release", hidden, *sets)
        assert code == 1 and "cannot see every namespace" in err
        assert hidden in node.sim.grants()

        code, out, err = run_cli(capsys, "release", hidden, "--force", *sets)
        assert code == 0, err
        assert "released by hand" in out
        assert hidden not in node.sim.grants() and seen in node.sim.grants()
        assert hidden not in {e.grant_id for e in Journal.snapshot(node.data_dir)}
        wait_for(
            "the manual release's audit line",
            lambda: any(
                e["@message"] == f"grant {hidden} released: released by hand (--force)" for e in entries(plugin)
            ),
            plugin,
        )
        # No lost update: the plugin keeps writing the same journal, and the released grant stays gone.
        later = reserve(plugin, api, ids[2:3], "alloc-later", "default")
        on_disk = {e.grant_id for e in Journal.snapshot(node.data_dir)}
        assert on_disk == {seen, later}
        stream.cancel()
    finally:
        plugin.close()
        api.stop()


def test_grants_and_release_while_the_plugin_is_stopped(node: Node, capsys: pytest.CaptureFixture[str]) -> None:
    api = acl_api(DOCUMENTED)
    plugin = launch()
    try:
        config = plugin_config(node, api)
        configure(plugin, config)
        sets = cli_sets(config)
        ids, stream = first_device_ids(plugin, 2)
        gid = reserve(plugin, api, ids, "alloc-1", "team-a")
        wait_for("the reconciler to see alloc-1", lambda: claimed(node, gid), plugin)
        stream.cancel()
        os.kill(plugin.proc.pid, signal.SIGKILL)
        plugin.proc.wait(timeout=10)
        assert not plugin_running(node.data_dir)

        doc = listing(capsys, sets)
        assert doc["plugin_running"] is False and doc["nomad"]["view_complete"] is True
        (row,) = doc["grants"]
        assert row["status"] == "live" and row["namespace"] == "team-a" and row["job"] == "job-alloc-1"

        code, _, err = run_cli(capsys, "release", gid, *sets)
        assert code == 1 and "alloc-1" in err  # still running
        api.set_status("alloc-1", "complete")
        (row,) = listing(capsys, sets)["grants"]
        assert row["status"] == "orphaned" and row["client_status"] == "complete"

        code, out, err = run_cli(capsys, "release", gid, *sets)
        assert code == 0, err
        assert "released by hand" in out
        assert gid not in node.sim.grants() and Journal.snapshot(node.data_dir) == []
        assert not plugin_running(node.data_dir)
        assert listing(capsys, sets)["grants"] == []
        code, _, err = run_cli(capsys, "release", gid, *sets)
        assert code == 1 and "no grant" in err
    finally:
        plugin.close()
        api.stop()
