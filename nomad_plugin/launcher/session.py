"""The launch sequence of a Nomad client, end to end, as one call.

Nomad's long-lived launch (nomad-protocol.md §2.6): handshake, PluginInfo,
ConfigSchema, SetConfig (the validate launch sends it twice; the plugin must
be idempotent), then the Fingerprint stream, and the Stats stream once the
first fingerprint arrived. The plugin starts its backend lazily, so the very
first fingerprint may be empty; :func:`wait_for_devices` waits for one with
devices.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

from nomad_plugin import PLUGIN_NAME
from nomad_plugin.launcher.command import plugin_command, plugin_env
from nomad_plugin.launcher.config import msgpack_config
from nomad_plugin.launcher.process import LaunchError, PluginInfo, PluginProcess, Stream
from nomad_plugin.nomad_view.types import DeviceGroup


@dataclass
class Session:
    plugin: PluginProcess
    info: PluginInfo
    fingerprints: Stream[list[DeviceGroup]]
    timings: dict[str, float] = field(default_factory=dict)


def launch(
    config: dict[str, Any],
    plugin: str | None = None,
    set_config_times: int = 2,
    handshake_timeout: float = 30.0,
) -> Session:
    """Start the plugin and bring it to the fingerprinting state; LaunchError on any failure."""
    command = plugin_command(plugin)
    proc = PluginProcess(command, env=plugin_env(command), handshake_timeout=handshake_timeout)
    t0 = time.monotonic()
    shake = proc.start()
    try:
        info = proc.plugin_info()
        if info.type != "DEVICE" or info.name != PLUGIN_NAME:
            raise LaunchError(f"PluginInfo says {info.type} plugin {info.name!r}; expected DEVICE {PLUGIN_NAME!r}")
        proc.config_schema()
        data = msgpack_config(config)
        api = info.api_versions[0] if info.api_versions else "v0.1.0"
        for _ in range(set_config_times):
            proc.set_config(data, api)
        t1 = time.monotonic()
        stream = proc.fingerprint()
    except BaseException:
        proc.shutdown()
        raise
    return Session(proc, info, stream, {"handshake": shake.seconds, "set_config": t1 - t0})


def has_devices(groups: list[DeviceGroup]) -> bool:
    return any(g.devices for g in groups)


def log_text(line: str) -> str:
    """A plugin log line as a person reads it: hclog's JSON reduced to level and message."""
    try:
        entry = json.loads(line)
    except ValueError:
        return line.strip()
    if not isinstance(entry, dict) or "@message" not in entry:
        return line.strip()
    return f"{entry.get('@level', 'info')}: {entry['@message']}"


def wait_for_devices(session: Session, timeout: float) -> list[DeviceGroup]:
    """The first fingerprint holding devices; LaunchError (with the plugin's last log lines) otherwise."""
    t0 = time.monotonic()
    hit = session.fingerprints.wait_for(has_devices, timeout)
    if hit is None:
        tail = [log_text(line) for line in list(session.plugin.stderr)[-4:] if line.strip()]
        why = session.fingerprints.error or f"no devices fingerprinted within {timeout:.0f} s"
        raise LaunchError(why + ("; plugin log: " + " | ".join(tail) if tail else ""))
    session.timings["first_devices"] = hit[0] - t0
    return hit[1]
