"""The simulated XDM node: cards, health, grants, flags, and the RPC logic.

Transport-free: every RPC method takes a request message and returns a
response message, or raises :class:`~nomad_plugin.sim.allocation.Refusal`
(the server turns that into an in-band status or a gRPC status, per the
error mode). All state sits behind one lock; changes are pushed to the
ListAndWatch subscribers' queues.
"""

from __future__ import annotations

import json
import queue
import random
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from nomad_plugin._proto.lingjun import api_outer_pb2 as pb
from nomad_plugin._proto.lingjun import config_service_pb2 as cfg
from nomad_plugin.goplugin.logging import get_logger
from nomad_plugin.model.metrics import GRANT_LABEL, METRIC_IDS, METRIC_NAMES, MetricSample
from nomad_plugin.sim import allocation as allocate
from nomad_plugin.sim.allocation import (
    STYLES,
    Ask,
    CardView,
    GrantedSlot,
    GrantRecord,
    PersistentState,
    Refusal,
    UsageIndex,
    build_spec,
    load_state,
    mig_profile_gib,
    save_state,
)
from nomad_plugin.sim.profiles import TOPOLOGY_VARIANTS, CardSpec
from nomad_plugin.sim.schema import SCHEMAS, Drift, parse_drift

log = get_logger("sim")

# Put into a subscriber queue to end its stream with UNAVAILABLE.
CLOSE = object()


class SimCore:
    """Mutable node state plus the RPC behaviour that reads and changes it."""

    def __init__(
        self,
        profile: str,
        cards: list[CardSpec],
        options: SimOptions,
        state_file: Path | None,
        real_reader: RealReader | None = None,
    ) -> None:
        self.profile = profile
        self.cards = {c.minor: c for c in cards}
        self.options = options
        self.state_file = state_file
        self.lock = threading.RLock()
        self.present = set(self.cards)
        self.health: dict[int, tuple[bool, str]] = {m: (True, "") for m in self.cards}
        self.state: PersistentState = load_state(state_file, options.enabled)
        self.usage = UsageIndex(self.state.grants.values())  # kept in step with state.grants
        self.drift: Drift = parse_drift(options.drift)
        self.latency: dict[str, float] = {}
        self.hang_until = 0.0
        self.exporter_state = "running"
        self.config_fail = False
        self.calls: dict[str, int] = {}  # RPC name -> calls received (Enable/Disable included)
        self.metrics = MetricsModel(self.cards, seed=options.seed, real_reader=real_reader)
        self._subscribers: set[queue.Queue[object]] = set()
        self._snapshot: list[MetricSample] = []
        self._snapshot_gen = 0
        self._last_collect_ms = 0
        self._metrics_dirty = True
        self.metrics_cond = threading.Condition(self.lock)

    # ------------------------------------------------------------ state changes
    def reload(self) -> None:
        """Read persisted grants back, as a restarted XDM would."""
        if self.state_file is not None:
            with self.lock:
                self.state = load_state(self.state_file, self.options.enabled)
                self.usage = UsageIndex(self.state.grants.values())
                self._metrics_dirty = True

    def _persist(self) -> None:
        save_state(self.state_file, self.state)

    def set_health(self, minor: int, healthy: bool, reason: str = "") -> None:
        with self.lock:
            self._card(minor)
            self.health[minor] = (healthy, reason)
            self._metrics_dirty = True
        log.info("card %d -> %s%s", minor, "Healthy" if healthy else "Unhealthy", f" ({reason})" if reason else "")
        self.push()

    def remove_device(self, minor: int) -> None:
        with self.lock:
            self._card(minor)
            self.present.discard(minor)
            self._metrics_dirty = True
        log.info("card %d removed", minor)
        self.push()

    def add_device(self, minor: int) -> None:
        with self.lock:
            self._card(minor)
            self.present.add(minor)
            self._metrics_dirty = True
        log.info("card %d added", minor)
        self.push()

    def _card(self, minor: int) -> CardSpec:
        card = self.cards.get(minor)
        if card is None:
            raise ValueError(f"minor: no card {minor} in profile {self.profile} (0..{len(self.cards) - 1})")
        return card

    def count_call(self, rpc: str) -> None:
        with self.lock:
            self.calls[rpc] = self.calls.get(rpc, 0) + 1

    def set_topology_level(self, name: str, value: str | None, minors: list[int] | None = None) -> None:
        """Set a rack or network level (a string ``topo<N>``) on cards, or remove it (``value`` None).

        What a re-cabled node, or XDM learning its place in the network, looks like on the wire:
        the next ListAndWatch push carries the new topology JSON.
        """
        if not name.strip():
            raise ValueError("level: empty name")
        with self.lock:
            chosen = sorted(self.cards) if not minors else [self._card(m).minor for m in minors]
            for minor in chosen:
                card = self.cards[minor]
                self.cards[minor] = replace(card, topology_json=_with_level(card.topology_json, name, value))
        log.info("topology level %s -> %s on cards %s", name, value if value is not None else "(removed)", chosen)
        self.push()

    def set_exporter_state(self, state: str) -> None:
        check_choice("exporter state", state, EXPORTER_STATES)
        with self.lock:
            self.exporter_state = state

    def grants(self) -> dict[str, GrantRecord]:
        with self.lock:
            return dict(self.state.grants)

    # ------------------------------------------------------------ ListAndWatch
    def device_list(self) -> pb.ListAndWatchResponse:
        with self.lock:
            devices = []
            for minor in sorted(self.present):
                card = self.cards[minor]
                healthy, reason = self.health[minor]
                extender = {"topology": card.topology_json}
                if not healthy and reason:
                    extender["healthReason"] = reason
                devices.append(
                    pb.Device(
                        minor=minor,
                        uuid=card.uuid,
                        model=card.model,
                        xpuType=card.xpu_type,
                        health="Healthy" if healthy else "Unhealthy",
                        totalMemory=card.memory_mib,
                        totalCore=card.total_core,
                        pciBusId=card.pci_bus_id,
                        extenderResources=extender,
                    )
                )
            return pb.ListAndWatchResponse(devices=devices)

    def subscribe(self) -> queue.Queue[object]:
        q: queue.Queue[object] = queue.Queue()
        with self.lock:
            self._subscribers.add(q)
        return q

    def unsubscribe(self, q: queue.Queue[object]) -> None:
        with self.lock:
            self._subscribers.discard(q)

    def push(self) -> None:
        """Send the complete device list to every ListAndWatch subscriber."""
        with self.lock:
            snapshot = self.device_list()
            for q in self._subscribers:
                q.put(snapshot)

    def close_streams(self) -> None:
        with self.lock:
            for q in self._subscribers:
                q.put(CLOSE)
            self.metrics_cond.notify_all()

    def subscriber_count(self) -> int:
        with self.lock:
            return len(self._subscribers)

    # ------------------------------------------------------------ resource RPCs
    def list_xpu_types(self, _req: pb.XPUTypeRequest) -> pb.XPUTypeResponse:
        return pb.XPUTypeResponse(xpuTypes=sorted({c.xpu_type for c in self.cards.values()}))

    def allocate(self, req: pb.AllocateRequest) -> pb.AllocateResponse:
        asks = [
            Ask(d.minor if d.HasField("minor") and not (self.drift.minor_omit_zero and d.minor == 0) else None,
                d.core, d.memory, d.slice)
            for d in req.devices
        ]  # fmt: skip
        key = json.dumps(
            {"devices": [[a.minor, a.core, a.memory, a.slice] for a in asks], "annotations": dict(req.annotations)},
            sort_keys=True,
        )
        with self.lock:
            if not req.id:
                raise Refusal("INVALID_ARGUMENT", "id: empty; every allocation needs an id")
            old = self.state.grants.get(req.id)
            if old is not None:
                if self.options.duplicate_id_mode == "idempotent" and old.request_key == key:
                    return self._response(old)
                raise Refusal("ALREADY_EXISTS", f"id: allocation {req.id} already exists")
            if not self.state.enabled and self.options.disabled_effect == "refuse":
                raise Refusal("FAILED_PRECONDITION", "Runtime Kit is disabled on this node (config-daemon)")
            if not asks and not self.options.cpu_container:
                raise Refusal("INVALID_ARGUMENT", "devices: empty")
            views = {
                m: CardView(
                    m, self.cards[m].memory_gib, self.cards[m].mig_capable, self.health[m][0], self.cards[m].model
                )
                for m in self.present
            }
            placements = allocate.plan(views, self.usage, asks, mig_placement=self.options.mig_placement)
            slots = tuple(
                GrantedSlot(
                    minor=p.minor,
                    uuid=self.cards[p.minor].uuid,
                    core=p.core,
                    memory=p.memory,
                    slice=p.slice,
                    mig_uuid=f"MIG-{uuid.uuid5(uuid.NAMESPACE_URL, f'{self.cards[p.minor].uuid}/{req.id}/{i}')}"
                    if p.slice
                    else "",
                )
                for i, p in enumerate(placements)
            )
            first = asks[0] if asks else Ask(None)
            record = GrantRecord(
                id=req.id,
                minors=tuple(p.minor for p in placements),
                core=first.core,
                memory=first.memory,
                slice=first.slice,
                created=time.time(),
                devices=slots,
                annotations=dict(req.annotations),
                request_key=key,
            )
            self.state.grants[req.id] = record
            self.usage.add(record)
            self._metrics_dirty = True
            self._persist()
        if self.options.push_on_allocation:
            self.push()
        return self._response(record)

    def _response(self, record: GrantRecord) -> pb.AllocateResponse:
        spec = build_spec(self.options.style, record.id, list(record.devices), self.cards)
        annotations = {**record.annotations, **spec.annotations}
        return pb.AllocateResponse(
            status=0,
            id=record.id,
            devices=[
                pb.AllocatedDevice(
                    minor=s.minor, uuid=s.uuid, core=s.core, memory=s.memory, slice=s.slice, migUuid=s.mig_uuid
                )
                for s in record.devices
            ],
            envs=spec.envs,
            mounts=[pb.Mount(containerPath=c, hostPath=h, readOnly=ro) for c, h, ro in spec.mounts],
            deviceSpecs=[pb.DeviceSpec(containerPath=n, hostPath=n, permissions="rw") for n in spec.device_nodes],
            annotations=annotations,
        )

    def release(self, req: pb.ReleaseRequest) -> pb.ReleaseResponse:
        with self.lock:
            if not req.id:
                raise Refusal("INVALID_ARGUMENT", "id: empty")
            gone = self.state.grants.pop(req.id, None)
            if gone is None:
                if self.options.release_unknown == "ok":
                    return pb.ReleaseResponse(status=0, message=f"allocation {req.id} not found (nothing to do)")
                raise Refusal("NOT_FOUND", f"id: no allocation {req.id}")
            self.usage.remove(gone)
            self._metrics_dirty = True
            self._persist()
        if self.options.push_on_allocation:
            self.push()
        return pb.ReleaseResponse(status=0)

    # ------------------------------------------------------------ monitoring RPCs
    def gpu_info(self, req: pb.ListGpuInfoRequest) -> pb.ListGpuInfoResponse:
        wanted = set(req.minors)
        with self.lock:
            infos = [
                pb.GpuInfo(
                    minor=c.minor,
                    uuid=c.uuid,
                    model=c.model,
                    driverVersion=c.driver_version,
                    vendor=c.vendor,
                    xpuType=c.xpu_type,
                    totalMemory=c.memory_mib,
                    pciBusId=c.pci_bus_id,
                    numaNode=c.numa_node,
                    firmwareVersion=f"fw-{c.driver_version}",
                    sdkVersion=c.sdk_version,
                    serialNumber=c.serial_number,
                    migEnabled=c.mig_capable,
                )
                for m, c in sorted(self.cards.items())
                if m in self.present and (not wanted or m in wanted)
            ]
        return pb.ListGpuInfoResponse(gpuInfos=infos)

    def collect(self) -> None:
        """One exporter collection (the collector thread calls this every interval)."""
        with self.lock:
            if self.exporter_state != "running":
                return
            now_ms = int(time.time() * 1000)
            health = {m: h for m, (h, _) in self.health.items()}
            self._snapshot = self.metrics.collect(now_ms, self.present, health, self.state.grants.values())
            self._snapshot_gen += 1
            self._last_collect_ms = now_ms
            self._metrics_dirty = False
            self.metrics_cond.notify_all()

    def snapshot(self) -> tuple[int, list[MetricSample]]:
        with self.lock:
            if self._metrics_dirty or not self._snapshot:
                self.collect()
            return self._snapshot_gen, list(self._snapshot)

    def filter_metrics(self, req: pb.ExporterDataRequest, samples: list[MetricSample]) -> pb.ExporterDataResponse:
        uuids = {c.uuid: m for m, c in self.cards.items()}
        if self.options.unknown_filter == "error":
            bad = [d for d in req.devices if d not in uuids and not (d.isdigit() and int(d) in self.present)]
            bad_ids = [i for i in req.metricIds if i not in METRIC_NAMES]
            if bad or bad_ids:
                raise Refusal("NOT_FOUND", f"filter: unknown device {bad[:1]} or metric id {bad_ids[:1]}")
        chosen = filter_samples(samples, req.devices, req.metricIds, uuids)
        return pb.ExporterDataResponse(
            dataList=[
                pb.MetricData(
                    device=s.device,
                    metricId=s.metric_id,
                    value=s.value,
                    timestamp=s.timestamp_ms,
                    metricName=s.name,
                    labels=dict(s.labels),
                )
                for s in chosen
            ]
        )

    def data_list(self, req: pb.ExporterDataRequest) -> pb.ExporterDataResponse:
        return self.filter_metrics(req, self.snapshot()[1])

    def exporter_config(self, _req: pb.ExporterGetConfigRequest) -> pb.ExporterGetConfigResponse:
        return pb.ExporterGetConfigResponse(
            collectIntervalMs=self.options.collect_interval_ms,
            metricIds=sorted(METRIC_NAMES),
            config={"profile": self.profile, "style": self.options.style, "simulator": "xdm-sim"},
        )

    def exporter_status(self, _req: pb.ExporterGetStatusRequest) -> pb.ExporterGetStatusResponse:
        with self.lock:
            return pb.ExporterGetStatusResponse(
                running=self.exporter_state == "running",
                state=self.exporter_state,
                lastCollectTimestamp=self._last_collect_ms,
                version=self.options.version,
                message="" if self.exporter_state != "error" else "collector failed (simulated)",
            )

    # ------------------------------------------------------------ config daemon
    # What XDM does while disabled is not documented (docs/xdm-risks.md, "Runtime Kit disabled"):
    # the simulator takes the safest reading. Cards stay listed with their health, grants already
    # made are kept and can be released, only new allocations are refused (``disabled_effect``
    # "refuse", the default; "none" allocates anyway). Enable and Disable are idempotent.
    def set_enabled(self, enabled: bool) -> bool:
        """Set the flag; True when it changed."""
        with self.lock:
            changed = self.state.enabled != enabled
            self.state.enabled = enabled
            self._persist()
        log.info("Runtime Kit %s%s", "enabled" if enabled else "disabled", "" if changed else " (already)")
        return changed

    def enable(self, _req: cfg.EnableRequest) -> cfg.EnableResponse:
        if self.config_fail:
            return cfg.EnableResponse(success=False, message="enable failed (simulated)")
        changed = self.set_enabled(True)
        return cfg.EnableResponse(success=True, message="enabled" if changed else "already enabled")

    def disable(self, _req: cfg.DisableRequest) -> cfg.DisableResponse:
        if self.config_fail:
            return cfg.DisableResponse(success=False, message="disable failed (simulated)")
        changed = self.set_enabled(False)
        return cfg.DisableResponse(success=True, message="disabled" if changed else "already disabled")

    def query_status(self, _req: cfg.QueryStatusRequest) -> cfg.QueryStatusResponse:
        with self.lock:
            return cfg.QueryStatusResponse(enabled=self.state.enabled)


def _with_level(topology_json: str, name: str, value: str | None) -> str:
    """One card's topology JSON with level ``name`` set to the string ``value`` (added if absent) or removed."""
    try:
        doc: Any = json.loads(topology_json)
    except ValueError:
        doc = {}
    levels = [lvl for lvl in (doc.get("levels") or []) if isinstance(lvl, dict)] if isinstance(doc, dict) else []
    kept = [lvl for lvl in levels if lvl.get("name") != name]
    if value is not None:
        old = next((lvl for lvl in levels if lvl.get("name") == name), None)
        numbers = [int(lvl["level"]) for lvl in levels if isinstance(lvl.get("level"), int)]
        number = int(old["level"]) if old is not None and isinstance(old.get("level"), int) else max([29, *numbers]) + 1
        kept.append({"level": number, "name": name, f"topo{number}": value})
        kept.sort(key=lambda lvl: lvl["level"] if isinstance(lvl.get("level"), int) else 0)
    return json.dumps({"levels": kept})


# ------------------------------------------------------------ (from options.py)
# Simulator options (the ``**options`` of :class:`~nomad_plugin.sim.Simulator`).


ERROR_MODES = ("inband", "grpc")
DUPLICATE_ID_MODES = ("reject", "idempotent")
RELEASE_UNKNOWN_MODES = ("not-found", "ok")
DISABLED_EFFECTS = ("refuse", "none")
UNKNOWN_FILTER_MODES = ("empty", "error")
EXPORTER_STATES = ("running", "stopped", "error")


@dataclass
class SimOptions:
    """Behaviour switches; every one has the default a plain ``xdm-sim`` run uses."""

    style: str = "env+devices"  # container spec style in Allocate responses
    collect_interval_ms: int = 1000  # exporter collection interval
    initial_push: bool = True  # ListAndWatch sends the list at once on subscribe
    push_on_allocation: bool = False  # ListAndWatch pushes after Allocate/Release too
    repush_interval: float = 0.0  # seconds; > 0 re-sends the list periodically
    error_mode: str = "inband"  # "inband" status/message or "grpc" status codes
    duplicate_id_mode: str = "reject"
    release_unknown: str = "not-found"
    disabled_effect: str = "refuse"  # what Disable does to Allocate
    enabled: bool = True  # initial config-daemon flag (a state file overrides it)
    mig_placement: bool = True  # apply NVIDIA MIG placement (memory eighths) rules
    cpu_container: bool = True  # device-less requests succeed with an empty grant
    unknown_filter: str = "empty"  # exporter filter naming unknown devices/metrics
    topology_variant: str = "normal"  # "normal", "extra-level", "malformed"
    drift: str | None = None
    seed: int = 0  # metrics RNG seed
    control: bool = True  # serve the JSON-lines control socket
    version: str = "v1.13.0-sim"
    nvml_mirror: bool = False
    schema: str = "builtin"  # served schema: builtin, renumbered or foreign (nomad_plugin/sim/schema.py)
    reflection: bool = False  # serve gRPC server reflection (off: like the sim always was, and R1's likely case)

    def __post_init__(self) -> None:
        for name, allowed in (
            ("style", STYLES),
            ("error_mode", ERROR_MODES),
            ("duplicate_id_mode", DUPLICATE_ID_MODES),
            ("release_unknown", RELEASE_UNKNOWN_MODES),
            ("disabled_effect", DISABLED_EFFECTS),
            ("unknown_filter", UNKNOWN_FILTER_MODES),
            ("topology_variant", TOPOLOGY_VARIANTS),
            ("schema", SCHEMAS),
        ):
            check_choice(name, getattr(self, name), allowed)
        if self.collect_interval_ms < 10:
            raise ValueError(f"collect_interval_ms: {self.collect_interval_ms} is below 10 ms")
        if self.repush_interval < 0:
            raise ValueError(f"repush_interval: {self.repush_interval} is negative")

    @classmethod
    def from_kwargs(cls, options: dict[str, Any]) -> SimOptions:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(options) - known)
        if unknown:
            raise TypeError(f"Simulator: unknown option {unknown[0]!r} (known: {', '.join(sorted(known))})")
        return cls(**options)


def check_choice(name: str, value: object, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"{name}: {value!r} is not one of {', '.join(allowed)}")


# ------------------------------------------------------------ (from metrics.py)
# Simulated exporter metrics: plausible, drifting, consistent with grants.
#
# Values move by a seeded random walk at every collection, stay inside the
# card's capacities (used <= total, power <= limit) and agree with the grants:
# each share or MIG grant gets its own samples labelled with
# ``GRANT_LABEL`` (its allocation id), whose memory never exceeds what was
# granted, and the card's memory is the sum of its grants' plus a little
# driver overhead.


# A hook that returns real readings for a card (NVML mirror): metric id -> value.
RealReader = Callable[[CardSpec], Mapping[int, float]]


@dataclass
class _CardState:
    util: float = 2.0
    overhead_mib: float = 512.0
    temp: float = 34.0
    xid: int = 0
    ecc_sbe: int = 0
    was_healthy: bool = True


@dataclass
class _GrantState:
    util: float = 0.0
    used_fraction: float = 0.3


@dataclass
class MetricsModel:
    cards: Mapping[int, CardSpec]
    seed: int = 0
    real_reader: RealReader | None = None
    _rng: random.Random = field(init=False)
    _cards: dict[int, _CardState] = field(init=False, default_factory=dict)
    _grants: dict[tuple[str, int], _GrantState] = field(init=False, default_factory=dict)

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)  # noqa: S311 - simulated readings, not secrets

    def _walk(self, value: float, step: float, low: float, high: float) -> float:
        return min(high, max(low, value + self._rng.uniform(-step, step)))

    def collect(
        self,
        now_ms: int,
        present: Iterable[int],
        health: Mapping[int, bool],
        grants: Iterable[GrantRecord],
    ) -> list[MetricSample]:
        """One full snapshot (every present card, every metric, every share/MIG grant)."""
        grants = list(grants)
        samples: list[MetricSample] = []
        live_keys: set[tuple[str, int]] = set()
        for minor in sorted(present):
            card = self.cards[minor]
            state = self._cards.setdefault(minor, _CardState(temp=30.0 + self._rng.uniform(0, 8)))
            healthy = health.get(minor, True)
            if state.was_healthy and not healthy:
                state.xid += 1
            state.was_healthy = healthy
            on_card = [g for g in grants if minor in g.minors]
            grant_util = 0.0
            grant_mem = 0.0
            for grant in on_card:
                if grant.kind not in ("tdm", "mig"):
                    continue
                key = (grant.id, minor)
                live_keys.add(key)
                gs = self._grants.setdefault(key, _GrantState(util=self._rng.uniform(20, 60)))
                cap_core = float(grant.core) if grant.core > 0 else 100.0
                gs.util = self._walk(gs.util, 8.0, 0.0, cap_core)
                gs.used_fraction = self._walk(gs.used_fraction, 0.05, 0.05, 0.95)
                cap_mib = self._grant_memory_mib(grant, card)
                if grant.memory == 0 and grant.slice == 0:  # unlimited memory: split the card among such shares
                    cap_mib //= max(1, sum(1 for g in on_card if g.kind == "tdm" and g.memory == 0))
                used = round(cap_mib * gs.used_fraction, 1)
                grant_util += gs.util * (grant.slice / 7.0 if grant.slice else 1.0)
                grant_mem += used
                labels = {GRANT_LABEL: grant.id, "uuid": card.uuid}
                samples.append(self._sample(minor, 1, round(gs.util, 1), now_ms, labels))
                samples.append(self._sample(minor, 2, used, now_ms, labels))
                samples.append(self._sample(minor, 3, float(cap_mib), now_ms, labels))
            whole = any(g.kind == "whole" for g in on_card)
            if whole:
                state.util = self._walk(max(state.util, 50.0), 10.0, 30.0, 100.0)
                state.overhead_mib = self._walk(state.overhead_mib, 512.0, 1024.0, card.memory_mib * 0.9)
            else:
                state.util = min(100.0, grant_util + self._rng.uniform(0.0, 3.0))
                state.overhead_mib = self._walk(state.overhead_mib, 32.0, 256.0, 768.0)
            values = self._card_values(card, state, healthy, grant_mem)
            if self.real_reader is not None:
                values.update(self.real_reader(card))
            for mid in sorted(values):
                samples.append(self._sample(minor, mid, values[mid], now_ms, {"uuid": card.uuid}))
        for key in list(self._grants):
            if key not in live_keys:
                del self._grants[key]
        return samples

    def _card_values(self, card: CardSpec, state: _CardState, healthy: bool, grant_mem: float) -> dict[int, float]:
        total = float(card.memory_mib)
        used = round(min(total, state.overhead_mib + grant_mem), 1)
        util = round(state.util, 1)
        state.temp = self._walk(0.8 * state.temp + 0.2 * (32.0 + util * 0.45), 1.0, 25.0, 89.0)
        idle_w = card.power_limit_w * 0.12
        power = min(float(card.power_limit_w), idle_w + util / 100.0 * (card.power_limit_w - idle_w) * 0.9)
        if self._rng.random() < 0.01:
            state.ecc_sbe += 1
        return {
            METRIC_IDS["core_util_percent"]: util,
            METRIC_IDS["memory_used_mib"]: used,
            METRIC_IDS["memory_total_mib"]: total,
            METRIC_IDS["temperature_c"]: round(state.temp, 1),
            METRIC_IDS["power_w"]: round(power, 1),
            METRIC_IDS["health"]: 1.0 if healthy else 0.0,
            METRIC_IDS["xid_errors"]: float(state.xid),
            METRIC_IDS["power_limit_w"]: float(card.power_limit_w),
            METRIC_IDS["memory_util_percent"]: round(used / total * 100.0, 2),
            METRIC_IDS["ecc_sbe_total"]: float(state.ecc_sbe),
            METRIC_IDS["ecc_dbe_total"]: 0.0,
            METRIC_IDS["sm_clock_mhz"]: float(int(210 + util * 17.7)),
            METRIC_IDS["memory_clock_mhz"]: 2619.0 if card.is_nvidia else 1600.0,
            METRIC_IDS["nvlink_errors_total"]: 0.0,
            METRIC_IDS["throttle_reasons"]: 0.0 if power < card.power_limit_w * 0.98 else 4.0,
            METRIC_IDS["remapped_rows_total"]: 0.0,
        }

    @staticmethod
    def _grant_memory_mib(grant: GrantRecord, card: CardSpec) -> int:
        if grant.memory > 0:
            return grant.memory * 1024
        if grant.slice > 0:
            return mig_profile_gib(card.memory_gib, grant.slice) * 1024
        return card.memory_mib

    @staticmethod
    def _sample(minor: int, mid: int, value: float, now_ms: int, labels: dict[str, str]) -> MetricSample:
        return MetricSample(str(minor), mid, METRIC_NAMES[mid], value, now_ms, labels)


def filter_samples(
    samples: Iterable[MetricSample], devices: Iterable[str], metric_ids: Iterable[int], uuids: Mapping[str, int]
) -> list[MetricSample]:
    """Samples matching a request filter; empty filter = all; a device is a minor string or a uuid."""
    wanted_devices = {str(uuids.get(d, d)) for d in devices}
    wanted_ids = set(metric_ids)
    return [
        s
        for s in samples
        if (not wanted_devices or s.device in wanted_devices) and (not wanted_ids or s.metric_id in wanted_ids)
    ]
