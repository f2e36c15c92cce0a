"""The simulator's public face: :class:`Simulator` (lifecycle, faults, control)."""

from __future__ import annotations

import json
import math
import threading
import time
from pathlib import Path
from types import TracebackType
from typing import Any

from nomad_plugin.goplugin.logging import get_logger
from nomad_plugin.sim.core import SimCore
from nomad_plugin.sim.drift import parse_drift
from nomad_plugin.sim.grants import GrantRecord
from nomad_plugin.sim.options import (
    DUPLICATE_ID_MODES,
    ERROR_MODES,
    RELEASE_UNKNOWN_MODES,
    SimOptions,
    check_choice,
)
from nomad_plugin.sim.profiles import NVML_PROFILE, CardSpec, build_cards, resolve_profile
from nomad_plugin.sim.schema import SCHEMAS, ServedSchema
from nomad_plugin.sim.server import XdmServers, make_stale_socket
from nomad_plugin.sim.topology import check_invariants

log = get_logger("sim")

DP2MGR_SOCKET = "dp2mgr.sock"
CONFIG_SOCKET = "config-daemon.sock"
CONTROL_SOCKET = "xdm-sim-control.sock"
RPC_NAMES = (
    "ListSupportedXPUType", "ListAndWatch", "Allocate", "Release", "ListGpuInfo", "ExporterGetDataList",
    "ExporterDataStream", "ExporterGetConfig", "ExporterGetStatus", "Enable", "Disable", "QueryStatus",
)  # fmt: skip


class Simulator:
    """A simulated XDM node serving ``dp2mgr.sock`` and ``config-daemon.sock`` in ``socket_dir``.

    Options are :class:`~nomad_plugin.sim.options.SimOptions` fields. Use as a
    context manager or call :meth:`start` / :meth:`stop`.
    """

    def __init__(
        self, socket_dir: Path | str, profile: str = "h800-8", state_file: Path | str | None = None, **options: Any
    ) -> None:
        self.socket_dir = Path(socket_dir)
        self.options = SimOptions.from_kwargs(options)
        self.profile = profile
        cards, reader = self._load_cards(profile)
        if self.options.topology_variant == "normal":
            problems = check_invariants({c.minor: json.loads(c.topology_json) for c in cards})
            if problems:
                raise ValueError(f"profile {profile}: topology self-check failed: {problems[0]}")
        self.cards: list[CardSpec] = cards
        self.state_file = Path(state_file) if state_file is not None else None
        self.core = SimCore(profile, cards, self.options, self.state_file, reader)
        self.dp2mgr_path = self.socket_dir / DP2MGR_SOCKET
        self.config_path = self.socket_dir / CONFIG_SOCKET
        self.control_path = self.socket_dir / CONTROL_SOCKET
        self._servers = XdmServers(
            self.core, self.dp2mgr_path, self.config_path, self.options.schema, self.options.reflection
        )
        self._lifecycle = threading.RLock()
        self._collector_stop = threading.Event()
        self._collector: threading.Thread | None = None
        self._control: Any = None
        self.crashed = False

    def _load_cards(self, profile: str) -> tuple[list[CardSpec], Any]:
        if profile == NVML_PROFILE or self.options.nvml_mirror:
            from nomad_plugin.sim import nvml_mirror

            cards, handles = nvml_mirror.load_cards(self.options.topology_variant)
            self.profile = NVML_PROFILE
            return cards, nvml_mirror.make_reader(handles)
        spec = resolve_profile(profile)
        self.profile = spec.name
        return build_cards(spec, self.options.topology_variant), None

    # ------------------------------------------------------------ lifecycle
    def start(self) -> Simulator:
        with self._lifecycle:
            self._servers.start()
            self.crashed = False
            if self._collector is None:
                self._collector_stop.clear()
                self._collector = threading.Thread(target=self._collect_loop, name="xdm-sim-collector", daemon=True)
                self._collector.start()
            if self.options.control and self._control is None:
                self._start_control()
        log.info(
            "xdm-sim %s: %d cards on %s (%s)",
            self.profile, len(self.cards), self.socket_dir, ", ".join(f"{c.minor}:{c.model}" for c in self.cards[:1]),
        )  # fmt: skip
        return self

    def _start_control(self) -> None:
        from nomad_plugin.sim.control import ControlServer

        self._control = ControlServer(self, self.control_path)
        self._control.start()

    def stop(self) -> None:
        with self._lifecycle:
            if self._control is not None:
                self._control.stop()
                self._control = None
            self._collector_stop.set()
            if self._collector is not None:
                self._collector.join(5.0)
                self._collector = None
            self._servers.stop()
            for path in (self.dp2mgr_path, self.config_path):
                if path.exists():
                    path.unlink()  # also a crash's stale files

    def __enter__(self) -> Simulator:
        return self.start()

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self.stop()

    def _collect_loop(self) -> None:
        interval = self.options.collect_interval_ms / 1000.0
        while not self._collector_stop.wait(interval):
            try:
                self.core.collect()
            except Exception:  # never let the collector die silently
                log.exception("metrics collection failed")

    # ------------------------------------------------------------ faults
    def restart(
        self,
        downtime: float = 0.5,
        remove_dir: bool = False,
        schema: str | None = None,
        reflection: bool | None = None,
    ) -> None:
        """Stop both servers (streams end UNAVAILABLE), unlink the sockets, wait, re-bind.

        Grants survive: read back from the state file, or kept in memory.
        ``remove_dir`` also removes the socket directory during the downtime
        (only when nothing but the simulator's own sockets is in it).
        ``schema`` / ``reflection``: come back serving another schema (an
        upgraded XDM), with or without server reflection.
        """
        if schema is not None:
            check_choice("schema", schema, SCHEMAS)
        with self._lifecycle:
            log.info("restart: down for %.2fs", downtime)
            self._servers.stop()
            if schema is not None:
                self.options.schema = schema
                self._servers.set_schema(schema)
            if reflection is not None:
                self.set_reflection(reflection)
            control_was_up = self._control is not None
            if remove_dir:
                self._remove_socket_dir()
            time.sleep(downtime)
            self.core.reload()
            self._servers.start()
            self.crashed = False
            if remove_dir and control_was_up and self._control is None:
                self._start_control()
            log.info("restart: serving again (schema %s, reflection %s)", self.options.schema, self._reflection_word())

    def _remove_socket_dir(self) -> None:
        if self._control is not None:
            self._control.stop()
            self._control = None
        leftovers = [p.name for p in self.socket_dir.iterdir()] if self.socket_dir.exists() else []
        if leftovers:
            raise RuntimeError(f"restart(remove_dir=True): {self.socket_dir} still holds {leftovers}")
        if self.socket_dir.exists():
            self.socket_dir.rmdir()

    def crash(self) -> None:
        """Stop serving and leave stale socket files behind (connects get ECONNREFUSED)."""
        with self._lifecycle:
            self._servers.stop(grace=0.0)
            make_stale_socket(self.dp2mgr_path)
            make_stale_socket(self.config_path)
            self.crashed = True
            log.info("crash: sockets left stale")

    def revive(self) -> None:
        """Come back after :meth:`crash` (grants read back as after a restart)."""
        with self._lifecycle:
            if self._servers.running:
                return
            self.core.reload()
            self._servers.start()
            self.crashed = False
            log.info("revive: serving again")

    def slow_start(self, seconds: float) -> None:
        """Every RPC hangs for ``seconds`` from now (starting the servers if they are down)."""
        with self.core.lock:
            self.core.hang_until = time.monotonic() + seconds
        if not self._servers.running:
            self.revive()

    def set_health(self, minor: int, healthy: bool, reason: str = "") -> None:
        self.core.set_health(minor, healthy, reason)

    def remove_device(self, minor: int) -> None:
        self.core.remove_device(minor)

    def add_device(self, minor: int) -> None:
        self.core.add_device(minor)

    def set_latency(self, rpc: str, seconds: float) -> None:
        """Delay every call of ``rpc`` ("*" = all) by ``seconds``; ``math.inf`` hangs; 0 clears."""
        if rpc != "*" and rpc not in RPC_NAMES:
            raise ValueError(f"rpc: unknown RPC {rpc!r} (known: *, {', '.join(RPC_NAMES)})")
        if seconds < 0 or math.isnan(seconds):
            raise ValueError(f"seconds: {seconds} must be >= 0")
        with self.core.lock:
            if seconds == 0:
                self.core.latency.pop(rpc, None)
            else:
                self.core.latency[rpc] = seconds

    @property
    def schema(self) -> ServedSchema:
        """The schema served now (descriptors, pool, ``emit``)."""
        return self._servers.schema

    def set_reflection(self, on: bool) -> None:
        """Serve gRPC server reflection (the served schema's descriptors) from the next call on."""
        self.options.reflection = on
        self._servers.reflection = on
        log.info("reflection: %s", self._reflection_word())

    def _reflection_word(self) -> str:
        return "on" if self.options.reflection else "off"

    def set_drift(self, mode: str | None) -> None:
        drift = parse_drift(mode)
        with self.core.lock:
            self.core.drift = drift
        log.info("drift: %s", drift.describe())

    def set_error_mode(self, mode: str) -> None:
        check_choice("error_mode", mode, ERROR_MODES)
        self.options.error_mode = mode

    def set_enabled(self, enabled: bool) -> None:
        self.core.set_enabled(enabled)

    def set_topology_level(self, name: str, value: str | None, minors: list[int] | None = None) -> None:
        """Set a string topology level (``leafSwitch``, ``pointOfDelivery``, ...) on cards, or remove it."""
        self.core.set_topology_level(name, value, minors)
        self.cards = [self.core.cards[c.minor] for c in self.cards]

    def calls(self) -> dict[str, int]:
        """How many times each RPC was called (streams count once per subscription)."""
        with self.core.lock:
            return dict(self.core.calls)

    def set_duplicate_id_mode(self, mode: str) -> None:
        check_choice("duplicate_id_mode", mode, DUPLICATE_ID_MODES)
        self.options.duplicate_id_mode = mode

    def set_release_unknown(self, mode: str) -> None:
        check_choice("release_unknown", mode, RELEASE_UNKNOWN_MODES)
        self.options.release_unknown = mode

    def set_exporter_state(self, state: str) -> None:
        """ExporterGetStatus reports ``running``, ``stopped`` or ``error`` (not running: no collections)."""
        self.core.set_exporter_state(state)

    def set_config_failure(self, fail: bool) -> None:
        """Enable/Disable answer ``success: false`` while set."""
        self.core.config_fail = fail

    def grants(self) -> dict[str, GrantRecord]:
        return self.core.grants()

    def close_streams(self) -> None:
        """End every open ListAndWatch / ExporterDataStream with UNAVAILABLE."""
        self._servers.close_streams()

    def status(self) -> dict[str, Any]:
        """A summary for the control channel and logs."""
        with self.core.lock:
            return {
                "profile": self.profile,
                "socket_dir": str(self.socket_dir),
                "serving": self._servers.running,
                "crashed": self.crashed,
                "enabled": self.core.state.enabled,
                "drift": self.core.drift.describe(),
                "schema": self.options.schema,
                "reflection": self.options.reflection,
                "services": self._servers.schema.service_names(),
                "error_mode": self.options.error_mode,
                "exporter": self.core.exporter_state,
                "latency": dict(self.core.latency),
                "cards": [
                    {
                        "minor": c.minor,
                        "uuid": c.uuid,
                        "model": c.model,
                        "present": c.minor in self.core.present,
                        "healthy": self.core.health[c.minor][0],
                        "reason": self.core.health[c.minor][1],
                    }
                    for c in self.cards
                ],
                "grants": len(self.core.state.grants),
                "calls": dict(self.core.calls),
                "subscribers": self.core.subscriber_count(),
            }
