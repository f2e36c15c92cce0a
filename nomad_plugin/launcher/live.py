"""A node to fingerprint: an embedded XDM simulator, a socket directory, or the real config.

``check-job``, ``fingerprint`` and ``demo`` all need "the fingerprint this
node would send": build the config Nomad would build (plugin config file +
overrides), optionally point it at an in-process simulator in a private
temp dir (``--profile``) or at another socket directory (``--socket-dir``),
launch the real plugin through :func:`launch`, and wait for devices.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

from nomad_plugin.config.options import DEFAULT_SOCKET_DIR
from nomad_plugin.launcher.config import load_config, msgpack_config
from nomad_plugin.launcher.process import LaunchError
from nomad_plugin.launcher.session import Session, launch, wait_for_devices
from nomad_plugin.nomad_view.types import DeviceGroup

DP2MGR, CONFIG_DAEMON = "dp2mgr.sock", "config-daemon.sock"


def socket_overrides(socket_dir: str | Path) -> list[str]:
    return [f'xdm_socket="{Path(socket_dir) / DP2MGR}"', f'config_socket="{Path(socket_dir) / CONFIG_DAEMON}"']


def preflight(config: dict[str, Any]) -> None:
    """Stop before launching when the plugin would use XDM and XDM's socket cannot be dialled: the
    first clear cause, in one line, instead of waiting for devices that cannot come. A config the
    plugin refuses is left to the plugin: its SetConfig answers at once, in its own words."""
    from nomad_plugin.backend_select import _nvml_usable, accept_config, choose_backend_name
    from nomad_plugin.config.model import ConfigError
    from nomad_plugin.xdm.client import socket_problem

    try:
        plugin_config = accept_config(msgpack_config(config))
    except ConfigError:
        return
    if not plugin_config.enabled or choose_backend_name(plugin_config, _nvml_usable) != "xdm":
        return
    problem = socket_problem(plugin_config.xdm_socket)
    if problem is not None:
        nvml = "" if plugin_config.backend == "xdm" else " and NVML is not usable here"
        raise LaunchError(f"{problem}{nvml}")


@dataclass
class LiveNode:
    """Context manager: simulator (optional) + plugin session; cleans everything up on exit."""

    plugin_config: str | None = None
    overrides: list[str] = field(default_factory=list)
    profile: str | None = None
    socket_dir: str | None = None
    plugin: str | None = None
    sim_options: dict[str, Any] = field(default_factory=dict)
    device_timeout: float = 20.0
    session: Session | None = None
    sim: Any = None
    tmp: Path | None = None
    config: dict[str, Any] = field(default_factory=dict)

    @property
    def source(self) -> str:
        if self.profile:
            return f"embedded simulator, profile {self.profile}"
        if self.socket_dir:
            return f"XDM sockets in {self.socket_dir}"
        where = self.plugin_config or "the default config"
        backend = str(self.config.get("backend", "auto"))
        socket = str(self.config.get("xdm_socket") or Path(DEFAULT_SOCKET_DIR) / DP2MGR)
        if backend == "nvml":
            return f"NVML (backend = nvml from {where})"
        if backend == "auto" and self.config and not Path(socket).exists():
            return f"NVML (backend = auto from {where}: no XDM socket at {socket})"
        return f"XDM socket {socket} (backend = {backend} from {where})"

    def __enter__(self) -> LiveNode:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def start(self) -> None:
        # Short private dir under /tmp: Unix socket paths must stay < 108 bytes.
        self.tmp = Path(tempfile.mkdtemp(prefix="ndl-", dir="/tmp"))
        extra: list[str] = []
        if self.profile:
            from nomad_plugin.sim import Simulator

            sockets = self.tmp / "s"
            self.sim = Simulator(sockets, self.profile, **self.sim_options).start()
            extra += [*socket_overrides(sockets), 'backend="xdm"']
        elif self.socket_dir:
            extra += [*socket_overrides(self.socket_dir), 'backend="xdm"']
        if self.profile:
            extra.append("nvml_enrich=false")  # a simulated card must not pick up this host's GPUs
        # A dry run never touches the live plugin's journal, grants, Nomad or metrics port:
        # its own data_dir, no reconciler, no Prometheus endpoint, and no node metadata written
        # (``config`` keeps the node_meta asked for: check-job reads the plugin's keys from it).
        extra += [f'data_dir="{self.tmp / "data"}"', "reconcile=false", "metrics_port=0"]
        self.config = load_config(self.plugin_config, [*extra, *self.overrides])
        if not self.profile:
            preflight(self.config)
        self.session = launch({**self.config, "node_meta": False}, plugin=self.plugin)

    def devices(self) -> list[DeviceGroup]:
        assert self.session is not None
        return wait_for_devices(self.session, self.device_timeout)

    def close(self) -> int | None:
        code = None
        if self.session is not None:
            code = self.session.plugin.shutdown()
            self.session = None
        if self.sim is not None:
            self.sim.stop()
            self.sim = None
        if self.tmp is not None:
            shutil.rmtree(self.tmp, ignore_errors=True)
            self.tmp = None
        return code

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
