"""Shared plumbing for the integration tests: a simulated XDM node plus the
real plugin under the Go conformance host, wired the way an operator would
(plugin.hcl with `--set` overrides pointing at the simulator's sockets).

Every node lives in a short tmp dir under /tmp (Unix socket paths must stay
well under 108 bytes).
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nomad_plugin.sim import Simulator
from nomad_plugin.sim.profiles import CardSpec
from tests.conformance.hostlib import REPO, Event, HostProcess, HostRun, real_plugin
from tests.doubles.drifted_sim import DriftedSimulator

MIG_UNITS = 7
MIG_MEMORY_PARTS = 8


@dataclass
class Node:
    """One simulated node: its tmp root, the running simulator and the plugin's data_dir."""

    root: Path
    sim: Simulator

    @property
    def data_dir(self) -> Path:
        return self.root / "data"

    def plugin_args(self, *sets: str, phase: str = "all") -> list[str]:
        """Host arguments loading the real plugin against this node's simulator."""
        base = {
            "backend": "xdm",
            "xdm_socket": str(self.sim.dp2mgr_path),
            "config_socket": str(self.sim.config_path),
            "data_dir": str(self.data_dir),
            "nvml_enrich": False,
            "reconcile": False,
        }
        args = ["--plugin", str(real_plugin()), "--config", str(REPO / "plugin.hcl"), "--phase", phase]
        for key, value in base.items():
            args += ["--set", f"{key}={json.dumps(value)}"]
        for item in sets:
            args += ["--set", item]
        return args

    def card_by_uuid(self, uuid: str) -> CardSpec:
        for card in self.sim.cards:
            if card.uuid == uuid:
                return card
        raise KeyError(uuid)


def short_root(prefix: str = "it") -> Path:
    return Path(tempfile.mkdtemp(dir="/tmp", prefix=prefix))


@contextmanager
def sim_node(profile: str, *, state: bool = False, **options: Any) -> Iterator[Node]:
    """A started simulator in a fresh short tmp dir; stopped and removed afterwards."""
    root = short_root()
    state_file = root / "sim-state.json" if state else None
    # drift modes are the test double's (tests/doubles/drift.py); the rest is the product's simulator
    factory = DriftedSimulator if "drift" in options else Simulator
    sim = factory(root / "s", profile=profile, state_file=state_file, **options)
    sim.start()
    try:
        yield Node(root, sim)
    finally:
        sim.stop()
        shutil.rmtree(root, ignore_errors=True)


def set_of(key: str, value: Any) -> str:
    """One `--set key=<json>` value."""
    return f"{key}={json.dumps(value)}"


# Deadlines bound waits for conditions only: several plugins and simulators may
# start at once on a loaded 2-core box (test_conformance_profiles runs 6 in parallel).
DEADLINE_S = 90


def first_fingerprint_with_devices(proc: HostProcess, timeout: float = DEADLINE_S) -> Event:
    return proc.wait_for(lambda e: e["event"] == "fingerprint" and e["n_devices"] > 0, timeout=timeout)


def reserve(proc: HostProcess, ids: list[str], tag: str, expect: str = "ok", timeout: float = DEADLINE_S) -> Event:
    """Ask the plugin (through the host) to Reserve `ids`; return the reserve event."""
    proc.send({"op": "reserve", "ids": ids, "expect": expect, "tag": tag})
    return proc.wait_for(lambda e: e["event"] == "reserve" and e.get("tag") == tag, timeout=timeout)


def group_map(fingerprint: Event) -> dict[tuple[str, str, str], list[dict[str, Any]]]:
    """(vendor, type, name) -> devices of one fingerprint event."""
    return {(g["vendor"], g["type"], g["name"]): g["devices"] for g in fingerprint["groups"]}


def group_attrs(fingerprint: Event) -> dict[tuple[str, str, str], dict[str, Any]]:
    return {(g["vendor"], g["type"], g["name"]): g["attributes"] for g in fingerprint["groups"]}


def attr_value(attrs: dict[str, Any], key: str) -> Any:
    return attrs[key]["value"]


def timeline(events: list[Event], limit: int = 60) -> str:
    """A compact event timeline for assertion messages (fingerprints, stats, reserves, violations)."""
    lines = []
    for e in events:
        kind, t = e.get("event"), e.get("t_mono_ns", 0) / 1e9
        if kind == "fingerprint":
            groups = [(g["type"], g["name"], len(g["devices"])) for g in e["groups"]]
            lines.append(
                f"{t:8.3f} L{e['launch']} fingerprint seq={e['seq']} {groups[:3]}{'...' if len(groups) > 3 else ''}"
            )
        elif kind == "stats":
            names = [g["name"] for g in e["groups"]]
            lines.append(f"{t:8.3f} L{e['launch']} stats seq={e['seq']} n={e['n_instances']} {names[:3]}")
        elif kind in ("reserve", "violation", "launch", "shutdown", "run_end"):
            brief = {k: e[k] for k in ("ok", "tag", "rule", "detail", "reason", "graceful") if k in e}
            lines.append(f"{t:8.3f} L{e.get('launch')} {kind} {json.dumps(brief)[:200]}")
    return "\n".join(lines[-limit:])


def assert_conformant(run: HostRun) -> None:
    """No violation at all. Stats never lead the fingerprint that introduces their
    groups: the plugin builds them from the catalog of the last fingerprint sent."""
    assert not run.violations, run.describe() + "\n" + timeline(run)
    assert run.returncode == 0, run.describe() + "\n" + timeline(run)
