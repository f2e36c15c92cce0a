"""``fingerprint`` and ``node-meta``: what this node would send Nomad, shown before Nomad sees it.

``fingerprint`` launches the real plugin as Nomad does and prints its first fingerprint with
devices as ``nomad node status -verbose`` would, or as JSON for ``check-job --fingerprint``.
``node-meta`` runs the plugin's backend in this process and prints the keys ``node_meta = true``
publishes as a ``client { meta { } }`` block (static: run it again when the cards change). Neither
disturbs the plugin Nomad runs: a temporary data_dir, no reconciler, no metrics port.
"""

from __future__ import annotations

import json
import sys
import threading
from typing import Any

from nomad_plugin.backend_select import select_backend
from nomad_plugin.cli.common import add_config_options, command_parser, described, fail
from nomad_plugin.config.decode import decode_config
from nomad_plugin.config.model import PluginConfig
from nomad_plugin.jobspec import PluginKeys
from nomad_plugin.launcher.config import LauncherConfigError, msgpack_config
from nomad_plugin.launcher.process import LaunchError, LiveNode
from nomad_plugin.model.card import NodeMeta, client_meta_block, node_meta
from nomad_plugin.model.errors import PluginError
from nomad_plugin.nomad_view.types import DeviceGroup, Style, fingerprint_summary, fingerprint_text
from nomad_plugin.reconcile.node_meta import ready
from nomad_plugin.xdm.binder import MISMATCH_PREFIX

NEXT = "nomad-device-lingjun doctor checks the node step by step"


def main(argv: list[str]) -> int:
    p = command_parser("fingerprint", "Print the device groups, attributes, instances and health this node would send.")
    add_config_options(p, node=True)
    p.add_argument("--plugin", help="plugin executable to launch (default: this program)")
    p.add_argument("--timeout", type=float, default=20.0, help="seconds to wait for devices (default 20)")
    p.add_argument("--json", action="store_true", help="print JSON (readable by check-job --fingerprint)")
    p.add_argument(
        "--detail",
        action="store_true",
        help="every group's attributes and every instance, as nomad node status -verbose shows them "
        "(default: one line per group)",
    )
    args = p.parse_args(argv)
    node = LiveNode(
        args.plugin_config, args.set, args.profile, args.socket_dir, args.plugin, device_timeout=args.timeout
    )
    keys: dict[str, Any] = {}
    try:
        with node:
            groups = node.devices()
            mismatch = schema_mismatch(groups)
            if args.json and not mismatch:
                found, why = plugin_keys(node.config, args.timeout)
                keys = {"plugin_keys": found.to_json()} if found else {"plugin_keys": None, "plugin_keys_error": why}
    except (LaunchError, LauncherConfigError, ValueError, OSError) as exc:
        said = described(exc).rstrip()  # a syntax error's source and caret lines stay lines
        return fail("fingerprint", f"{said}\n({NEXT})" if "\n" in said else f"{said} ({NEXT})", 1)
    if mismatch:
        return fail("fingerprint", mismatch, 1)
    if args.json:
        sys.stdout.write(json.dumps({"source": node.source, "groups": [g.to_json() for g in groups], **keys}, indent=2))
        sys.stdout.write("\n")
        return 0
    devices = sum(len(g.devices) for g in groups)
    healthy = sum(len(g.healthy_ids) for g in groups)
    style = Style(sys.stdout)
    if args.detail:
        body = fingerprint_text(groups, style)
    else:
        body = [*fingerprint_summary(groups, style), "", "(--detail prints every attribute and instance)"]
    header = f"{len(groups)} device group(s), {devices} instances ({healthy} healthy) from {node.source}"
    sys.stdout.write("\n".join([header, "", *body]) + "\n")
    return 0


def schema_mismatch(groups: list[DeviceGroup]) -> str:
    """Why no card can be trusted ("" when one can): every card unhealthy with XDM's schema mismatch.
    Their names and attributes were then read through the wrong schema, so none is shown."""
    devices = [d for g in groups for d in g.devices]
    if not devices or any(d.healthy or not d.health_description.startswith(MISMATCH_PREFIX) for d in devices):
        return ""
    return (
        f"{devices[0].health_description}; the plugin offers all {len(devices)} cards as unhealthy, under names "
        "read with the wrong schema (not shown). Set xdm_schema to XDM's official api_outer.proto or map a renamed "
        "field with xdm_field_aliases; `nomad-device-lingjun doctor --verbose` prints the field-by-field binding"
    )


def node_keys(config_map: dict[str, Any], timeout: float) -> tuple[PluginConfig, NodeMeta]:
    """The decoded config and the keys the plugin's own backend derives from its first inventory (or PluginError)."""
    config = decode_config(msgpack_config(config_map))
    backend = select_backend(config)
    arrived = threading.Event()
    backend.subscribe(lambda inv: arrived.set() if ready(inv) else None)
    backend.start()
    try:
        arrived.wait(timeout)
        inventory = backend.inventory()
    finally:
        backend.stop()
    if not ready(inventory):
        reason = inventory.unreachable_reason or f"no inventory within {timeout:g} s"
        raise PluginError(f"the {backend.name} backend gave no cards: {reason}")
    return config, node_meta(inventory, config)


def plugin_keys(config_map: dict[str, Any], timeout: float) -> tuple[PluginKeys | None, str]:
    """The keys a plugin with this config publishes (or would, with ``node_meta``); None and why if none."""
    try:
        config, found = node_keys(config_map, timeout)
    except (PluginError, ValueError, OSError) as exc:
        return None, f"the plugin's backend gave no inventory: {described(exc)}"
    return PluginKeys(
        dict(found.keys), config.node_meta_prefix, config.node_meta, found.topology_known, found.problems
    ), ""


def node_meta_command(argv: list[str]) -> int:
    p = command_parser(
        "node-meta",
        "Print this node's topology and summary keys as a client { meta { } } block "
        "(what node_meta = true publishes through Nomad's API).",
    )
    add_config_options(p, node=True)
    p.add_argument("--timeout", type=float, default=20.0, help="seconds to wait for the cards (default 20)")
    p.add_argument("--json", action="store_true", help="print the keys as one JSON object")
    args = p.parse_args(argv)
    try:
        with LiveNode(args.plugin_config, args.set, args.profile, args.socket_dir, launch_plugin=False) as node:
            _, found = node_keys(node.config, args.timeout)
    except (LauncherConfigError, PluginError, ValueError, OSError) as exc:
        return fail("node-meta", f"{described(exc)} ({NEXT})", 1)
    if args.json:
        sys.stdout.write(json.dumps(dict(found.keys), indent=2) + "\n")
        return 0
    lines = [
        f"# Node metadata for this node's Nomad client agent, from {node.source}.",
        "# Paste it into the agent configuration and restart the agent, or set node_meta = true in the",
        "# plugin's config block to publish these keys through Nomad's API and keep them current.",
        *(f"# note: {problem}" for problem in found.problems),
    ]
    sys.stdout.write("\n".join(lines) + "\n" + client_meta_block(found.keys))
    return 0
