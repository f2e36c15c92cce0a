"""The simulated XDM node: its options, state and RPC logic (no transport), and its metrics.

An RPC method returns a response or raises :class:`~nomad_plugin.sim.allocation.Refusal`, which the
server answers in-band or as a gRPC status (``error_mode``). All state sits behind one lock.
"""

from __future__ import annotations

import collections
import json
import logging
import queue
import random
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from nomad_plugin._proto.lingjun import api_outer_pb2 as pb
from nomad_plugin._proto.lingjun import config_service_pb2 as cfg
from nomad_plugin.model.metrics import GRANT_LABEL, METRIC_IDS, METRIC_NAMES
from nomad_plugin.sim.allocation import (
    STYLES,
    Ask,
    GrantedSlot,
    GrantRecord,
    Refusal,
    grant_response,
    load_state,
    mig_profile_gib,
    plan,
    save_state,
)
from nomad_plugin.sim.profiles import TOPOLOGY_VARIANTS, CardSpec, with_level

log = logging.getLogger(__name__)

CHOICES: dict[str, tuple[str, ...]] = {
    "style": STYLES,
    "error_mode": ("inband", "grpc"),
    "duplicate_id_mode": ("reject", "idempotent"),
    "release_unknown": ("not-found", "ok"),
    "disabled_effect": ("refuse", "none"),
    "unknown_filter": ("empty", "error"),
    "topology_variant": TOPOLOGY_VARIANTS,
}
EXPORTER_STATES = ("running", "stopped", "error")
CLOSE = object()  # put into a subscriber queue to end its stream with UNAVAILABLE

# Real readings for a card (the NVML mirror): metric id -> value.
RealReader = Callable[[CardSpec], Mapping[int, float]]


def check_choice(name: str, value: object, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"{name}: {value!r} is not one of {', '.join(allowed)}")


@dataclass
class SimOptions:
    """Behaviour switches (the ``**options`` of ``Simulator``); each default is a plain ``xdm-sim`` run's."""

    style: str = "env+devices"  # container spec style of Allocate responses
    collect_interval_ms: int = 1000  # exporter collection interval
    initial_push: bool = True  # ListAndWatch sends the list at once on subscribe
    push_on_allocation: bool = False  # ListAndWatch pushes after Allocate and Release too
    repush_interval: float = 0.0  # seconds; > 0 re-sends the list periodically
    error_mode: str = "inband"  # refusals as in-band status/message, or as gRPC status codes ("grpc")
    duplicate_id_mode: str = "reject"  # Allocate with a known id: ALREADY_EXISTS, or the same answer again
    release_unknown: str = "not-found"  # Release of an unknown id: NOT_FOUND, or status 0 ("ok")
    disabled_effect: str = "refuse"  # what a disabled Runtime Kit does to Allocate
    enabled: bool = True  # the initial config-daemon flag (a state file overrides it)
    mig_placement: bool = True  # apply NVIDIA's MIG placement (memory eighths)
    cpu_container: bool = True  # device-less requests succeed with an empty grant
    unknown_filter: str = "empty"  # an exporter filter naming unknown devices or metrics
    topology_variant: str = "normal"
    seed: int = 0  # metrics random seed
    control: bool = True  # serve the JSON-lines control socket
    version: str = "v1.13.0-sim"
    nvml_mirror: bool = False
    reflection: bool = False  # serve gRPC server reflection

    def __post_init__(self) -> None:
        for name, allowed in CHOICES.items():
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
        self.cards = list(cards)  # by minor: minors are 0..n-1
        self.options = options
        self.state_file = state_file
        self.lock = threading.RLock()
        self.metrics_cond = threading.Condition(self.lock)
        self.present = set(range(len(self.cards)))
        self.health: dict[int, tuple[bool, str]] = dict.fromkeys(self.present, (True, ""))
        self.state = load_state(state_file, options.enabled)
        self.latency: dict[str, float] = {}  # RPC name or "*" -> seconds
        self.hang_until = 0.0  # time.monotonic() until which every RPC hangs
        self.exporter_state = "running"
        self.config_fail = False
        self.call_counts: collections.Counter[str] = collections.Counter()  # Enable and Disable included
        self.stream_epoch = 0  # bumped by close_streams: open exporter streams end
        self.metrics = MetricsModel(self.cards, options.seed, real_reader)
        self.samples: list[pb.MetricData] = []
        self.samples_gen = 0
        self._last_collect_ms = 0
        self._samples_stale = True  # health or grants changed since the last collection
        self.subscribers: set[queue.Queue[Any]] = set()  # one per open ListAndWatch

    # ------------------------------------------------------------ state changes
    def _card(self, minor: int) -> CardSpec:
        if not 0 <= minor < len(self.cards):
            raise ValueError(f"minor: no card {minor} in profile {self.profile} (0..{len(self.cards) - 1})")
        return self.cards[minor]

    def set_health(self, minor: int, healthy: bool, reason: str = "") -> None:
        with self.lock:
            self.health[self._card(minor).minor] = (healthy, reason)
        self._changed("card %d -> %s%s", minor, "Healthy" if healthy else "Unhealthy", f" ({reason})" if reason else "")

    def remove_device(self, minor: int) -> None:
        with self.lock:
            self.present.discard(self._card(minor).minor)
        self._changed("card %d removed", minor)

    def add_device(self, minor: int) -> None:
        with self.lock:
            self.present.add(self._card(minor).minor)
        self._changed("card %d added", minor)

    def _changed(self, what: str, *args: object) -> None:
        self._samples_stale = True
        log.info(what, *args)
        self.push()

    def set_topology_level(self, name: str, value: str | None, minors: list[int] | None = None) -> None:
        """What a re-cabled node, or XDM learning its place in the network, looks like on the wire."""
        if not name.strip():
            raise ValueError("level: empty name")
        with self.lock:
            chosen = [self._card(m).minor for m in minors] if minors else list(range(len(self.cards)))
            for minor in chosen:
                self.cards[minor] = with_level(self.cards[minor], name, value)
        self._changed("topology level %s -> %s on cards %s", name, "(removed)" if value is None else value, chosen)

    def set_choice(self, name: str, value: str) -> None:
        """Switch one of the :data:`CHOICES` options (``error_mode``, ``release_unknown``...) at run time."""
        check_choice(name, value, CHOICES[name])
        setattr(self.options, name, value)

    def calls(self) -> dict[str, int]:
        """How many times each RPC was called (a stream counts once per subscription)."""
        with self.lock:
            return dict(self.call_counts)

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
                devices.append(pb.Device(
                    minor=minor, uuid=card.uuid, model=card.model, xpuType=card.xpu_type,
                    health="Healthy" if healthy else "Unhealthy", totalMemory=card.memory_mib,
                    totalCore=card.total_core, pciBusId=card.pci_bus_id, extenderResources=extender,
                ))  # fmt: skip
            return pb.ListAndWatchResponse(devices=devices)

    def subscriber_count(self) -> int:
        with self.lock:
            return len(self.subscribers)

    def push(self) -> None:
        """Send the complete device list to every ListAndWatch subscriber."""
        with self.lock:
            listing = self.device_list()
            for q in self.subscribers:
                q.put(listing)

    def close_streams(self) -> None:
        """End every open ListAndWatch and ExporterDataStream with UNAVAILABLE."""
        with self.lock:
            self.stream_epoch += 1
            for q in self.subscribers:
                q.put(CLOSE)
            self.metrics_cond.notify_all()

    # ------------------------------------------------------------ resource RPCs
    def list_xpu_types(self, _req: pb.XPUTypeRequest) -> pb.XPUTypeResponse:
        return pb.XPUTypeResponse(xpuTypes=sorted({c.xpu_type for c in self.cards}))

    def allocate(self, req: pb.AllocateRequest) -> pb.AllocateResponse:
        asks = [Ask(d.minor if d.HasField("minor") else None, d.core, d.memory, d.slice) for d in req.devices]
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
                    return grant_response(self.options.style, old, self.cards[0].is_nvidia)
                raise Refusal("ALREADY_EXISTS", f"id: allocation {req.id} already exists")
            if not self.state.enabled and self.options.disabled_effect == "refuse":
                raise Refusal("FAILED_PRECONDITION", "Runtime Kit is disabled on this node (config-daemon)")
            if not asks and not self.options.cpu_container:
                raise Refusal("INVALID_ARGUMENT", "devices: empty")
            present = {m: self.cards[m] for m in self.present}
            healthy = {m: h for m, (h, _) in self.health.items()}
            minors = plan(present, healthy, self.state.grants.values(), asks, mig_placement=self.options.mig_placement)
            first = asks[0] if asks else Ask(None)
            slots = tuple(
                GrantedSlot(
                    minor, self.cards[minor].uuid, first.core, first.memory, first.slice,
                    f"MIG-{uuid.uuid5(uuid.NAMESPACE_URL, f'{self.cards[minor].uuid}/{req.id}/{i}')}" if first.slice else "",
                )
                for i, minor in enumerate(minors)
            )  # fmt: skip
            record = GrantRecord(
                req.id, tuple(minors), first.core, first.memory, first.slice, time.time(), slots,
                dict(req.annotations), key,
            )  # fmt: skip
            self.state.grants[req.id] = record
            self._samples_stale = True
            save_state(self.state_file, self.state)
        if self.options.push_on_allocation:
            self.push()
        return grant_response(self.options.style, record, self.cards[0].is_nvidia)

    def release(self, req: pb.ReleaseRequest) -> pb.ReleaseResponse:
        with self.lock:
            if not req.id:
                raise Refusal("INVALID_ARGUMENT", "id: empty")
            if self.state.grants.pop(req.id, None) is None:
                if self.options.release_unknown == "ok":
                    return pb.ReleaseResponse(status=0, message=f"allocation {req.id} not found (nothing to do)")
                raise Refusal("NOT_FOUND", f"id: no allocation {req.id}")
            self._samples_stale = True
            save_state(self.state_file, self.state)
        if self.options.push_on_allocation:
            self.push()
        return pb.ReleaseResponse(status=0)

    # ------------------------------------------------------------ monitoring RPCs
    def gpu_info(self, req: pb.ListGpuInfoRequest) -> pb.ListGpuInfoResponse:
        wanted = set(req.minors)
        with self.lock:
            infos = [
                pb.GpuInfo(
                    minor=c.minor, uuid=c.uuid, model=c.model, driverVersion=c.driver_version, vendor=c.vendor,
                    xpuType=c.xpu_type, totalMemory=c.memory_mib, pciBusId=c.pci_bus_id, numaNode=c.numa_node,
                    firmwareVersion=f"fw-{c.driver_version}", sdkVersion=c.sdk_version,
                    serialNumber=c.serial_number, migEnabled=c.mig_capable,
                )
                for c in self.cards
                if c.minor in self.present and (not wanted or c.minor in wanted)
            ]  # fmt: skip
        return pb.ListGpuInfoResponse(gpuInfos=infos)

    def collect(self) -> None:
        """One exporter collection (the collector thread calls this every interval)."""
        with self.lock:
            if self.exporter_state != "running":
                return
            self._last_collect_ms = int(time.time() * 1000)
            health = {m: h for m, (h, _) in self.health.items()}
            self.samples = self.metrics.collect(self._last_collect_ms, self.present, health, self.state.grants.values())
            self.samples_gen += 1
            self._samples_stale = False
            self.metrics_cond.notify_all()

    def snapshot(self) -> tuple[int, list[pb.MetricData]]:
        """The latest collection, collected afresh when health or grants changed since."""
        with self.lock:
            if self._samples_stale or not self.samples:
                self.collect()
            return self.samples_gen, self.samples

    def filter_metrics(self, req: pb.ExporterDataRequest, samples: list[pb.MetricData]) -> pb.ExporterDataResponse:
        """Samples matching the request's filter (empty = all); a device is named by minor or UUID."""
        uuids = {c.uuid: str(c.minor) for c in self.cards}
        if self.options.unknown_filter == "error":
            bad = [d for d in req.devices if d not in uuids and not (d.isdigit() and int(d) in self.present)]
            bad_ids = [i for i in req.metricIds if i not in METRIC_NAMES]
            if bad or bad_ids:
                raise Refusal("NOT_FOUND", f"filter: unknown device {bad[:1]} or metric id {bad_ids[:1]}")
        devices = {uuids.get(d, d) for d in req.devices}
        ids = set(req.metricIds)
        chosen = [s for s in samples if (not devices or s.device in devices) and (not ids or s.metricId in ids)]
        return pb.ExporterDataResponse(dataList=chosen)

    def data_list(self, req: pb.ExporterDataRequest) -> pb.ExporterDataResponse:
        return self.filter_metrics(req, self.snapshot()[1])

    def exporter_config(self, _req: pb.ExporterGetConfigRequest) -> pb.ExporterGetConfigResponse:
        return pb.ExporterGetConfigResponse(
            collectIntervalMs=self.options.collect_interval_ms,
            metricIds=sorted(METRIC_NAMES),
            config={"profile": self.profile, "style": self.options.style, "simulator": "xdm-sim"},
        )

    def set_exporter_state(self, state: str) -> None:
        check_choice("exporter state", state, EXPORTER_STATES)
        with self.lock:
            self.exporter_state = state

    def exporter_status(self, _req: pb.ExporterGetStatusRequest) -> pb.ExporterGetStatusResponse:
        with self.lock:
            return pb.ExporterGetStatusResponse(
                running=self.exporter_state == "running",
                state=self.exporter_state,
                lastCollectTimestamp=self._last_collect_ms,
                version=self.options.version,
                message="collector failed (simulated)" if self.exporter_state == "error" else "",
            )

    # ------------------------------------------------------------ config daemon
    # What XDM does while disabled is not documented (docs/xdm-risks.md, "Runtime Kit disabled"):
    # the simulator takes the safest reading. Cards stay listed with their health, grants already
    # made are kept and can be released, only new allocations are refused (``disabled_effect``
    # "refuse", the default; "none" allocates anyway). Enable and Disable are idempotent.
    def set_enabled(self, enabled: bool) -> None:
        self._switch(enabled)

    def _switch(self, enabled: bool) -> str:
        word = "enabled" if enabled else "disabled"
        with self.lock:
            already = self.state.enabled == enabled
            self.state.enabled = enabled
            save_state(self.state_file, self.state)
        log.info("Runtime Kit %s%s", word, " (already)" if already else "")
        return f"already {word}" if already else word

    def enable(self, _req: cfg.EnableRequest) -> cfg.EnableResponse:
        if self.config_fail:
            return cfg.EnableResponse(success=False, message="enable failed (simulated)")
        return cfg.EnableResponse(success=True, message=self._switch(True))

    def disable(self, _req: cfg.DisableRequest) -> cfg.DisableResponse:
        if self.config_fail:
            return cfg.DisableResponse(success=False, message="disable failed (simulated)")
        return cfg.DisableResponse(success=True, message=self._switch(False))

    def query_status(self, _req: cfg.QueryStatusRequest) -> cfg.QueryStatusResponse:
        with self.lock:
            return cfg.QueryStatusResponse(enabled=self.state.enabled)


# ---------------------------------------------------------------- exporter metrics


@dataclass
class _CardState:
    temp: float
    util: float = 2.0
    overhead_mib: float = 512.0
    xid: int = 0
    ecc_sbe: int = 0
    was_healthy: bool = True


class MetricsModel:
    """Plausible readings that drift by a seeded random walk and agree with the grants: inside the card's
    capacities, each share or MIG grant sampled under ``GRANT_LABEL`` within what it was granted, the card's
    memory the sum of its grants' plus a little driver overhead."""

    def __init__(self, cards: list[CardSpec], seed: int = 0, real_reader: RealReader | None = None) -> None:
        self.cards = cards
        self.real_reader = real_reader
        self._rng = random.Random(seed)  # noqa: S311 - simulated readings, not secrets
        self._cards: dict[int, _CardState] = {}
        self._grants: dict[tuple[str, int], list[float]] = {}  # (grant, minor) -> [util %, memory used fraction]

    def _walk(self, value: float, step: float, low: float, high: float) -> float:
        return min(high, max(low, value + self._rng.uniform(-step, step)))

    def collect(
        self, now_ms: int, present: Iterable[int], health: Mapping[int, bool], grants: Iterable[GrantRecord]
    ) -> list[pb.MetricData]:
        """One full snapshot: every present card, every metric, every share and MIG grant."""
        grants = list(grants)
        samples: list[pb.MetricData] = []
        live: set[tuple[str, int]] = set()

        def sample(minor: int, mid: int, value: float, labels: dict[str, str]) -> None:
            samples.append(pb.MetricData(
                device=str(minor), metricId=mid, value=value, timestamp=now_ms, metricName=METRIC_NAMES[mid],
                labels=labels,
            ))  # fmt: skip

        for minor in sorted(present):
            card, healthy = self.cards[minor], health.get(minor, True)
            state = self._cards.setdefault(minor, _CardState(temp=30.0 + self._rng.uniform(0, 8)))
            state.xid += state.was_healthy and not healthy
            state.was_healthy = healthy
            on_card = [g for g in grants if minor in g.minors]
            unlimited = sum(1 for g in on_card if g.kind == "tdm" and g.memory == 0)
            grant_util = grant_mem = 0.0
            for grant in (g for g in on_card if g.kind in ("tdm", "mig")):
                live.add((grant.id, minor))
                walk = self._grants.setdefault((grant.id, minor), [self._rng.uniform(20, 60), 0.3])
                walk[0] = self._walk(walk[0], 8.0, 0.0, float(grant.core) if grant.core > 0 else 100.0)
                walk[1] = self._walk(walk[1], 0.05, 0.05, 0.95)
                if grant.memory > 0:
                    cap_mib = grant.memory * 1024
                elif grant.slice > 0:
                    cap_mib = mig_profile_gib(card.memory_gib, grant.slice) * 1024
                else:  # unlimited memory: the card is split among such shares
                    cap_mib = card.memory_mib // unlimited
                used = round(cap_mib * walk[1], 1)
                grant_util += walk[0] * (grant.slice / 7.0 if grant.slice else 1.0)
                grant_mem += used
                labels = {GRANT_LABEL: grant.id, "uuid": card.uuid}
                for mid, value in ((1, round(walk[0], 1)), (2, used), (3, float(cap_mib))):
                    sample(minor, mid, value, labels)
            if any(g.kind == "whole" for g in on_card):
                state.util = self._walk(max(state.util, 50.0), 10.0, 30.0, 100.0)
                state.overhead_mib = self._walk(state.overhead_mib, 512.0, 1024.0, card.memory_mib * 0.9)
            else:
                state.util = min(100.0, grant_util + self._rng.uniform(0.0, 3.0))
                state.overhead_mib = self._walk(state.overhead_mib, 32.0, 256.0, 768.0)
            total = float(card.memory_mib)
            used = round(min(total, state.overhead_mib + grant_mem), 1)
            util = round(state.util, 1)
            state.temp = self._walk(0.8 * state.temp + 0.2 * (32.0 + util * 0.45), 1.0, 25.0, 89.0)
            limit = float(card.power_limit_w)
            power = min(limit, limit * 0.12 + util / 100.0 * limit * 0.88 * 0.9)
            state.ecc_sbe += self._rng.random() < 0.01
            values = {
                "core_util_percent": util, "memory_used_mib": used, "memory_total_mib": total,
                "temperature_c": round(state.temp, 1), "power_w": round(power, 1), "health": float(healthy),
                "xid_errors": float(state.xid), "power_limit_w": limit, "memory_util_percent": round(used / total * 100, 2),
                "ecc_sbe_total": float(state.ecc_sbe), "ecc_dbe_total": 0.0, "sm_clock_mhz": float(int(210 + util * 17.7)),
                "memory_clock_mhz": 2619.0 if card.is_nvidia else 1600.0, "nvlink_errors_total": 0.0,
                "throttle_reasons": 0.0 if power < limit * 0.98 else 4.0, "remapped_rows_total": 0.0,
            }  # fmt: skip
            readings = {METRIC_IDS[name]: value for name, value in values.items()}
            readings.update(self.real_reader(card) if self.real_reader is not None else {})
            for mid in sorted(readings):
                sample(minor, mid, readings[mid], {"uuid": card.uuid})
        for key in set(self._grants) - live:
            del self._grants[key]
        return samples
