"""The real plugin on the NVML double, beside the restated official plugin, item by item.

``run_plugin`` launches the real plugin executable under the Go conformance
host with ``backend = "nvml"`` and the NVML double imported as ``pynvml``
(tests/doubles/nvml_shim), and records its first complete fingerprint,
its first stats with readings, and the Reserves asked for. ``expected``
asks ``official_oracle`` the same questions of the same double. ``compare``
turns both into items (one per group, device list, device, attribute, stat,
Reserve and config value) and names, for every item that differs, the
documented decision that explains it (``DECISIONS``; docs/nvidia-dropin.md).
An item that differs without a decision is an undocumented difference.
"""

from __future__ import annotations

import atexit
import functools
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from nomad_plugin.config.decode import decode_config
from nomad_plugin.nomad.catalog import normalize_pci_bus_id
from tests.conformance.hostlib import REPO, HostProcess, HostRun, real_plugin, start_host
from tests.doubles.fake_pynvml import FakeNvml, fake_from_spec, write_mig_caps
from tests.nvml import official_oracle as oracle

SHIM = REPO / "tests" / "doubles" / "nvml_shim"
DEADLINE_S = 90.0
#: Log lines that say the NVML backend's first look at the cards is done: it read them, or NVML failed.
READY_LINES = ("nvml reachable again", "NVML watcher failed", "NVML unavailable")


# --- scenarios ---------------------------------------------------------------------------------


@dataclass
class Scenario:
    """One node (a ``fake_from_spec`` JSON), the plugin config beside plugin.hcl, and Reserves to ask."""

    name: str
    node: dict[str, Any] | list[dict[str, Any]]
    config: dict[str, Any] = field(default_factory=dict)
    #: each a list of device IDs, or a function of the official fingerprint's groups giving one
    reserves: list[list[str] | Callable[[list[dict[str, Any]]], list[str]]] = field(default_factory=list)
    #: the real plugin is expected to fingerprint no device here (so no fingerprint with devices is awaited)
    empty: bool = False
    note: str = ""

    def fake(self) -> FakeNvml:
        return fake_from_spec(self.node)

    def plugin_config(self) -> dict[str, Any]:
        return {"backend": "nvml", "reconcile": False, **self.config}


def gpus(*made: Any) -> list[dict[str, Any]]:
    """``FakeGpu``s as the JSON the shim reads."""
    return [asdict(g) for g in made]


# --- running the real plugin -------------------------------------------------------------------


@functools.cache
def nvml_library_dir() -> str:
    """A directory whose ``libnvidia-ml.so.1`` opens (a link to libc): the plugin opens it before importing pynvml."""
    libc = next(line.split()[-1] for line in Path("/proc/self/maps").read_text().splitlines() if "/libc.so" in line)
    where = tempfile.mkdtemp(prefix="ljnvml-")
    atexit.register(shutil.rmtree, where, True)
    (Path(where) / "libnvidia-ml.so.1").symlink_to(libc)
    return where


def shim_env(node_file: Path, proc_root: Path | None = None) -> dict[str, str]:
    path = os.pathsep.join([str(SHIM), str(REPO), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    libs = os.pathsep.join([nvml_library_dir(), os.environ.get("LD_LIBRARY_PATH", "")]).rstrip(os.pathsep)
    env = {"PYTHONPATH": path, "FAKE_NVML_GPUS_FILE": str(node_file), "LD_LIBRARY_PATH": libs}
    if proc_root is not None:
        env["FAKE_NVML_PROC_ROOT"] = str(proc_root)
    return env


@dataclass
class Observed:
    """What the real plugin sent: first complete fingerprint, first stats with readings, the Reserves."""

    groups: list[dict[str, Any]]
    stats: dict[str, dict[str, Any]]
    reserves: list[dict[str, Any]]
    schema_defaults: dict[str, str]
    set_config_ok: bool
    run: HostRun


class PluginNode:
    """The real plugin under the conformance host on one scenario's node; a context manager."""

    def __init__(
        self,
        scenario: Scenario,
        host: Path,
        *,
        extra_sets: Iterable[str] = (),
        plugin: Path | None = None,
        real_nvml: bool = False,
    ) -> None:
        """``real_nvml``: the node's own NVML (a GPU machine), not the double; ``plugin``: another executable."""
        self.scenario = scenario
        self.root = Path(tempfile.mkdtemp(dir="/tmp", prefix="ljdrop-"))
        self.node_file = self.root / "node.json"
        self.write_node(scenario.node)
        self.proc_root = self.root / "proc"
        write_mig_caps(self.proc_root, scenario.fake())
        sets = {**scenario.plugin_config(), "data_dir": str(self.root / "data")}
        args = ["--plugin", str(plugin or real_plugin()), "--config", str(REPO / "plugin.hcl"), "--phase", "run"]
        args += ["--duration", "0", "--stats-interval", "1", "--stats-detail"]
        for key, value in sets.items():
            args += ["--set", f"{key}={json.dumps(value)}"]
        for item in extra_sets:
            args += ["--set", item]
        self.expect_config_ok = _config_decodes(sets)
        if not self.expect_config_ok:
            args += ["--expect-set-config", "error"]
        env = None if real_nvml else shim_env(self.node_file, self.proc_root)
        self.proc: HostProcess = start_host(args, env=env, binary=host)

    def write_node(self, node: Any) -> None:
        """(Re)write the node the double reads; the double picks up a change at its next enumeration."""
        tmp = self.node_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(node))
        tmp.replace(self.node_file)

    def __enter__(self) -> PluginNode:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc.proc.poll() is None:
            self.proc.finish()
        shutil.rmtree(self.root, ignore_errors=True)

    def ready(self) -> None:
        """Wait until the NVML backend's first inventory reached the fingerprint engine (its log line)."""
        from tests.waiting import wait_until

        wait_until(
            lambda: any(line in self.proc.stderr_text() for line in READY_LINES),
            "the NVML backend's first inventory (or its failure)",
            DEADLINE_S,
        )

    def fingerprint(self, want_devices: bool) -> list[dict[str, Any]]:
        """The first fingerprint that reflects the backend's first inventory."""
        if want_devices:
            fp = self.proc.wait_for(lambda e: e["event"] == "fingerprint" and e["n_devices"] > 0, DEADLINE_S)
            return list(fp["groups"])
        self.ready()
        self.proc.wait_for(lambda e: e["event"] == "stats", DEADLINE_S)  # a tick after the inventory
        fps = [e for e in self.proc.events if e.get("event") == "fingerprint"]
        return list(fps[-1]["groups"]) if fps else []

    def stats(self, ids: set[str]) -> dict[str, dict[str, Any]]:
        """The first stats holding every instance of ``ids`` with readings in (its "Stats age" a number)."""
        if not ids:
            return {}

        def complete(e: dict[str, Any]) -> bool:
            if e["event"] != "stats":
                return False
            got = {i: s for g in e["groups"] for i, s in g["instances"].items()}
            return ids <= set(got) and all("float_numerator" in got[i]["stats"]["Stats age"] for i in ids)

        event = self.proc.wait_for(complete, DEADLINE_S)
        return {i: s for g in event["groups"] for i, s in g["instances"].items()}

    def reserve(self, ids: list[str], tag: str) -> dict[str, Any]:
        self.proc.send({"op": "reserve", "ids": ids, "expect": "any", "tag": tag})
        return self.proc.wait_for(lambda e: e["event"] == "reserve" and e.get("tag") == tag, DEADLINE_S)


def _config_decodes(sets: dict[str, Any]) -> bool:
    import msgpack

    try:
        decode_config(msgpack.packb({k: v for k, v in sets.items() if k != "data_dir"}))
    except Exception:
        return False
    return True


def schema_defaults(proc: HostProcess) -> dict[str, str]:
    event = proc.wait_for(lambda e: e["event"] == "config_schema", DEADLINE_S)
    attrs = event["spec"]["object"]["attributes"]
    return {k: attrs[k]["default"]["default"]["literal"]["value"] for k in oracle.CONFIG_SCHEMA if k in attrs}


def run_plugin(scenario: Scenario, host: Path, expected: Expected, **node_options: Any) -> Observed:
    with PluginNode(scenario, host, **node_options) as node:
        defaults = schema_defaults(node.proc)
        if not node.expect_config_ok:
            run = node.proc.finish()
            return Observed([], {}, [], defaults, False, run)
        groups = node.fingerprint(want_devices=not scenario.empty)
        ids = {d["id"] for g in groups for d in g["devices"]}
        stats = node.stats(ids)
        reserves = [node.reserve(ids_, f"r{n}") for n, ids_ in enumerate(expected.reserve_ids)]
        run = node.proc.finish()
    return Observed(groups, stats, reserves, defaults, True, run)


# --- the official plugin's answers -------------------------------------------------------------


@dataclass
class Expected:
    fingerprint: oracle.Fingerprint
    stats: oracle.Stats
    reserve_ids: list[list[str]]
    reserves: list[dict[str, Any]]
    set_config_error: str


def expected(scenario: Scenario, nvml: Any = None) -> Expected:
    """The official plugin's answers on the scenario's double (or on ``nvml``, initialised: real NVML)."""
    if nvml is None:
        nvml = scenario.fake()
        nvml.nvmlInit()
    fake = nvml
    enabled = scenario.config.get("enabled", True) is not False
    fp = oracle.fingerprint(fake, scenario.config.get("ignored_gpu_ids", ()), enabled=enabled)
    ids = [d["id"] for g in fp.groups for d in g["devices"]]
    st = oracle.stats(fake, ids) if fp.groups else oracle.Stats()
    reserve_ids = [r(fp.groups) if callable(r) else list(r) for r in scenario.reserves]
    reserves = [oracle.reserve(r, ids, enabled) for r in reserve_ids]
    return Expected(fp, st, reserve_ids, reserves, oracle.set_config(scenario.config))


# --- items and decisions -----------------------------------------------------------------------


@dataclass(frozen=True)
class Decision:
    severity: str  # critical | high | medium | low
    summary: str
    anchor: str  # the section of docs/nvidia-dropin.md that says why


DECISIONS: dict[str, Decision] = {
    "pci-bus-id-spelling": Decision(
        "low",
        "hw_locality.pci_bus_id in sysfs form (0000:18:00.0), not NVML's 32-byte busId with NUL padding",
        "pci-bus-id",
    ),
    "official-fails-whole": Decision(
        "low",
        "where a reading fails that the official treats as fatal, it ends the stream with an error and Nomad stops "
        "the plugin; here the card stays, without that attribute (or N/A in stats)",
        "failed-readings",
    ),
    "no-empty-fingerprint": Decision(
        "low",
        "with no device the official sends no fingerprint at all (Nomad waits 50 s for it); here an empty one",
        "empty-node",
    ),
    "mig-stats": Decision(
        "low",
        "MIG-enabled cards' MIG instances have stats here (the parent's card readings, the instance's memory); "
        "the official sends none for them",
        "stats",
    ),
    "enabled-false": Decision(
        "low",
        "enabled = false keeps the stream open with no devices; the official ends it with 'device is not enabled'",
        "enabled-false",
    ),
    "reserve-unknown-wording": Decision(
        "low",
        "Reserve of IDs not in the last fingerprint fails as there, with a message that says why",
        "reserve",
    ),
}


@dataclass
class Item:
    scenario: str
    what: str
    expected: Any
    got: Any
    decision: str = ""  # "" with equal values: a match; a DECISIONS key: a documented difference
    undocumented: bool = False

    @property
    def matches(self) -> bool:
        return not self.decision and not self.undocumented


def _item(items: list[Item], scenario: str, what: str, want: Any, got: Any, decision: str = "") -> None:
    if want == got:
        items.append(Item(scenario, what, want, got))
    else:
        items.append(Item(scenario, what, want, got, decision, undocumented=not decision))


def _host_memory_close(want: dict[str, Any], got: dict[str, Any]) -> bool:
    """The host's used memory moves between the two reads: equal totals, used within 2 % of the total."""
    if set(want) != set(got) or want.get("int_denominator") != got.get("int_denominator"):
        return False
    total = max(1, int(want.get("int_denominator") or 100))
    return abs(int(want["int_numerator"]) - int(got["int_numerator"])) <= total * 2 // 100 + 1


def compare(scenario: Scenario, want: Expected, got: Observed, host_memory: bool | None = None) -> list[Item]:
    """Items of one scenario; ``host_memory``: a card's memory is the host's (its used part moves)."""
    items: list[Item] = []
    name = scenario.name
    if host_memory is None:
        host_memory = any("nvmlDeviceGetMemoryInfo" in g.errors for g in scenario.fake().gpus)
    # config: the schema defaults and whether the agent block loads
    for key, (_, default) in oracle.CONFIG_SCHEMA.items():
        _item(items, name, f"config {key} default", default, got.schema_defaults.get(key))
    _item(items, name, "config accepted", want.set_config_error == "", got.set_config_ok)
    if not got.set_config_ok:
        return items
    # fingerprint
    fp = want.fingerprint
    if fp.error:
        decision = "enabled-false" if fp.error == oracle.DISABLED_ERROR else "official-fails-whole"
        _item(items, name, "fingerprint", f"error: {fp.error}", _shape(got.groups), decision)
        return items
    if not fp.sent:
        _item(items, name, "fingerprint", "none sent", _shape(got.groups), "no-empty-fingerprint")
    ours = {g["name"]: g for g in got.groups}
    for group in fp.groups:
        mine = ours.get(group["name"])
        _item(items, name, f"group {group['name']}", True, mine is not None)
        if mine is None:
            continue
        _item(
            items,
            name,
            f"group {group['name']} device IDs in order",
            [d["id"] for d in group["devices"]],
            [d["id"] for d in mine["devices"]],
        )
        by_id = {d["id"]: d for d in mine["devices"]}
        for dev in group["devices"]:
            other = by_id.get(dev["id"], {})
            _item(items, name, f"device {dev['id']} healthy", True, other.get("healthy"))
            raw = dev["pci_bus_id"].rstrip("\0")
            same_address = normalize_pci_bus_id(raw) == other.get("pci_bus_id")
            _item(
                items,
                name,
                f"device {dev['id']} pci_bus_id",
                dev["pci_bus_id"],
                other.get("pci_bus_id"),
                "pci-bus-id-spelling" if same_address else "",
            )
        for attr in oracle.ATTRIBUTES:
            _item(
                items,
                name,
                f"group {group['name']} attribute {attr}",
                group["attributes"].get(attr),
                mine["attributes"].get(attr),
            )
    extra_groups = sorted(set(ours) - {g["name"] for g in fp.groups})
    _item(items, name, "groups the official does not send", [], extra_groups)
    # stats
    st = want.stats
    ours_stats = got.stats
    if st.error:
        _item(items, name, "stats", f"error: {st.error}", "stats sent", "official-fails-whole")
    else:
        for uuid, wanted in st.instances.items():
            mine = ours_stats.get(uuid)
            _item(items, name, f"stats {uuid}", True, mine is not None)
            if mine is None:
                continue
            for stat, value in wanted["stats"].items():
                theirs = mine["stats"].get(stat)
                if host_memory and stat in ("Memory state", "Memory utilization") and theirs is not None:
                    if stat == "Memory state" and _host_memory_close(value, theirs):
                        theirs = value
                    if (
                        stat == "Memory utilization"
                        and abs(theirs.get("int_numerator", -99) - value["int_numerator"]) <= 2
                    ):
                        theirs = value
                _item(items, name, f"stats {uuid} {stat}", value, theirs)
            summary = mine.get("summary")
            if host_memory and summary is not None and _host_memory_close(wanted["summary"], summary):
                summary = wanted["summary"]
            _item(items, name, f"stats {uuid} summary", wanted["summary"], summary)
        for uuid in sorted(set(ours_stats) - set(st.instances)):
            _item(items, name, f"stats {uuid}", "none", "sent", "mig-stats")
    # reserve
    for ids, wanted, event in zip(want.reserve_ids, want.reserves, got.reserves, strict=True):
        label = f"reserve {','.join(ids) or '(none)'}"
        _item(items, name, f"{label} ok", wanted["ok"], event["ok"])
        if wanted["ok"] and event["ok"]:
            _item(
                items,
                name,
                f"{label} {oracle.VISIBLE_DEVICES}",
                wanted["envs"].get(oracle.VISIBLE_DEVICES),
                event["envs"].get(oracle.VISIBLE_DEVICES),
            )
        elif not wanted["ok"] and not event["ok"]:
            message = str(event.get("message", ""))
            decision = "" if message.startswith(wanted["message"]) else "reserve-unknown-wording"
            _item(
                items, name, f"{label} error", wanted["message"], message if decision else wanted["message"], decision
            )
    return items


def _shape(groups: list[dict[str, Any]]) -> str:
    return f"{len(groups)} groups, {sum(len(g['devices']) for g in groups)} devices"


def summarize(items: list[Item]) -> dict[str, Any]:
    """Counts for the report: items, matches, documented differences by decision, undocumented ones."""
    by_decision: dict[str, int] = {}
    for item in items:
        if item.decision:
            by_decision[item.decision] = by_decision.get(item.decision, 0) + 1
    return {
        "items": len(items),
        "match": sum(1 for i in items if i.matches),
        "documented": by_decision,
        "undocumented": [
            f"{i.scenario}: {i.what}: official {i.expected!r}, ours {i.got!r}" for i in items if i.undocumented
        ],
    }
