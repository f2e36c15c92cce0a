"""A task's ``resources { numa { ... } }`` decided as Nomad decides it.

Community Edition refuses any requested ``numa`` block at submission (``jobNumaHook.Validate``,
nomad/job_endpoint_hook_numa_ce.go). Both editions validate it (``Resources.Validate``,
nomad/structs/structs.go; ``NUMA.Validate``, nomad/structs/numa.go). Enterprise then tries the
node's NUMA nodes one at a time (scheduler/feasible/rank.go) and fills each ``device`` block only
with instances that ``memoryNodeMatcher.Matches`` (scheduler/feasible/device.go): a group whose whole
``vendor/type/name`` is listed in ``devices`` offers only instances whose ``pci_bus_id`` equals
(``equalBusID``) a key of the host's bus -> NUMA map on that node; every other group is unrestricted.
The map is the kernel's (``Sysfs.discoverPCI``, client/lib/numalib/detect_linux.go): each entry of
``/sys/bus/pci/devices`` with a non-negative ``numa_node``. Which NUMA nodes Enterprise offers for
the cores is not public code, so the cores are named, not decided.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nomad_plugin.jobspec.evaluate import NOT_PLACED, PLACE, REFUSE, UNKNOWN, RequestVerdict
from nomad_plugin.jobspec.parse import ParsedJob, dicts
from nomad_plugin.nomad_view.types import DeviceGroup, Style
from nomad_plugin.util.hcl import is_expression, labelled, plain, unlabelled

EDITIONS = ("ce", "ent")
AFFINITIES = ("none", "prefer", "require")
#: The Nomad releases that place devices by NUMA node (CHANGELOG.md, GH-27177).
FIXED_IN = "1.11.1 and 1.10.7 Enterprise"


@dataclass(frozen=True)
class NumaAsk:
    """One task's ``numa`` block, with what Nomad validates it against."""

    group: str
    task: str
    affinity: str
    devices: tuple[str, ...]
    cores: int
    device_names: tuple[str, ...]  # the task's own device blocks
    unsupported: tuple[str, ...] = ()

    @property
    def where(self) -> str:
        return f'group "{self.group}" task "{self.task}"'

    @property
    def requested(self) -> bool:
        """``NUMA.Requested``: any affinity but "none" (an invalid one too)."""
        return self.affinity != "none"

    def problems(self) -> list[str]:
        """``Resources.Validate``'s errors for the block, in Nomad's words."""
        errors = [
            f'numa device "{name}" not requested as task resource'
            for name in self.devices
            if name not in self.device_names
        ]
        if self.affinity not in AFFINITIES:
            errors.append("numa affinity must be one of none, prefer, or require")
        return errors


@dataclass
class NumaResult:
    outcome: str = PLACE
    lines: list[str] = field(default_factory=list)

    def add(self, outcome: str, line: str) -> None:
        order = (REFUSE, UNKNOWN, NOT_PLACED, PLACE)
        self.outcome = min(self.outcome, outcome, key=order.index)
        self.lines.append(line)


def _text(raw: Any, key: str, unsupported: list[str]) -> str:
    if is_expression(raw):
        unsupported.append(f"numa {key} = {raw}: check-job does not evaluate variables or functions")
        return ""
    return str(plain(raw)) if raw is not None else ""


def read_numa(job: ParsedJob) -> list[NumaAsk]:
    """Every task's ``numa`` block in a job as its reader left it: Nomad's API form, or the evaluated HCL2 job block."""
    if job.api_form is not None:
        return _json_asks(job.api_form)
    if job.hcl_body is None:
        return []
    asks = []
    body = job.hcl_body
    for group_name, group in labelled(body.get("group", [])):
        for task_name, task in labelled(group.get("task", [])):
            for resources in unlabelled(task.get("resources", [])):
                names = tuple(name for name, _ in labelled(resources.get("device", [])))
                for block in unlabelled(resources.get("numa", [])):
                    unsupported: list[str] = []
                    affinity = _text(block.get("affinity"), "affinity", unsupported) or "none"
                    raw = block.get("devices")
                    devices = (
                        tuple(_text(d, "devices", unsupported) for d in raw if d is not None)
                        if (isinstance(raw, list))
                        else ()
                    )
                    cores = plain(resources.get("cores"))
                    asks.append(NumaAsk(
                        group_name, task_name, affinity, devices, cores if isinstance(cores, int) else 0, names,
                        tuple(unsupported),
                    ))  # fmt: skip
    return asks


def _json_asks(job: dict[str, Any]) -> list[NumaAsk]:
    asks = []
    for group in dicts(job.get("TaskGroups")):
        for task in dicts(group.get("Tasks")):
            raw = task.get("Resources")
            resources: dict[str, Any] = raw if isinstance(raw, dict) else {}
            numa = resources.get("NUMA")
            if not isinstance(numa, dict):
                continue
            names = tuple(str(d.get("Name", "")) for d in dicts(resources.get("Devices")))
            cores = resources.get("Cores")
            asks.append(NumaAsk(
                str(group.get("Name", "")), str(task.get("Name", "")), str(numa.get("Affinity") or "none"),
                tuple(str(d) for d in numa.get("Devices") or ()), cores if isinstance(cores, int) else 0, names,
            ))  # fmt: skip
    return asks


def sysfs_devices(sysfs_root: str = "/") -> Path:
    return Path(sysfs_root) / "sys" / "bus" / "pci" / "devices"


def bus_numa_map(sysfs_root: str = "/") -> dict[str, int]:
    """The kernel's PCI bus -> NUMA node map as numalib reads it (entries with a node below 0 left out)."""
    found: dict[str, int] = {}
    base = sysfs_devices(sysfs_root)
    try:
        entries = sorted(base.iterdir())
    except OSError:
        return found
    for entry in entries:
        try:
            node = int((entry / "numa_node").read_text().strip())
        except (OSError, ValueError):
            continue
        if node >= 0:
            found[entry.name] = node
    return found


def node_bus_map(doc: Any) -> dict[str, int]:
    """The same map as the servers hold it: ``NodeResources.Processors.Topology.BusAssociativity`` of
    the node's record (``GET /v1/node/<id>``; ``nomad node status -json`` prints the API's node, without it)."""
    if isinstance(doc, list) and len(doc) == 1:
        doc = doc[0]
    found: Any = doc
    for key in ("NodeResources", "Processors", "Topology", "BusAssociativity"):
        found = found.get(key) if isinstance(found, dict) else None
    if not isinstance(found, dict):
        return {}
    return {str(k): v for k, v in found.items() if isinstance(v, int) and not isinstance(v, bool) and v >= 0}


def equal_bus_id(a: str, b: str) -> bool:
    """``equalBusID``: equal, or equal once leading zeros are trimmed (the domain's width may differ)."""
    return a == b or a.lstrip("0") == b.lstrip("0")


def _node_of(bus_id: str, buses: Mapping[str, int]) -> int | None:
    for key, node in buses.items():  # Nomad ranges over a Go map: the first equal key decides
        if bus_id and equal_bus_id(key, bus_id):
            return node
    return None


def _fill(verdicts: Sequence[RequestVerdict], bound: set[str], node: int, buses: Mapping[str, int]) -> tuple[bool, str]:
    """Whether every device block of the task finds its count of free healthy instances with the NUMA
    node ``node`` asked of the bound groups; else what fell short."""
    taken: set[str] = set()
    for verdict in verdicts:
        request = verdict.request
        counts = []
        for group in (g.group for g in verdict.groups if g.eligible):
            usable = [
                d.id
                for d in group.devices
                if d.healthy
                and d.id not in taken
                and (group.full_name not in bound or _node_of(d.pci_bus_id, buses) == node)
            ]
            if len(usable) >= request.count:
                taken.update(usable[: request.count])
                break
            counts.append(f"{group.full_name}: {len(usable)}")
        else:
            return False, f'device "{request.name}" needs {request.count} ({", ".join(counts) or "no eligible group"})'
    return True, ""


def decide_numa(
    asks: Sequence[NumaAsk],
    verdicts: Sequence[RequestVerdict],
    groups: Sequence[DeviceGroup],
    edition: str,
    buses: Mapping[str, int],
    source: str = "/sys/bus/pci/devices",
) -> NumaResult | None:
    """Nomad's answer to the job's ``numa`` blocks on this node; None when the job has none."""
    if not asks:
        return None
    result = NumaResult()
    for ask in asks:
        for problem in ask.problems():
            result.add(REFUSE, f"INVALID {ask.where}: {problem}")
        for item in ask.unsupported:
            result.add(UNKNOWN, f"CANNOT TELL {ask.where}: {item}")
        if not ask.requested or ask.problems():
            continue
        if edition != "ent":
            result.add(
                REFUSE,
                f"REFUSED {ask.where}: numa scheduling requires Nomad Enterprise (Community Edition refuses any "
                'numa block whose affinity is not "none"; --nomad-edition ent decides it as Enterprise would)',
            )
            continue
        _decide_enterprise(ask, [v for v in verdicts if (v.request.group, v.request.task) == (ask.group, ask.task)],
                           groups, buses, source, result)  # fmt: skip
    if edition == "ent" and any(ask.requested and not ask.problems() for ask in asks):
        result.lines.append(
            f"older Nomad: before {FIXED_IN}, Enterprise did not keep devices on the cores' NUMA node "
            "(the numa block's devices were dropped at submission)"
        )
    return result


def _decide_enterprise(
    ask: NumaAsk,
    verdicts: list[RequestVerdict],
    groups: Sequence[DeviceGroup],
    buses: Mapping[str, int],
    source: str,
    result: NumaResult,
) -> None:
    bound = set(ask.devices)
    names = {g.full_name for g in groups}
    cores = f"{ask.cores} cores" if ask.cores else "its cores (the numa block needs `cores`)"
    for name in ask.devices:
        if name not in names:
            result.lines.append(
                f'note {ask.where}: numa device "{name}" ties no card to the NUMA node: Nomad matches the '
                "group's whole vendor/type/name; name the device block and the numa entry "
                + (" or ".join(f'"{n}"' for n in sorted(names)[:3]) or "by the group's full name")
            )
    restricted = [v for v in verdicts if any(g.eligible and g.group.full_name in bound for g in v.groups)]
    if not restricted:
        result.add(PLACE, f"NUMA {ask.where}: affinity {ask.affinity}; Enterprise picks {cores} on one NUMA node, "
                          "no card is tied to it (check-job does not read CPU cores)")  # fmt: skip
        return
    wanted = {d.pci_bus_id for v in restricted for g in v.groups for d in g.group.devices if d.pci_bus_id}
    if not any(_node_of(bus, buses) is not None for bus in wanted):
        result.add(UNKNOWN, f"CANNOT TELL {ask.where}: none of the cards' PCI addresses is in {source}, the "
                            "kernel's bus -> NUMA map Nomad reads (run it on the node, give --sysfs-root, or --node "
                            "with the node's record from GET /v1/node/<id>)")  # fmt: skip
        return
    short, fitting = [], []
    for node in sorted(set(buses.values())):
        fits, why = _fill(verdicts, bound, node, buses)
        if fits:
            fitting.append(str(node))
        else:
            short.append(f"node {node}: {why}")
    if fitting:
        nodes = " or ".join(fitting)
        result.add(PLACE, f"NUMA {ask.where}: affinity {ask.affinity}: the cards fit on NUMA node {nodes}, with "
                          f"{cores} on the same node (check-job does not read CPU cores)")  # fmt: skip
        return
    if ask.affinity == "require":
        result.add(NOT_PLACED, f"NOT PLACED {ask.where}: affinity require: no NUMA node holds the cards ("
                               + "; ".join(short) + ")")  # fmt: skip
    else:
        result.add(UNKNOWN, f"CANNOT TELL {ask.where}: affinity prefer and no NUMA node holds the cards ("
                            + "; ".join(short) + "); where Enterprise places them then is not public code")  # fmt: skip


def merged(outcome: str, result: NumaResult | None) -> str:
    """The job's outcome once its numa blocks are decided: a refusal wins, then the first verdict short of placing."""
    if result is None:
        return outcome
    if REFUSE in (outcome, result.outcome):
        return REFUSE
    return result.outcome if outcome == PLACE else outcome


def numa_text(result: NumaResult | None, style: Style) -> list[str]:
    if result is None:
        return []
    colour = {PLACE: "green", NOT_PLACED: "red", REFUSE: "red", UNKNOWN: "yellow"}[result.outcome]
    return [style("numa block", "bold"), *(f"  {style(line, colour)}" for line in result.lines), ""]


def numa_json(result: NumaResult | None) -> dict[str, Any] | None:
    return None if result is None else {"outcome": result.outcome, "lines": list(result.lines)}
