"""doctor's findings, and its checks of what this node has: NVML or XDM (sockets, schema, Runtime Kit,
inventory, topology) and the cards the config would offer.

``Doctor`` (``cli/doctor.py``) runs them in the order an operator reads them, beside the checks of the
install and the agent.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nomad_plugin.config.model import PluginConfig
from nomad_plugin.model.card import Inventory
from nomad_plugin.model.errors import PluginError
from nomad_plugin.nomad.catalog import check_modes
from nomad_plugin.nvml import lib as nvml_lib
from nomad_plugin.nvml.backend import NvmlBackend
from nomad_plugin.nvml.lib import nvml_available
from nomad_plugin.xdm.client import XdmClient, socket_problem

OK, WARN, FAIL, SKIP = "ok", "warn", "fail", "skip"
NVML_WAIT_S = 15.0


@dataclass(frozen=True)
class Finding:
    check: str
    status: str
    summary: str
    next_step: str = ""


@dataclass
class Host:
    """The host as the doctor sees it; tests replace parts (they run as root, so access is injected)."""

    root: Path = Path("/")
    access: Callable[[str, int], bool] = os.access
    environ: dict[str, str] = field(default_factory=lambda: dict(os.environ))
    nvml_loader: Callable[[], Any] = nvml_lib.load
    nvml_usable: Callable[[], bool] = nvml_available


class NodeChecks:
    """The node-side checks, for ``Doctor``: each adds its findings with ``add``."""

    config: PluginConfig | None
    host: Host
    verbose: bool
    findings: list[Finding]

    def add(self, check: str, status: str, summary: str, next_step: str = "") -> None:
        self.findings.append(Finding(check, status, summary, next_step))

    def check_nvml(self) -> None:
        assert self.config is not None
        try:  # NVML that does not initialise is said at once, not after the backend's retries
            reason = nvml_lib.nvml_unavailable_reason(self.host.nvml_loader())
        except nvml_lib.NvmlMissing as exc:
            reason = str(exc)
        inventory = None
        if not reason:
            backend = NvmlBackend(self.config, loader=self.host.nvml_loader, event_timeout_ms=100)
            backend.start()
            try:
                ready = backend.wait_ready(NVML_WAIT_S)
                inventory = backend.inventory()
            finally:
                backend.stop()
            if not ready or not inventory.reachable:
                reason = inventory.unreachable_reason or f"no inventory within {NVML_WAIT_S:.0f} s"
        if reason or inventory is None:
            self.add(
                "nvml",
                FAIL,
                f"the NVML backend cannot read the cards: {reason}",
                "install the NVIDIA driver (libnvidia-ml.so.1) and run the Nomad client as root; with XDM on this "
                'node set backend = "xdm" (or fix xdm_socket) instead',
            )
            return
        models = sorted({c.model for c in inventory.cards})
        self.add("nvml", OK, f"NVML reads {len(inventory.cards)} cards: {', '.join(models) or 'none'}")
        self._card_health(inventory.cards, "nvml cards", dropin=True)
        self._config_vs_cards(inventory.cards)

    def _config_vs_cards(self, cards: Any) -> None:
        """What the agent log would warn about: card blocks, filters or modes this node's cards defeat."""
        assert self.config is not None
        problems = check_modes(Inventory(cards=tuple(cards)), self.config)
        if not problems:
            self.add("config vs cards", OK, "every card block and filter applies to this node's cards as written")
            return
        self.add(
            "config vs cards",
            WARN,
            "; ".join(problems),
            "fix the card block or filter named above (a typo leaves it without effect); the plugin logs the same "
            "warnings at start",
        )

    def _card_health(self, cards: Any, check: str = "card health", dropin: bool = False) -> None:
        """Unhealthy cards with their reasons; ``dropin``: NVML cards, which nomad-device-nvidia would call healthy."""
        sick = [c for c in cards if not c.healthy]
        if not sick:
            self.add(check, OK, f"all {len(list(cards))} cards healthy")
            return
        listed = "; ".join(
            f"minor {c.minor} ({c.uuid or 'no uuid'}): {c.health_reason or 'no reason given'}" for c in sick
        )
        self.add(
            check,
            FAIL if len(sick) == len(list(cards)) else WARN,
            f"{len(sick)} of {len(list(cards))} cards unhealthy: {listed}",
            "Nomad gives no task an unhealthy card; check `nvidia-smi -q` / the PPU tools and the kernel log "
            "(dmesg | grep -i xid); XID 79 (fallen off the bus) or a reset-required card needs a reset or reboot"
            + (
                "; nomad-device-nvidia would report such a card healthy, or stop fingerprinting every card when "
                "NVML cannot read one (docs/nvidia-dropin.md)"
                if dropin
                else ""
            ),
        )

    def check_sockets(self) -> bool:
        assert self.config is not None
        sockets = (("dp2mgr", self.config.xdm_socket), ("config-daemon", self.config.config_socket))
        return all([self._socket(label, path) for label, path in sockets])  # both judged, both reported

    def _socket(self, label: str, path: str) -> bool:
        check = f"socket {label}"
        try:
            st = os.stat(path)
        except FileNotFoundError:
            self.add(
                check,
                FAIL,
                f"{path} does not exist",
                "XDM is not running or the Runtime Kit is not installed on this node: check the Runtime Kit "
                "Controller job and `ls -l " + str(Path(path).parent) + "`; if XDM uses another directory, set "
                "xdm_socket / config_socket in the plugin config",
            )
            return False
        except PermissionError:
            self.add(check, FAIL, f"{path}: permission denied on a parent directory", "run the Nomad client as root")
            return False
        mode = stat.filemode(st.st_mode)
        if not stat.S_ISSOCK(st.st_mode):
            self.add(
                check,
                FAIL,
                f"{path} exists but is not a socket ({mode})",
                "something else owns that path: remove it and restart XDM, or point the plugin at the real socket",
            )
            return False
        if not self.host.access(path, os.R_OK | os.W_OK):
            self.add(
                check,
                FAIL,
                f"{path} ({mode}, uid {st.st_uid}) cannot be opened by this user (uid {os.geteuid()})",
                "XDM sockets are root-only (expected: srw------- root); the plugin runs as the Nomad client's user, "
                "so run the Nomad client as root (and run doctor with sudo)",
            )
            return False
        if st.st_mode & 0o002:
            self.add(
                check, WARN, f"any user can connect to {path} ({mode})", "XDM normally creates it root-only (0600)"
            )
            return True
        self.add(check, OK, f"{path} ({mode}, uid {st.st_uid})")
        return True

    def check_xdm(self) -> None:
        assert self.config is not None
        problem = socket_problem(self.config.xdm_socket)
        if problem is not None:
            self.add("xdm", FAIL, str(problem), xdm_next_step(problem.kind))
            return
        with contextlib.closing(XdmClient(self.config)) as client:
            self._xdm_calls(client)

    def _schema(self, client: Any) -> None:
        """How XDM's schema (``xdm_schema``) bound; the field-by-field report with ``--verbose``."""
        try:
            client.binding()
        except PluginError as exc:
            if getattr(exc, "kind", "") != "schema-mismatch":
                return  # XDM unreachable: the "xdm" check says why
        bound = client.last_binding
        report = "\n".join(["", *bound.report_lines()]) if bound is not None and self.verbose else ""
        if client.last_bind_error:
            more = "" if self.verbose else " (`doctor --verbose` prints the field-by-field binding report)"
            self.add("xdm schema", FAIL, client.last_bind_error + report, _SCHEMA_NEXT_STEP + more)
        elif bound is not None:
            self.add("xdm schema", OK, f"bound from {bound.source}{report}")

    def _xdm_calls(self, client: Any) -> None:
        self._schema(client)
        try:
            service = client.device_service()
            types = client.list_supported_xpu_types()
        except PluginError as exc:
            kind = getattr(exc, "kind", "")
            self.add("xdm", FAIL, f"XDM does not answer: {exc}", xdm_next_step(kind))
            return
        self.add("xdm", OK, f"XDM answers as {service}; supported types: {', '.join(types) or 'none'}")
        try:
            status = client.query_status()
        except PluginError as exc:
            self.add(
                "runtime kit",
                WARN,
                f"QueryStatus failed: {exc}",
                "the config daemon (config-daemon.sock) does not answer; check the Runtime Kit Controller job",
            )
        else:
            if status.doubt:
                self.add("runtime kit", WARN, f"Runtime Kit status unknown, because {status.doubt}", _SCHEMA_NEXT_STEP)
            elif status.enabled:
                self.add("runtime kit", OK, "Runtime Kit enabled (QueryStatus)")
            else:
                self.add(
                    "runtime kit",
                    FAIL,
                    f"Runtime Kit is disabled on this node (QueryStatus enabled=false{': ' + status.message if status.message else ''})",
                    "enable it off-peak: `nomad-device-lingjun runtime-kit enable`, or the sysbatch job "
                    'examples/jobs/runtime-kit-controller.sysbatch.hcl for nodes with meta lj_runtimekit_enable = "true"; '
                    "XDM refuses allocations while disabled (the plugin never enables it)",
                )
        self._inventory(client)

    def _inventory(self, client: Any) -> None:
        try:
            sub = client.list_and_watch()
            try:
                cards = next(iter(sub))
            finally:
                sub.cancel()
        except (PluginError, StopIteration) as exc:
            self.add(
                "inventory",
                FAIL,
                f"ListAndWatch gave no card list: {exc}",
                "run `nomad-device-lingjun xdm-probe --raw` and report its output",
            )
            return
        if not cards:
            self.add(
                "inventory",
                WARN,
                "XDM lists no cards",
                "check the driver (`nvidia-smi` / the PPU tools) and XDM's logs",
            )
            return
        models = sorted({c.model for c in cards})
        finding = client.schema_finding()
        if finding:
            self.add("inventory", FAIL, f"{len(cards)} cards, none trusted: {finding}", _SCHEMA_NEXT_STEP)
            return
        self.add("inventory", OK, f"{len(cards)} cards: {', '.join(models)}")
        self._card_health(cards)
        self._config_vs_cards(cards)
        broken = [c for c in cards if c.topology.error]
        if broken:
            first = broken[0]
            self.add(
                "topology",
                WARN,
                f"{len(broken)} card(s) with unreadable topology, e.g. minor {first.minor}: {first.topology.error}",
                "cards are still offered, without topology attributes and group_by domains; report `xdm-probe --raw`",
            )
        else:
            levels = sorted({lvl.name for c in cards for lvl in c.topology.levels})
            self.add("topology", OK, f"topology levels: {', '.join(levels) or 'none'}")


_SCHEMA_NEXT_STEP = (
    "set xdm_schema to XDM's official api_outer.proto (a file, a directory or a descriptor set; no rebuild), "
    "or map a renamed field with xdm_field_aliases; `nomad-device-lingjun xdm-probe --capture DIR` for a bug report"
)


def xdm_next_step(kind: str) -> str:
    return {
        "socket-missing": "start XDM (Runtime Kit Controller job) or fix xdm_socket",
        "connection-refused": "the socket file is stale: XDM has crashed or is restarting; check XDM's service and logs",
        "permission-denied": "run the Nomad client (and doctor) as root: XDM sockets are root-only",
        "unimplemented": "XDM answers but not with a known service name: set xdm_service (see `xdm-probe`)",
        "schema-mismatch": _SCHEMA_NEXT_STEP,
        "timeout": "XDM accepted the connection but did not answer in xdm_call_timeout; check its load and logs",
    }.get(kind, "run `nomad-device-lingjun xdm-probe --raw` for details")
