"""The decoded, validated configuration object every layer reads, and the error that refuses one."""

from __future__ import annotations

from dataclasses import dataclass, field

#: The shortest period cards are re-read at; nomad-device-nvidia re-reads without pause at "0s" or less.
MIN_FINGERPRINT_PERIOD_S = 1.0


class ConfigError(ValueError):
    """A configuration value is invalid; the message names option and value (SetConfig: INVALID_ARGUMENT)."""


@dataclass(frozen=True)
class CardRule:
    match: str
    mode: str = "whole"  # whole | tdm | mig
    shares: int = 0
    share_percent: int = 0


@dataclass(frozen=True)
class PluginConfig:
    """Field names equal the option names in ``options.py``; durations in seconds."""

    enabled: bool = True
    ignored_gpu_ids: tuple[str, ...] = ()
    fingerprint_period: float = 60.0  # as written (Go's time.ParseDuration: may be <= 0 or beyond 30 days)
    backend: str = "auto"
    xdm_socket: str = "/run/amp/eKitC/xdm/sockets/dp2mgr.sock"
    config_socket: str = "/run/amp/eKitC/xdm/sockets/config-daemon.sock"
    xdm_service: str = ""
    xdm_minor_encoding: str = "explicit"
    xdm_call_timeout: float = 5.0
    xdm_allocate_timeout: float = 60.0
    xdm_env_allow: tuple[str, ...] = ()
    xdm_mount_allow: tuple[str, ...] = ()
    xdm_schema: str = "auto"
    xdm_field_aliases: tuple[tuple[str, str], ...] = ()  # sorted ("Message.field" or "field", XDM field name)
    log_level: str = "info"
    data_dir: str = "/var/lib/nomad-device-lingjun"
    default_mode: str = "whole"
    tdm_shares: int = 10
    mig_models: tuple[str, ...] = ("A100", "A800", "H100", "H800", "H200", "H20", "A30")
    group_by: str = "none"
    ignored_ids: tuple[str, ...] = ()
    include_vendors: tuple[str, ...] = ()
    exclude_vendors: tuple[str, ...] = ()
    include_types: tuple[str, ...] = ()
    exclude_types: tuple[str, ...] = ()
    health_recovery_checks: int = 3
    health_recovery_delay: float = 30.0
    inventory_resync_period: float = 60.0
    container_mounts: str = "auto"  # auto | always | never
    reconcile: bool = True
    release_grace_period: float = 30.0
    nomad_address: str = ""
    nomad_token: str = field(default="", repr=False)
    nomad_token_file: str = ""
    nomad_ca_cert: str = ""
    nomad_client_cert: str = ""
    nomad_client_key: str = ""
    nomad_tls_server_name: str = ""
    nomad_node_id: str = ""
    node_meta: bool = False
    node_meta_prefix: str = "lingjun."
    nvml_enrich: bool = True
    xid_hold: float = 300.0
    xid_ignore: tuple[int, ...] = (13, 31, 43, 45, 68, 109)
    metrics_port: int = 0
    metrics_bind: str = "127.0.0.1"
    cards: tuple[CardRule, ...] = ()
