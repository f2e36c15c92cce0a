"""``nomad-device-lingjun fingerprint``: print the fingerprint this node would send to Nomad.

Launches the plugin exactly as Nomad does (handshake, SetConfig with the
agent config's msgpack encoding, Fingerprint stream), waits for the first
fingerprint with devices, prints it as ``nomad node status -verbose`` would
(or as JSON, which ``check-job --fingerprint`` reads back, with the node
meta keys the plugin computes from the same inventory: ``plugin_keys``) and
stops it. The
dry run uses its own temporary data_dir, no reconciler and no metrics port,
so it never disturbs the plugin Nomad is running.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from nomad_plugin.launcher import LauncherConfigError, LaunchError
from nomad_plugin.launcher.live import LiveNode
from nomad_plugin.nomad_view.render import Style, fingerprint_summary, fingerprint_text


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="nomad-device-lingjun fingerprint",
        description="Print the device groups, attributes, instances and health this node would send to Nomad.",
    )
    src = p.add_mutually_exclusive_group()
    src.add_argument("--profile", help="fingerprint an embedded XDM simulator with this profile instead")
    src.add_argument("--socket-dir", help="XDM socket directory (dp2mgr.sock, config-daemon.sock)")
    p.add_argument("--plugin-config", help="agent file with the plugin block (e.g. /etc/nomad.d/plugin.hcl)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config option")
    p.add_argument("--plugin", help="plugin executable to launch (default: this program)")
    p.add_argument("--timeout", type=float, default=20.0, help="seconds to wait for devices (default 20)")
    p.add_argument("--json", action="store_true", help="print JSON (readable by check-job --fingerprint)")
    p.add_argument(
        "--detail",
        action="store_true",
        help="every group's attributes and every instance, as nomad node status -verbose shows them "
        "(default: one line per group)",
    )
    return p


def _plugin_keys(config: dict[str, Any], timeout: float) -> dict[str, Any]:
    """The ``plugin_keys`` section: the node meta keys of the same inventory, for check-job's node-level rules."""
    from nomad_plugin.cli.node_meta import plugin_keys
    from nomad_plugin.model.errors import PluginError

    try:
        return {"plugin_keys": plugin_keys(config, timeout).to_json()}
    except (PluginError, ValueError, OSError) as exc:
        return {"plugin_keys": None, "plugin_keys_error": f"the plugin's backend gave no inventory: {exc}"}


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    node = LiveNode(args.plugin_config, args.set, args.profile, args.socket_dir, args.plugin)
    node.device_timeout = args.timeout
    keys: dict[str, Any] = {}
    try:
        with node:
            groups = node.devices()
            source = node.source
            if args.json:
                keys = _plugin_keys(dict(node.config), args.timeout)
    except (LaunchError, LauncherConfigError, ValueError, OSError) as exc:
        first = " ".join(str(exc).split())
        sys.stderr.write(f"fingerprint: {first} (nomad-device-lingjun doctor checks the node step by step)\n")
        return 1
    if args.json:
        doc = {"source": source, "groups": [g.to_json() for g in groups], **keys}
        sys.stdout.write(json.dumps(doc, indent=2) + "\n")
        return 0
    devices = sum(len(g.devices) for g in groups)
    healthy = sum(len(g.healthy_ids) for g in groups)
    header = f"{len(groups)} device group(s), {devices} instances ({healthy} healthy) from {source}"
    style = Style(sys.stdout)
    if args.detail:
        body = fingerprint_text(groups, style)
    else:
        body = [*fingerprint_summary(groups, style), "", "(--detail prints every attribute and instance)"]
    sys.stdout.write("\n".join([header, "", *body]) + "\n")
    return 0
