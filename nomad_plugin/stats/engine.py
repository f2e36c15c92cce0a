"""The Stats stream: cached readings as Nomad's ``StatsResponse``, one per collection interval.

``nomad node status -stats`` / ``nomad alloc status -stats`` print every attribute of an instance's
``StatObject`` (nested keys joined with ``.``), the plain views its ``summary``. The top level
carries nomad-device-nvidia's eleven stats (its stats.go: names, units, descriptions) of the
physical card, also for the shares and MIG units carved from it; ``xdm.*`` what XDM adds;
``share.*`` / ``mig.*`` what the instance was granted beside what it uses; ``summary`` memory
used/total (whole cards) or used/allotted (MiB).

ECC: the official plugin shows corrected errors since the driver loaded, by location, as NVML gives
them; XDM gives totals by kind only, so there "ECC memory errors" carries the corrected total (its
desc says so) and L1/L2 are "N/A". Encoder, decoder and BAR1 come from NVML, "N/A" without it.

A missing reading is "N/A", except the official Temperature, Power and ECC stats NVML says the
card does not support (``nvml_unsupported``): int 0, as the official plugin sends them. A reading
older than ``STALE_INTERVALS`` intervals keeps its value, its desc starting "stale: last update N s
ago"; "Stats age" shows the newest reading's age where the CLI (which hides descs) shows it.

Each tick reads the cache only, never XDM. Nomad stops collecting stats for good when the stream
ends (nomad's client/devicemanager/instance.go, ``collectStats``), so nothing here ends it but
``cancel``: a failed build is logged and answered with every value "N/A".
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping, MutableMapping
from dataclasses import dataclass

from google.protobuf import wrappers_pb2

from nomad_plugin._proto.nomad import device_pb2, stats_pb2
from nomad_plugin.model.card import Card, Inventory
from nomad_plugin.model.instances import Catalog, Instance, Kind
from nomad_plugin.model.metrics import UNSUPPORTED_BITS
from nomad_plugin.stats.feed import Clock, MetricsCache, Reading

log = logging.getLogger(__name__)

STALE_INTERVALS = 2.0
NOT_AVAILABLE = "N/A"

# NVML's clock-throttle-reason bits (nvmlClocksEventReasons), the encoding the
# exporter's ``throttle_reasons`` bitmask is assumed to follow.
THROTTLE_REASONS: tuple[tuple[int, str], ...] = (
    (0x1, "gpu_idle"),
    (0x2, "applications_clocks_setting"),
    (0x4, "sw_power_cap"),
    (0x8, "hw_slowdown"),
    (0x10, "sync_boost"),
    (0x20, "sw_thermal"),
    (0x40, "hw_thermal"),
    (0x80, "power_brake"),
    (0x100, "display_clock_setting"),
)
_KNOWN_THROTTLE_BITS = sum(bit for bit, _ in THROTTLE_REASONS)

# nomad-device-nvidia's descriptions of its eleven stats (stats.go), word for word: the API,
# `nomad alloc status -json` and whatever reads them get the same text from either plugin.
DESC_POWER = "Power usage for this GPU in watts and its associated circuitry (e.g. memory) / Maximum GPU Power"
DESC_GPU_UTIL = (
    "Percent of time over the past sample period during which one or more kernels were executing on the GPU."
)
DESC_MEMORY_UTIL = "Percentage of bandwidth used during the past sample period"
DESC_ENCODER = "Percent of time over the past sample period during which GPU Encoder was used"
DESC_DECODER = "Percent of time over the past sample period during which GPU Decoder was used"
DESC_TEMPERATURE = "Temperature of the Unit"
DESC_MEMORY_STATE = "UsedMemory / TotalMemory"
DESC_BAR1 = "UsedBAR1 / TotalBAR1"
DESC_ECC_L1 = "Requested L1Cache error counter for the device"
DESC_ECC_L2 = "Requested L2Cache error counter for the device"
DESC_ECC_MEMORY = "Requested memory error counter for the device"


@dataclass(frozen=True)
class GrantInfo:
    """What the reserve layer granted to one instance (0 = unlimited / not MIG)."""

    grant_id: str
    core_limit_percent: int = 0
    memory_limit_gib: int = 0
    slices: int = 0


#: Which grant holds an instance (by instance id), if any.
GrantOf = Callable[[str], "GrantInfo | None"]
#: The grants by instance id, read once per response.
Grants = Callable[[], Mapping[str, "GrantInfo"]]


def effective_interval(interval: float) -> float:
    """Nomad's ``collection_interval`` in seconds; its SDK takes zero or less as 1 s."""
    return interval if interval > 0 else 1.0


def no_grants(instance_id: str) -> GrantInfo | None:
    return None


def none_held() -> Mapping[str, GrantInfo]:
    return {}


def decode_throttle(mask: int) -> list[str]:
    """Names of the set bits; unknown bits as ``bit_0x...``."""
    names = [name for bit, name in THROTTLE_REASONS if mask & bit]
    rest = mask & ~_KNOWN_THROTTLE_BITS
    return names + [f"bit_{1 << n:#x}" for n in range(max(rest, 0).bit_length()) if rest >> n & 1]


#: What one StatValue shows: (unit, desc, value, denominator). An int value goes in
#: ``int_numerator_val``, over ``int_denominator_val`` when the denominator is not None (0 included);
#: a bool in ``bool_val``, a string in ``string_val``.
Stat = tuple[str, str, int | bool | str, int | None]
Stats = dict[str, Stat]


def na(unit: str, desc: str) -> Stat:
    return (unit, desc, NOT_AVAILABLE, None)


def put(out: stats_pb2.StatValue, stat: Stat) -> None:
    unit, desc, value, denominator = stat
    if unit:
        out.unit = unit
    out.desc = desc
    if isinstance(value, bool):
        out.bool_val.value = value
    elif isinstance(value, str):
        out.string_val.value = value
    else:
        out.int_numerator_val.value = value
        if denominator is not None:
            out.int_denominator_val.value = denominator


def fill(attributes: MutableMapping[str, stats_pb2.StatValue], stats: Mapping[str, Stat]) -> None:
    for name, stat in stats.items():
        put(attributes[name], stat)


class _Values:
    """Stats from readings, marking stale ones; remembers the newest reading used."""

    def __init__(self, now: float, stale_after: float, newest: float | None = None) -> None:
        self.now = now
        self.stale_after = stale_after
        self.newest = newest

    def desc(self, reading: Reading, desc: str) -> str:
        if self.newest is None or reading.received > self.newest:
            self.newest = reading.received
        age = self.now - reading.received
        return f"stale: last update {age:.1f} s ago; {desc}" if age > self.stale_after else desc

    def count(self, reading: Reading | None, unit: str, desc: str, unsupported: bool = False) -> Stat:
        """The reading rounded to an int; "N/A" without one (0 when NVML says the card lacks it)."""
        if reading is None:
            return (unit, desc, 0, None) if unsupported else na(unit, desc)
        return (unit, self.desc(reading, desc), round(reading.value), None)

    def ratio(self, used: Reading | None, total: Reading | None, static_total: int, unit: str, desc: str) -> Stat:
        """``used / total``; ``static_total`` stands in for a missing total, and no total (0) sends none."""
        if used is None:
            return na(unit, desc)
        shown = self.desc(used, desc)
        if total is not None:
            self.desc(total, desc)
        denominator = round(total.value) if total is not None else static_total
        return (unit, shown, round(used.value), denominator if denominator > 0 else None)


def card_stats(readings: Mapping[str, Reading], card: Card | None, values: _Values) -> tuple[Stats, Stats]:
    """The physical card's stats: the official ones at the top, XDM's extras in ``xdm``."""
    r = readings.get
    mask_reading = r("nvml_unsupported")
    mask = int(mask_reading.value) if mask_reading is not None else 0

    def unsupported(name: str) -> bool:
        return bool(mask & UNSUPPORTED_BITS[name])

    count = values.count
    draw = r("power_w")
    if draw is not None:
        # nomad-device-nvidia (1.1.0 on) sends the draw in mW over the draw in whole W (stats.go),
        # whatever its unit and desc say; dashboards built on it read that. NotSupported is 0 / 0.
        power: Stat = ("W", values.desc(draw, DESC_POWER), round(draw.value * 1000), int(draw.value))
    else:
        power = ("W", DESC_POWER, 0, 0) if unsupported("power_w") else na("W", DESC_POWER)
    by_location = any(r(n) is not None for n in ("ecc_l1_corrected", "ecc_l2_corrected", "ecc_memory_corrected"))
    if by_location or unsupported("ecc_memory_corrected"):  # NVML's split by location; else XDM's total
        ecc_memory = count(r("ecc_memory_corrected"), "#", DESC_ECC_MEMORY, unsupported("ecc_memory_corrected"))
    else:
        ecc_memory = count(r("ecc_sbe_total"), "#", "corrected ECC errors, all locations (XDM gives no split)")
    total_mib = card.memory_mib if card is not None else 0
    top = {
        "Memory state": values.ratio(r("memory_used_mib"), r("memory_total_mib"), total_mib, "MiB", DESC_MEMORY_STATE),
        "GPU utilization": count(r("core_util_percent"), "%", DESC_GPU_UTIL),
        "Memory utilization": count(r("memory_util_percent"), "%", DESC_MEMORY_UTIL),
        "Temperature": count(r("temperature_c"), "C", DESC_TEMPERATURE, unsupported("temperature_c")),
        "Power usage": power,
        "Encoder utilization": count(r("encoder_util_percent"), "%", DESC_ENCODER),
        "Decoder utilization": count(r("decoder_util_percent"), "%", DESC_DECODER),
        "BAR1 buffer state": values.ratio(r("bar1_used_mib"), r("bar1_total_mib"), 0, "MiB", DESC_BAR1),
        "ECC L1 errors": count(r("ecc_l1_corrected"), "#", DESC_ECC_L1, unsupported("ecc_l1_corrected")),
        "ECC L2 errors": count(r("ecc_l2_corrected"), "#", DESC_ECC_L2, unsupported("ecc_l2_corrected")),
        "ECC memory errors": ecc_memory,
    }
    health, throttle = r("health"), r("throttle_reasons")
    health_desc, throttle_desc = "the backend's health verdict for the card (XDM or NVML)", "what holds the clocks down"
    xdm = {
        "Health": ("", values.desc(health, health_desc), health.value != 0, None) if health else na("", health_desc),
        "XID errors": count(r("xid_errors"), "#", "driver XID error events"),
        "Throttle reasons": (
            ("", values.desc(throttle, throttle_desc), ", ".join(decode_throttle(int(throttle.value))) or "none", None)
            if throttle
            else na("", throttle_desc)
        ),
        "NVLink errors": count(r("nvlink_errors_total"), "#", "NVLink error count"),
        "Remapped rows": count(r("remapped_rows_total"), "#", "memory rows remapped"),
        "ECC corrected errors": count(r("ecc_sbe_total"), "#", "corrected (single-bit) ECC errors"),
        "ECC uncorrected errors": count(r("ecc_dbe_total"), "#", "uncorrected (double-bit) ECC errors"),
        "Power draw": count(draw, "W", "power draw"),
        "Power limit": count(r("power_limit_w"), "W", "power limit the card enforces"),
        "SM clock": count(r("sm_clock_mhz"), "MHz", "compute clock"),
        "Memory clock": count(r("memory_clock_mhz"), "MHz", "memory clock"),
    }
    return top, xdm


@dataclass(frozen=True)
class _Allotment:
    grant: GrantInfo | None
    memory_mib: int  # 0 = unknown
    readings: Mapping[str, Reading]


def _allotment(inst: Instance, card: Card | None, grant: GrantInfo | None, cache: MetricsCache) -> _Allotment:
    """What a share or MIG unit was given, and the readings that speak of it alone."""
    memory_gib = grant.memory_limit_gib if grant and grant.memory_limit_gib else inst.memory_gib
    memory_mib = memory_gib * 1024
    readings = cache.grant_readings(grant.grant_id) if grant else {}
    if inst.kind is Kind.SHARE and memory_mib == 0:
        memory_mib = card.memory_mib if card is not None else 0  # an unlimited share may use the whole card
    if inst.kind is Kind.MIG_INSTANCE:
        uuid = inst.mig_uuid or inst.id
        mig = next((m for m in (card.mig_instances if card else ()) if m.uuid == uuid), None)
        memory_mib = mig.memory_mib if mig is not None else inst.memory_gib * 1024
        readings = readings or cache.card_readings([uuid])
    return _Allotment(grant, memory_mib, readings)


def granted_stats(inst: Instance, allot: _Allotment, values: _Values) -> Stats:
    """The ``share``/``mig`` object: granted limits beside actual use."""
    grant = allot.grant
    out: Stats = {"Grant": ("", "XDM allocation holding this instance", grant.grant_id if grant else "none", None)}
    if inst.kind is Kind.SHARE:
        core = grant.core_limit_percent if grant else inst.core
        out["Compute limit"] = ("%", "granted compute, percent of the card (0 = unlimited)", core, None)
    else:
        out["Slice"] = ("", "MIG unit index on the card", inst.index, None)
        slices = grant.slices if grant and grant.slices and inst.kind is Kind.MIG else inst.slices
        out["Slices"] = ("", "MIG compute slices", slices, None)
    if inst.kind is Kind.MIG_INSTANCE:  # an existing instance: its own size, whatever else its grant holds
        memory_gib = allot.memory_mib // 1024
    else:
        memory_gib = grant.memory_limit_gib if grant and grant.memory_limit_gib else inst.memory_gib
    if memory_gib or allot.memory_mib:
        limit = memory_gib or allot.memory_mib // 1024
        out["Memory limit"] = ("GiB", "granted memory (0 = unlimited)", limit, None)
    else:
        out["Memory limit"] = na("GiB", "granted memory")
    if grant is None and not allot.readings:
        out["Memory used"] = ("MiB", "not reserved", 0, None)
        out["Compute utilization"] = ("%", "not reserved", 0, None)
    else:
        r = allot.readings.get
        out["Memory used"] = values.count(r("memory_used_mib"), "MiB", "memory used by this grant")
        out["Compute utilization"] = values.count(r("core_util_percent"), "%", "compute used by this grant")
    return out


def granted_summary(inst: Instance, allot: _Allotment, values: _Values) -> Stat:
    """Memory used / allotted (MiB) of a share or MIG unit."""
    used = allot.readings.get("memory_used_mib")
    denominator = allot.memory_mib if allot.memory_mib > 0 else None
    if used is None and allot.grant is None and inst.kind is not Kind.MIG_INSTANCE:
        return ("MiB", "not reserved", 0, denominator)
    if used is None:
        return na("MiB", "memory used / allotted")
    return ("MiB", values.desc(used, "memory used / allotted"), round(used.value), denominator)


def stats_age(now: float, newest: float | None) -> stats_pb2.StatValue:
    """ "Stats age": seconds since the newest reading (None: none yet), to 0.1 s."""
    if newest is None:
        return stats_pb2.StatValue(
            unit="s", desc="no reading received yet", string_val=wrappers_pb2.StringValue(value=NOT_AVAILABLE)
        )
    age = round(max(now - newest, 0.0), 1)
    return stats_pb2.StatValue(
        unit="s",
        desc="seconds since the newest reading arrived",
        float_numerator_val=wrappers_pb2.DoubleValue(value=age),
    )


def build_stats(
    catalog: Catalog,
    inventory: Inventory,
    cache: MetricsCache,
    grant_of: GrantOf,
    now: float,
    interval: float,
    wall_offset: float = 0.0,
) -> device_pb2.StatsResponse:
    """A group per catalog group, an entry per fingerprinted instance.

    ``now`` is on the cache's clock; ``wall_offset`` makes wall time of it for the timestamps. Each
    card's object is built once and copied into every instance carved from it, and so is the entry
    of an unreserved share, which has no reading of its own.
    """
    stale_after = STALE_INTERVALS * effective_interval(interval)
    cards: dict[str, tuple[stats_pb2.StatObject, float | None]] = {}
    unreserved: dict[tuple[str, int, int, int], device_pb2.DeviceStats] = {}
    response = device_pb2.StatsResponse()
    for group in catalog.groups:
        out = response.groups.add(vendor=group.key.vendor, type=group.key.device_type, name=group.key.name)
        for inst in group.instances:
            entry = out.instance_stats[inst.id]
            grant = grant_of(inst.id) if inst.kind is not Kind.WHOLE else None
            same = (inst.card_uuid, inst.minor, inst.core, inst.memory_gib)
            if inst.kind is Kind.SHARE and grant is None and same in unreserved:
                entry.CopyFrom(unreserved[same])
                continue
            card = inventory.by_uuid(inst.card_uuid) or inventory.by_minor(inst.minor)
            if inst.card_uuid not in cards:
                values = _Values(now, stale_after)
                top, xdm = card_stats(cache.card_readings([inst.card_uuid, str(inst.minor)]), card, values)
                obj = stats_pb2.StatObject()
                fill(obj.attributes, top)
                fill(obj.nested["xdm"].attributes, xdm)
                obj.attributes["Stats age"].CopyFrom(stats_age(now, values.newest))
                cards[inst.card_uuid] = obj, values.newest
            card_obj, newest = cards[inst.card_uuid]
            entry.stats.CopyFrom(card_obj)
            if inst.kind is Kind.WHOLE:
                entry.summary.CopyFrom(card_obj.attributes["Memory state"])
            else:
                values = _Values(now, stale_after, newest)
                allot = _allotment(inst, card, grant, cache)
                part = entry.stats.nested["share" if inst.kind is Kind.SHARE else "mig"]
                fill(part.attributes, granted_stats(inst, allot, values))
                put(entry.summary, granted_summary(inst, allot, values))
                if values.newest != newest:  # the grant's own readings are newer than the card's
                    newest = values.newest
                    entry.stats.attributes["Stats age"].CopyFrom(stats_age(now, newest))
            stamp = (newest if newest is not None else now) + wall_offset
            entry.timestamp.seconds = int(stamp)
            entry.timestamp.nanos = int((stamp - int(stamp)) * 1e9)
            if inst.kind is Kind.SHARE and grant is None:
                unreserved[same] = entry
    return response


class StatsEngine:
    def __init__(
        self,
        cache: MetricsCache,
        catalog_source: Callable[[], Catalog],
        inventory_source: Callable[[], Inventory],
        grants: Grants = none_held,
        clock: Clock = time.monotonic,
        wall_clock: Clock = time.time,
    ) -> None:
        self._cache = cache
        self._catalog = catalog_source
        self._inventory = inventory_source
        self._grants = grants
        self._clock = clock  # the cache's clock: ages and staleness
        self._wall_clock = wall_clock  # only for the timestamps Nomad shows

    def build(self, interval: float, empty: bool = False) -> device_pb2.StatsResponse:
        """One response from the cache, or with every value "N/A" (``empty``); may raise."""
        now = self._clock()
        cache = MetricsCache(clock=self._clock, max_entries=1) if empty else self._cache
        grant_of = no_grants if empty else self._grants().get
        return build_stats(self._catalog(), self._inventory(), cache, grant_of, now, interval, self._wall_clock() - now)

    def responses(self, interval: float, cancel: threading.Event) -> Iterator[device_pb2.StatsResponse]:
        """The first response at once, then one per interval, until ``cancel`` is set."""
        period = effective_interval(interval)
        next_tick = time.monotonic()
        while not cancel.is_set():
            try:
                response = self.build(interval)
            except Exception:
                log.exception("building stats failed; sending N/A values")
                try:
                    response = self.build(interval, empty=True)
                except Exception:
                    log.exception("building N/A stats failed; sending an empty response")
                    response = device_pb2.StatsResponse()
            yield response
            next_tick += period
            delay = next_tick - time.monotonic()
            if delay < 0:  # a slow consumer: skip missed ticks rather than burst
                next_tick = time.monotonic() + period
                delay = period
            if cancel.wait(delay):
                return
