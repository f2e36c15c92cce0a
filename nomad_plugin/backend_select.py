"""Choosing and decorating the device backend for a configuration.

``backend = "auto"`` picks XDM when its socket exists and NVML otherwise. With
neither present it still picks XDM: the plugin then advertises no devices and
reports XDM as unreachable until the socket appears, instead of failing to
load (Nomad would drop it for good). With XDM chosen and NVML usable,
inventories are enriched with NVML's PCI bus IDs, NUMA nodes and clocks.
Backends are imported lazily: pynvml is only imported when NVML is in play.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator, Sequence

from nomad_plugin.config.model import PluginConfig
from nomad_plugin.goplugin.logging import get_logger
from nomad_plugin.model.backend_port import Backend, InventoryListener
from nomad_plugin.model.card import Inventory
from nomad_plugin.model.grant import Grant, GrantRequest
from nomad_plugin.model.metrics import MetricSample

log = get_logger(__name__)


def choose_backend_name(config: PluginConfig, nvml_usable: Callable[[], bool]) -> str:
    """The backend a config resolves to ("xdm" or "nvml"); pure apart from the probes."""
    if config.backend in ("xdm", "nvml"):
        return config.backend
    if os.path.exists(config.xdm_socket):
        return "xdm"
    return "nvml" if nvml_usable() else "xdm"


def _nvml_usable() -> bool:
    from nomad_plugin.nvml.probe import nvml_available

    return nvml_available()


def accept_config(msgpack_config: bytes) -> PluginConfig:
    """SetConfig's verdict on ``msgpack_config``: the validated config, or ``ConfigError``.

    The one code path for the plugin's SetConfig and ``doctor``'s config check,
    so doctor can never accept what the plugin refuses."""
    from nomad_plugin.config.decode import decode_config

    config = decode_config(msgpack_config)
    validate_config(config)
    return config


def validate_config(config: PluginConfig) -> None:
    """Checks that need more than the decoder: an ``xdm_schema`` path must compile
    (``ConfigError`` naming the file and the parser's message). Reads only local
    files, never XDM; grpcio-tools is imported here, after the handshake."""
    from nomad_plugin.xdm.schema_source import is_path

    if not is_path(config.xdm_schema):
        return
    from nomad_plugin.config.model import ConfigError
    from nomad_plugin.xdm.binder import SchemaError
    from nomad_plugin.xdm.schema_source import load_path

    try:
        load_path(config.xdm_schema)
    except SchemaError as exc:
        raise ConfigError(f'config option "xdm_schema": {exc}') from None


def select_backend(config: PluginConfig, nvml_usable: Callable[[], bool] = _nvml_usable) -> Backend:
    name = choose_backend_name(config, nvml_usable)
    if name == "nvml":
        from nomad_plugin.nvml.backend import DROP_IN_NOTE, NvmlBackend

        log.info("backend: nvml")
        log.warning(DROP_IN_NOTE)
        return NvmlBackend(config, xid_hold_s=config.xid_hold)
    from nomad_plugin.xdm.backend import XdmBackend

    xdm: Backend = XdmBackend(config)
    if config.nvml_enrich and nvml_usable():
        from nomad_plugin.nvml.enrich import Enricher

        log.info("backend: xdm, enriched from NVML")
        return EnrichedBackend(xdm, Enricher())
    log.info("backend: xdm (socket %s)", config.xdm_socket)
    return xdm


class EnrichedBackend:
    """An XDM backend whose inventories pass through an enrichment function."""

    def __init__(self, inner: Backend, enrich: Callable[[Inventory], Inventory]) -> None:
        self._inner = inner
        self._enrich = enrich
        self.name = inner.name

    def start(self) -> None:
        self._inner.start()

    def stop(self) -> None:
        self._inner.stop()
        close = getattr(self._enrich, "close", None)
        if callable(close):
            close()

    def inventory(self) -> Inventory:
        return self._enrich(self._inner.inventory())

    def subscribe(self, listener: InventoryListener) -> Callable[[], None]:
        return self._inner.subscribe(lambda inv: listener(self._enrich(inv)))

    def allocate(self, request: GrantRequest) -> Grant:
        return self._inner.allocate(request)

    def release(self, grant_id: str) -> None:
        self._inner.release(grant_id)

    def metrics_snapshot(self) -> Sequence[MetricSample]:
        return self._inner.metrics_snapshot()

    def metrics_stream(self, cancel: threading.Event) -> Iterator[Sequence[MetricSample]]:
        return self._inner.metrics_stream(cancel)
