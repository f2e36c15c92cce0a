"""``serve``: the composition root of the process Nomad runs.

Here, and only here, the go-plugin transport (``goplugin/serve.py``) meets
Nomad's services (``nomad/``) and the engines behind them (``app.PluginApp``):
the transport receives its servicers instead of importing them, so it stays
a layer that knows nothing above it (docs/architecture.md).
"""

from __future__ import annotations

import grpc

from nomad_plugin._proto.nomad import base_pb2_grpc
from nomad_plugin.app import PluginApp
from nomad_plugin.goplugin import serve as transport
from nomad_plugin.goplugin.lifecycle import Lifecycle
from nomad_plugin.nomad.base_service import BaseService
from nomad_plugin.nomad.device_service import DeviceService, add_device_service


class NomadDevicePlugin:
    """Nomad's BasePlugin and DevicePlugin services over one ``PluginApp``."""

    def __init__(self) -> None:
        self.app = PluginApp()

    def register(self, server: grpc.Server, lifecycle: Lifecycle) -> None:
        base_pb2_grpc.add_BasePluginServicer_to_server(BaseService(self.app), server)
        add_device_service(DeviceService(self.app, lifecycle), server)

    def close(self) -> None:
        self.app.close()


def main(argv: list[str]) -> int:
    return transport.main(argv, NomadDevicePlugin)
