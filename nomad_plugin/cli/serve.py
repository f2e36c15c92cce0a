"""``serve``: the composition root of the process Nomad runs.

Here, and only here, the go-plugin transport (``goplugin/serve.py``) meets
Nomad's services (``nomad/``) and the engines behind them (``app.PluginApp``):
the transport receives its servicers instead of importing them, so it stays
a layer that knows nothing above it (docs/architecture.md).

The services are imported when the transport builds the plugin, not when
this module is imported: Nomad launches the plugin three times at every
agent start, and the transport decides how early that has to be.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from nomad_plugin.goplugin import serve as transport

if TYPE_CHECKING:
    import grpc

    from nomad_plugin.goplugin.lifecycle import Lifecycle


class NomadDevicePlugin:
    """Nomad's BasePlugin and DevicePlugin services over one ``PluginApp``."""

    def __init__(self) -> None:
        from nomad_plugin.app import PluginApp

        self.app = PluginApp()

    def register(self, server: grpc.Server, lifecycle: Lifecycle) -> None:
        from nomad_plugin._proto.nomad import base_pb2_grpc, device_pb2_grpc
        from nomad_plugin.nomad.services import BaseService, DeviceService

        base_pb2_grpc.add_BasePluginServicer_to_server(BaseService(self.app), server)
        device_pb2_grpc.add_DevicePluginServicer_to_server(DeviceService(self.app, lifecycle), server)

    def close(self) -> None:
        self.app.close()


def main(argv: list[str]) -> int:
    return transport.main(argv, NomadDevicePlugin)
