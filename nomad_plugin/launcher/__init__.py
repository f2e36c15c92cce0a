"""A Python go-plugin client that launches the plugin exactly as a Nomad client does (``process.py``),
with the config an agent would send it (``config.py``)."""

from __future__ import annotations

from nomad_plugin.launcher.config import LauncherConfigError, full_config, load_config, msgpack_config
from nomad_plugin.launcher.process import LaunchError, LiveNode, PluginProcess, Session, launch, wait_for_devices

__all__ = [
    "LaunchError",
    "LauncherConfigError",
    "LiveNode",
    "PluginProcess",
    "Session",
    "full_config",
    "launch",
    "load_config",
    "msgpack_config",
    "wait_for_devices",
]
