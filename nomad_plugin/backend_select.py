"""Choosing the device backend for a configuration, and SetConfig's verdict on one.

``backend = "auto"`` picks XDM when its socket exists, else NVML when it opens, else XDM: the plugin
then reports XDM unreachable until the socket appears instead of failing to load (Nomad would drop
it for good). On XDM nodes with ``nvml_enrich`` and NVML, the NVML companion rides along.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from nomad_plugin.config.model import PluginConfig
from nomad_plugin.model.card import Backend

if TYPE_CHECKING:
    from nomad_plugin.nvml.companion import NvmlCompanion

log = logging.getLogger(__name__)


def choose_backend_name(config: PluginConfig, nvml_usable: Callable[[], bool]) -> str:
    if config.backend in ("xdm", "nvml"):
        return config.backend
    if os.path.exists(config.xdm_socket):
        return "xdm"
    return "nvml" if nvml_usable() else "xdm"


def _nvml_usable() -> bool:
    from nomad_plugin.nvml.lib import nvml_available

    return nvml_available()


def accept_config(msgpack_config: bytes) -> PluginConfig:
    """The validated config, or ``ConfigError``: SetConfig's and ``doctor``'s one verdict."""
    from nomad_plugin.config.decode import decode_config

    config = decode_config(msgpack_config)
    validate_config(config)
    return config


def validate_config(config: PluginConfig) -> None:
    """A ``nomad_token_file`` must hold a token only the plugin's user can read, an ``xdm_schema`` path must
    compile (``ConfigError`` naming the file); reads local files only."""
    from nomad_plugin.config.model import ConfigError
    from nomad_plugin.xdm.binder import is_path

    if config.nomad_token_file:
        from nomad_plugin.util.secret_file import SecretFileError, read_secret_file

        try:
            read_secret_file(config.nomad_token_file)
        except SecretFileError as exc:
            raise ConfigError(
                f'config option "nomad_token_file": value {config.nomad_token_file!r} {exc}; allowed: a regular file '
                f"holding the token, owned by the plugin's user (uid {os.geteuid()}), mode 0600 or 0400"
            ) from None
    if not is_path(config.xdm_schema):
        return
    from nomad_plugin.xdm.binder import SchemaError, load_path

    try:
        load_path(config.xdm_schema)
    except SchemaError as exc:
        raise ConfigError(f'config option "xdm_schema": {exc}') from None


@dataclass(frozen=True)
class Hardware:
    """The backend, and on XDM nodes the NVML companion (the backend's ``stop`` stops both)."""

    backend: Backend
    nvml: NvmlCompanion | None = None


def select_hardware(config: PluginConfig, nvml_usable: Callable[[], bool] = _nvml_usable) -> Hardware:
    if choose_backend_name(config, nvml_usable) == "nvml":
        from nomad_plugin.nvml.backend import DROP_IN_NOTE, NvmlBackend

        log.info("backend: nvml")
        log.warning(DROP_IN_NOTE)
        return Hardware(NvmlBackend(config, xid_hold_s=config.xid_hold))
    from nomad_plugin.xdm.backend import XdmBackend

    xdm = XdmBackend(config)
    if config.nvml_enrich:
        from nomad_plugin.nvml.companion import EnrichedBackend, NvmlCompanion

        companion = NvmlCompanion()
        why = companion.open()
        if not why:
            log.info("backend: xdm, enriched from NVML")
            return Hardware(EnrichedBackend(xdm, companion), companion)
        log.debug("no NVML beside XDM: %s", why)
    log.info("backend: xdm (socket %s)", config.xdm_socket)
    return Hardware(xdm)


def select_backend(config: PluginConfig, nvml_usable: Callable[[], bool] = _nvml_usable) -> Backend:
    return select_hardware(config, nvml_usable).backend
