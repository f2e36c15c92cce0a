"""``nomad-device-lingjun node-meta``: this node's topology keys as a ``client { meta { } }`` block.

The same keys the plugin publishes with ``node_meta = true`` (both come from
``model/node_meta.py``), for clusters where the plugin may not write node
metadata: no Nomad API, or a token without ``node:write``. The backend runs
in this process, as the plugin would run it with the same config, until the
first inventory; nothing is written anywhere. Static meta does not follow
later changes (a card gone, Runtime Kit switched): run it again then.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

from nomad_plugin.config.decode import decode_config
from nomad_plugin.config.model import PluginConfig
from nomad_plugin.jobspec import PluginKeys
from nomad_plugin.launcher.config import LauncherConfigError, load_config, msgpack_config
from nomad_plugin.launcher.live import socket_overrides
from nomad_plugin.model.card import Inventory
from nomad_plugin.model.errors import PluginError
from nomad_plugin.model.node_meta import NodeMeta, client_meta_block, node_meta


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="nomad-device-lingjun node-meta",
        description="Print this node's topology and summary keys as a client { meta { } } block "
        "(what node_meta = true publishes through Nomad's API).",
    )
    src = p.add_mutually_exclusive_group()
    src.add_argument("--profile", help="read an embedded XDM simulator with this profile instead")
    src.add_argument("--socket-dir", help="XDM socket directory (dp2mgr.sock, config-daemon.sock)")
    p.add_argument("--plugin-config", help="agent file or directory with the plugin block (e.g. /etc/nomad.d)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config option")
    p.add_argument("--timeout", type=float, default=20.0, help="seconds to wait for the cards (default 20)")
    p.add_argument("--json", action="store_true", help="print the keys as one JSON object")
    return p


def read_inventory(config: PluginConfig, timeout: float) -> Inventory:
    """The backend's first inventory (the plugin's own backend code); ``PluginError`` if none comes."""
    from nomad_plugin.backend_select import select_backend
    from nomad_plugin.reconcile.node_meta import ready

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
    return inventory


def plugin_keys(config_map: dict[str, Any], timeout: float) -> PluginKeys:
    """The keys a plugin with this config map publishes (or would, with ``node_meta = true``).

    ``check-job`` and ``fingerprint --json`` call it with the config map they
    launched the plugin with, while its XDM (or simulator) is still up: the
    same backend code and the same function as the running plugin. Raises
    ``PluginError`` (no inventory) or ``ValueError`` (a config the plugin refuses).
    """
    config = decode_config(msgpack_config(config_map))
    found = node_meta(read_inventory(config, timeout), config)
    return PluginKeys(dict(found.keys), config.node_meta_prefix, config.node_meta, found.topology_known, found.problems)


def render(found: NodeMeta, source: str) -> str:
    lines = [
        f"# Node metadata for this node's Nomad client agent, from {source}.",
        "# Paste it into the agent configuration and restart the agent, or set node_meta = true in the",
        "# plugin's config block to publish these keys through Nomad's API and keep them current.",
        *(f"# note: {problem}" for problem in found.problems),
    ]
    return "\n".join(lines) + "\n" + client_meta_block(found.keys)


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    tmp: Path | None = None
    sim = None
    try:
        extra: list[str] = []
        source = f"XDM sockets in {args.socket_dir}" if args.socket_dir else "the plugin's backend"
        if args.profile:
            from nomad_plugin.sim import Simulator

            tmp = Path(tempfile.mkdtemp(prefix="ndl-", dir="/tmp"))  # Unix socket paths must stay short
            sim = Simulator(tmp / "s", args.profile).start()
            extra += [*socket_overrides(tmp / "s"), 'backend="xdm"', "nvml_enrich=false"]
            source = f"an embedded simulator, profile {args.profile}"
        elif args.socket_dir:
            extra += [*socket_overrides(args.socket_dir), 'backend="xdm"']
        config = decode_config(msgpack_config(load_config(args.plugin_config, [*extra, *args.set])))
        found = node_meta(read_inventory(config, args.timeout), config)
    except (LauncherConfigError, PluginError, ValueError, OSError) as exc:
        sys.stderr.write(f"node-meta: {exc}\n(run `nomad-device-lingjun doctor` for a step-by-step check)\n")
        return 1
    finally:
        if sim is not None:
            sim.stop()
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    if args.json:
        sys.stdout.write(json.dumps(dict(found.keys), indent=2) + "\n")
    else:
        sys.stdout.write(render(found, source))
    return 0
