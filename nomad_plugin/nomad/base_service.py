"""Nomad's BasePlugin service: PluginInfo, ConfigSchema, SetConfig (§2.3, §4).

Nomad calls these on every launch, before anything else, and may call
SetConfig two or three times in one process with the same bytes, so
SetConfig is idempotent. A config error returns INVALID_ARGUMENT, which makes
Nomad refuse to start the agent with our message: it must say which option,
which value and what is allowed.
"""

from __future__ import annotations

import threading

import grpc

from nomad_plugin import PLUGIN_NAME, __version__
from nomad_plugin._proto.nomad import base_pb2, base_pb2_grpc
from nomad_plugin.config.decode import secret_values
from nomad_plugin.config.model import ConfigError, PluginConfig
from nomad_plugin.config.schema import config_spec
from nomad_plugin.goplugin import logging as hclog
from nomad_plugin.nomad.device_service import grpc_status_for
from nomad_plugin.nomad.ports import ConfigTarget

DEVICE_API_VERSION = "v0.1.0"
# go-version equality: Nomad may echo either spelling back in SetConfig.
ACCEPTED_API_VERSIONS = frozenset({DEVICE_API_VERSION, DEVICE_API_VERSION.lstrip("v")})

log = hclog.get_logger("base")


def plugin_info() -> base_pb2.PluginInfoResponse:
    return base_pb2.PluginInfoResponse(
        type=base_pb2.DEVICE,
        plugin_api_versions=[DEVICE_API_VERSION],
        plugin_version=__version__,
        name=PLUGIN_NAME,
    )


class BaseService(base_pb2_grpc.BasePluginServicer):
    def __init__(self, app: ConfigTarget) -> None:
        self._app = app
        self._lock = threading.Lock()
        self._applied: PluginConfig | None = None

    def PluginInfo(
        self, request: base_pb2.PluginInfoRequest, context: grpc.ServicerContext
    ) -> base_pb2.PluginInfoResponse:
        return plugin_info()

    def ConfigSchema(
        self, request: base_pb2.ConfigSchemaRequest, context: grpc.ServicerContext
    ) -> base_pb2.ConfigSchemaResponse:
        return base_pb2.ConfigSchemaResponse(spec=config_spec())

    def SetConfig(
        self, request: base_pb2.SetConfigRequest, context: grpc.ServicerContext
    ) -> base_pb2.SetConfigResponse:
        version = request.plugin_api_version
        if version and version not in ACCEPTED_API_VERSIONS:
            context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"plugin_api_version {version[:40]!r} is not supported; allowed: {DEVICE_API_VERSION}",
            )
        try:
            config = self._app.accept_config(request.msgpack_config)
        except ConfigError as exc:
            log.error("rejected configuration: %s", exc)
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        with self._lock:
            hclog.set_secrets(secret_values(config))
            hclog.set_level(config.log_level)
            changed = self._applied != config
            try:
                self._app.set_config(config)
            except Exception as exc:
                code, message = grpc_status_for(exc)
                log.error("configuration not applied: %s", message, exc_info=code is grpc.StatusCode.INTERNAL)
                failure: tuple[grpc.StatusCode, str] | None = (code, message)
            else:
                failure = None
                self._applied = config
        if failure is not None:
            context.abort(*failure)
        if changed:
            from nomad_plugin.config.decode import deprecated_spellings

            for warning in deprecated_spellings(request.msgpack_config):
                log.warning("configuration: %s", warning)
            log.info(
                "configuration applied",
                extra={
                    "fields": {
                        "backend": config.backend,
                        "default_mode": config.default_mode,
                        "cards": len(config.cards),
                    }
                },
            )
        return base_pb2.SetConfigResponse()
