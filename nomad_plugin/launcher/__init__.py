"""A Python go-plugin client that launches the plugin exactly as Nomad does.

Used by the operator commands (demo, check-job, fingerprint, doctor) and the
GPU check: :func:`launch` returns a :class:`Session` whose plugin is
handshaken, configured with Nomad's msgpack encoding of the full config
object, and streaming fingerprints.
"""

from __future__ import annotations

from nomad_plugin.launcher.config import LauncherConfigError, full_config, load_config, msgpack_config
from nomad_plugin.launcher.process import LaunchError, PluginProcess, Session, Stream, launch, wait_for_devices
from nomad_plugin.nomad_view.types import Attribute, Device, DeviceGroup, InstanceStats, Reservation, StatValue

__all__ = [
    "Attribute",
    "Device",
    "DeviceGroup",
    "InstanceStats",
    "LaunchError",
    "LauncherConfigError",
    "PluginProcess",
    "Reservation",
    "Session",
    "StatValue",
    "Stream",
    "full_config",
    "launch",
    "load_config",
    "msgpack_config",
    "wait_for_devices",
]
