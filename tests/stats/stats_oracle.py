"""A second, independent build of the StatsResponse: the oracle for ``stats.engine.build_stats``.

The product must build the same message from the same cache, catalog,
inventory and grants (``test_stats_oracle.py``). The two are written apart
(here every value is first a spec tuple, then a message), so a slip in one
shows as a difference; change this file only when what Nomad shows is meant
to change. What Nomad shows:

``nomad node status -stats`` and ``nomad alloc status -stats`` print every
attribute of an instance's ``StatObject`` (nested keys joined with ``.``),
and the plain views print ``summary``. So:

- The top level uses the official NVIDIA plugin's attribute names where we
  have the value ("Memory state", "GPU utilization", "Memory utilization",
  "Temperature", "Power usage", "ECC L1/L2/memory errors"); they describe
  the physical card, also for shares and MIG units carved from it.
- ``xdm.*`` holds what XDM adds (health, XID errors, throttle reasons by
  name, NVLink errors, remapped rows, ECC corrected/uncorrected, clocks).
- ``share.*`` / ``mig.*`` hold what the instance was granted beside what it
  uses (per-grant samples labelled with the allocation id).
- ``summary`` is memory used/total (MiB) for whole cards, used/allotted
  (MiB) for shares and MIG units.

ECC mapping: the official plugin shows *corrected* error counts since the
driver loaded (volatile), per location (L1 cache, L2 cache, device memory).
NVML gives those here too. XDM reports only totals by kind, so there "ECC
memory errors" carries the corrected (single-bit) total over all locations
(its desc says so), "ECC L1 errors"/"ECC L2 errors" are "N/A", and both
totals are in ``xdm.``. "Encoder utilization", "Decoder utilization" and
"BAR1 buffer state" come from NVML (``nvml.companion`` on XDM nodes),
"N/A" without it.

A reading older than ``STALE_INTERVALS`` collection intervals keeps its
value but its desc starts with "stale: last update N s ago"; "Stats age"
shows the age of the newest reading where the CLI (which hides descs) can
see it. Missing readings are the string "N/A" with the unit, except the
official Temperature, Power usage and ECC stats of a reading NVML says the
card does not support (``nvml_unsupported``): those are int 0, as the
official plugin sends them. The eleven official stats carry its own
descriptions.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from google.protobuf import timestamp_pb2, wrappers_pb2

from nomad_plugin._proto.nomad import device_pb2, stats_pb2
from nomad_plugin.model.card import Card, Inventory
from nomad_plugin.model.instances import Catalog, Instance, Kind
from nomad_plugin.model.metrics import UNSUPPORTED_BITS
from nomad_plugin.stats.engine import (  # the facts both builders share: names, descriptions, bits
    DESC_BAR1,
    DESC_DECODER,
    DESC_ECC_L1,
    DESC_ECC_L2,
    DESC_ECC_MEMORY,
    DESC_ENCODER,
    DESC_GPU_UTIL,
    DESC_MEMORY_STATE,
    DESC_MEMORY_UTIL,
    DESC_POWER,
    DESC_TEMPERATURE,
    NOT_AVAILABLE,
    STALE_INTERVALS,
    THROTTLE_REASONS,
    GrantInfo,
    GrantOf,
)
from nomad_plugin.stats.feed import MetricsCache, Reading


def decode_throttle(mask: int) -> list[str]:
    """Names of the set bits; unknown bits as ``bit_0x...``."""
    names = [name for bit, name in THROTTLE_REASONS if mask & bit]
    known = 0
    for bit, _ in THROTTLE_REASONS:
        known |= bit
    rest = mask & ~known
    bit = 1
    while rest and bit <= rest:
        if rest & bit:
            names.append(f"bit_{bit:#x}")
        bit <<= 1
    return names


# -- StatValue builders ------------------------------------------------------


# What a StatValue shows, as a hashable tuple: (unit, desc, kind, value, denominator).
# kind "int": int_numerator_val = value, int_denominator_val = denominator when > 0; "ratio":
# both, the denominator even when 0;
# "bool": bool_val; "str": string_val.
Spec = tuple[str, str, str, int | bool | str, int]


def na_spec(unit: str, desc: str) -> Spec:
    return (unit, desc, "str", NOT_AVAILABLE, 0)


def stat_value(spec: Spec) -> stats_pb2.StatValue:
    """The StatValue a spec describes."""
    unit, desc, kind, value, denominator = spec
    out = stats_pb2.StatValue(unit=unit, desc=desc)
    if kind == "int":
        out.int_numerator_val.value = value  # type: ignore[assignment]  # in place: half the cost of a wrapper
        if denominator > 0:
            out.int_denominator_val.value = denominator
    elif kind == "ratio":  # an int ratio whose denominator is sent even when 0
        out.int_numerator_val.value = value  # type: ignore[assignment]
        out.int_denominator_val.SetInParent()
        out.int_denominator_val.value = denominator
    elif kind == "bool":
        out.bool_val.value = value  # type: ignore[assignment]
    else:
        out.string_val.value = value  # type: ignore[assignment]
    return out


class _Values:
    """Builds StatValues (or their specs), marking stale readings; remembers the newest reading seen."""

    def __init__(self, now: float, stale_after: float) -> None:
        self.now = now
        self.stale_after = stale_after
        self.newest: float | None = None

    def _desc(self, reading: Reading | None, desc: str) -> str:
        if reading is None:
            return desc
        if self.newest is None or reading.received > self.newest:
            self.newest = reading.received
        age = self.now - reading.received
        if age > self.stale_after:
            return f"stale: last update {age:.1f} s ago; {desc}"
        return desc

    def count_spec(self, reading: Reading | None, unit: str, desc: str, scale: float = 1.0) -> Spec:
        if reading is None:
            return (unit, desc, "str", NOT_AVAILABLE, 0)
        return (unit, self._desc(reading, desc), "int", round(reading.value * scale), 0)

    def ratio_spec(self, used: Reading | None, total: Reading | None, static_total: int, unit: str, desc: str) -> Spec:
        """``used / total``; ``static_total`` (> 0) stands in for a missing total reading."""
        if used is None:
            return (unit, desc, "str", NOT_AVAILABLE, 0)
        shown = self._desc(used, desc)
        denominator = round(total.value) if total is not None else static_total
        if total is not None:
            self._desc(total, desc)
        return (unit, shown, "int", round(used.value), denominator if denominator > 0 else 0)

    def flag_spec(self, reading: Reading | None, desc: str) -> Spec:
        if reading is None:
            return ("", desc, "str", NOT_AVAILABLE, 0)
        return ("", self._desc(reading, desc), "bool", reading.value != 0, 0)

    def text_spec(self, reading: Reading | None, text: str, desc: str) -> Spec:
        if reading is None:
            return ("", desc, "str", NOT_AVAILABLE, 0)
        return ("", self._desc(reading, desc), "str", text, 0)

    def count(self, reading: Reading | None, unit: str, desc: str, scale: float = 1.0) -> stats_pb2.StatValue:
        return stat_value(self.count_spec(reading, unit, desc, scale))

    def ratio(
        self, used: Reading | None, total: Reading | None, static_total: int, unit: str, desc: str
    ) -> stats_pb2.StatValue:
        return stat_value(self.ratio_spec(used, total, static_total, unit, desc))

    def flag(self, reading: Reading | None, desc: str) -> stats_pb2.StatValue:
        return stat_value(self.flag_spec(reading, desc))

    def text(self, reading: Reading | None, text: str, desc: str) -> stats_pb2.StatValue:
        return stat_value(self.text_spec(reading, text, desc))


def na(unit: str, desc: str) -> stats_pb2.StatValue:
    value = stats_pb2.StatValue(unit=unit, desc=desc)
    value.string_val.value = NOT_AVAILABLE
    return value


def _int(value: int, unit: str, desc: str) -> stats_pb2.StatValue:
    out = stats_pb2.StatValue(unit=unit, desc=desc)
    out.int_numerator_val.value = value
    return out


def _str(value: str, desc: str) -> stats_pb2.StatValue:
    out = stats_pb2.StatValue(desc=desc)
    out.string_val.value = value
    return out


# -- per-card and per-instance objects ---------------------------------------


# The card's attributes: (name, spec) pairs at the top level and in ``xdm``.
CardSpecs = tuple[list[tuple[str, Spec]], list[tuple[str, Spec]]]


# nomad-device-nvidia's descriptions of its eleven stats (stats.go), word for word: the API,
# `nomad alloc status -json` and whatever reads them get the same text from either plugin.


def _unsupported(r: Callable[[str], Reading | None]) -> int:
    """The ``nvml_unsupported`` mask: official readings NVML says the card does not have."""
    mask = r("nvml_unsupported")
    return int(mask.value) if mask is not None else 0


def _zero_if_unsupported(spec: Spec, name: str, mask: int) -> Spec:
    """nomad-device-nvidia shows a reading NVML does not support as 0 (its driver reads 0 then)."""
    if spec[2] == "str" and mask & UNSUPPORTED_BITS[name]:
        return (spec[0], spec[1], "int", 0, 0)
    return spec


def _power_usage(draw: Reading | None, mask: int, values: _Values) -> Spec:
    """ "Power usage" as nomad-device-nvidia (1.1.0 on) sends it: the draw in mW over the draw in whole W.

    Its unit says W and its desc "/ Maximum GPU Power", but its stats.go puts
    the raw milliwatt reading over the same draw in whole watts; dashboards built
    on it read that. The draw and the limit in W are ``xdm.Power draw``
    and ``xdm.Power limit``. NotSupported is 0 / 0, as there.
    """
    if draw is None:
        if mask & UNSUPPORTED_BITS["power_w"]:
            return ("W", DESC_POWER, "ratio", 0, 0)
        return na_spec("W", DESC_POWER)
    desc = values._desc(draw, DESC_POWER)
    return ("W", desc, "ratio", round(draw.value * 1000), int(draw.value))


def card_specs(readings: Mapping[str, Reading], card: Card | None, values: _Values) -> CardSpecs:
    """What the physical card's StatObject shows: official names at the top, XDM extras in ``xdm``."""
    r = readings.get
    total_mib = card.memory_mib if card is not None else 0
    count = values.count_spec
    mask = _unsupported(r)
    top = [
        (
            "Memory state",
            values.ratio_spec(r("memory_used_mib"), r("memory_total_mib"), total_mib, "MiB", DESC_MEMORY_STATE),
        ),
        ("GPU utilization", count(r("core_util_percent"), "%", DESC_GPU_UTIL)),
        ("Memory utilization", count(r("memory_util_percent"), "%", DESC_MEMORY_UTIL)),
        ("Temperature", _zero_if_unsupported(count(r("temperature_c"), "C", DESC_TEMPERATURE), "temperature_c", mask)),
        ("Power usage", _power_usage(r("power_w"), mask, values)),
    ]
    _official_extras(top, r, values, mask)

    throttle = r("throttle_reasons")
    if throttle is None:
        throttle_spec = na_spec("", "what holds the clocks down")
    else:
        names = decode_throttle(int(throttle.value))
        text = ", ".join(names) if names else "none"
        throttle_spec = values.text_spec(throttle, text, "what holds the clocks down")
    xdm = [
        ("Health", values.flag_spec(r("health"), "the backend's health verdict for the card (XDM or NVML)")),
        ("XID errors", count(r("xid_errors"), "#", "driver XID error events")),
        ("Throttle reasons", throttle_spec),
        ("NVLink errors", count(r("nvlink_errors_total"), "#", "NVLink error count")),
        ("Remapped rows", count(r("remapped_rows_total"), "#", "memory rows remapped")),
        ("ECC corrected errors", count(r("ecc_sbe_total"), "#", "corrected (single-bit) ECC errors")),
        ("ECC uncorrected errors", count(r("ecc_dbe_total"), "#", "uncorrected (double-bit) ECC errors")),
        ("Power draw", count(r("power_w"), "W", "power draw")),
        ("Power limit", count(r("power_limit_w"), "W", "power limit the card enforces")),
        ("SM clock", count(r("sm_clock_mhz"), "MHz", "compute clock")),
        ("Memory clock", count(r("memory_clock_mhz"), "MHz", "memory clock")),
    ]
    return top, xdm


def card_object(readings: Mapping[str, Reading], card: Card | None, values: _Values) -> stats_pb2.StatObject:
    """The physical card's StatObject (see ``card_specs``)."""
    top, xdm = card_specs(readings, card, values)
    obj = stats_pb2.StatObject()
    attrs = obj.attributes
    for name, spec in top:
        attrs[name].CopyFrom(stat_value(spec))
    nested = obj.nested["xdm"].attributes
    for name, spec in xdm:
        nested[name].CopyFrom(stat_value(spec))
    return obj


def _official_extras(
    top: list[tuple[str, Spec]], r: Callable[[str], Reading | None], values: _Values, mask: int = 0
) -> None:
    """nomad-device-nvidia's encoder/decoder, BAR1 and ECC stats, with its meanings.

    ECC counts are corrected errors since the driver loaded, per location.
    """
    count = values.count_spec
    top.append(("Encoder utilization", count(r("encoder_util_percent"), "%", DESC_ENCODER)))
    top.append(("Decoder utilization", count(r("decoder_util_percent"), "%", DESC_DECODER)))
    top.append(("BAR1 buffer state", values.ratio_spec(r("bar1_used_mib"), r("bar1_total_mib"), 0, "MiB", DESC_BAR1)))
    for name, reading, desc in (
        ("ECC L1 errors", "ecc_l1_corrected", DESC_ECC_L1),
        ("ECC L2 errors", "ecc_l2_corrected", DESC_ECC_L2),
    ):
        top.append((name, _zero_if_unsupported(count(r(reading), "#", desc), reading, mask)))
    by_location = any(r(n) is not None for n in ("ecc_l1_corrected", "ecc_l2_corrected", "ecc_memory_corrected"))
    if by_location or mask & UNSUPPORTED_BITS["ecc_memory_corrected"]:  # NVML's split; else XDM's total
        memory = _zero_if_unsupported(
            count(r("ecc_memory_corrected"), "#", DESC_ECC_MEMORY), "ecc_memory_corrected", mask
        )
    else:
        memory = count(r("ecc_sbe_total"), "#", "corrected ECC errors, all locations (XDM gives no split)")
    top.append(("ECC memory errors", memory))


@dataclass(frozen=True)
class _Allotment:
    grant: GrantInfo | None
    memory_mib: int  # 0 = unknown
    readings: Mapping[str, Reading]


def granted_specs(inst: Instance, allot: _Allotment, values: _Values) -> list[tuple[str, Spec]]:
    """The ``share``/``mig`` nested object's attributes: granted limits beside actual use."""
    grant = allot.grant
    specs: list[tuple[str, Spec]] = [
        ("Grant", ("", "XDM allocation holding this instance", "str", grant.grant_id if grant else "none", 0))
    ]
    if inst.kind is Kind.SHARE:
        core = grant.core_limit_percent if grant else inst.core
        specs.append(("Compute limit", ("%", "granted compute, percent of the card (0 = unlimited)", "int", core, 0)))
    else:
        specs.append(("Slice", ("", "MIG unit index on the card", "int", inst.index, 0)))
        slices = grant.slices if grant and grant.slices and inst.kind is Kind.MIG else inst.slices
        specs.append(("Slices", ("", "MIG compute slices", "int", slices, 0)))
    if inst.kind is Kind.MIG_INSTANCE:  # an existing instance: its own size, whatever else its grant holds
        memory_gib = allot.memory_mib // 1024
    else:
        memory_gib = grant.memory_limit_gib if grant and grant.memory_limit_gib else inst.memory_gib
    if memory_gib or allot.memory_mib:
        limit = memory_gib or allot.memory_mib // 1024
        specs.append(("Memory limit", ("GiB", "granted memory (0 = unlimited)", "int", limit, 0)))
    else:
        specs.append(("Memory limit", na_spec("GiB", "granted memory")))
    r = allot.readings.get
    if grant is None and not allot.readings:
        specs.append(("Memory used", ("MiB", "not reserved", "int", 0, 0)))
        specs.append(("Compute utilization", ("%", "not reserved", "int", 0, 0)))
    else:
        specs.append(("Memory used", values.count_spec(r("memory_used_mib"), "MiB", "memory used by this grant")))
        specs.append(
            ("Compute utilization", values.count_spec(r("core_util_percent"), "%", "compute used by this grant"))
        )
    return specs


def summary_spec(inst: Instance, allot: _Allotment, values: _Values) -> Spec:
    """Memory used / allotted (MiB) of a share or MIG unit."""
    used = allot.readings.get("memory_used_mib")
    if used is None and allot.grant is None and inst.kind is not Kind.MIG_INSTANCE:
        spec: Spec = ("MiB", "not reserved", "int", 0, 0)
    else:
        spec = values.count_spec(used, "MiB", "memory used / allotted")
    if allot.memory_mib > 0 and spec[2] == "int":
        spec = (spec[0], spec[1], "int", spec[3], allot.memory_mib)
    return spec


def _granted_part(obj: stats_pb2.StatObject, name: str, inst: Instance, allot: _Allotment, values: _Values) -> None:
    """The ``share``/``mig`` nested object (see ``granted_specs``)."""
    part = obj.nested[name].attributes
    for attr, spec in granted_specs(inst, allot, values):
        part[attr].CopyFrom(stat_value(spec))


def _summary(inst: Instance, allot: _Allotment, values: _Values) -> stats_pb2.StatValue:
    return stat_value(summary_spec(inst, allot, values))


def _allotment(inst: Instance, card: Card | None, grant: GrantInfo | None, cache: MetricsCache) -> _Allotment:
    card_mib = card.memory_mib if card is not None else 0
    memory_gib = grant.memory_limit_gib if grant and grant.memory_limit_gib else inst.memory_gib
    memory_mib = memory_gib * 1024
    readings = cache.grant_readings(grant.grant_id) if grant else {}
    if inst.kind is Kind.SHARE and memory_mib == 0:
        memory_mib = card_mib  # an unlimited share may use the whole card
    if inst.kind is Kind.MIG_INSTANCE:
        mig = next((m for m in (card.mig_instances if card else ()) if m.uuid == (inst.mig_uuid or inst.id)), None)
        memory_mib = mig.memory_mib if mig is not None else inst.memory_gib * 1024
        if not readings:
            readings = cache.card_readings([inst.mig_uuid or inst.id])
    return _Allotment(grant, memory_mib, readings)


def split_seconds(seconds: float) -> tuple[int, int]:
    """(seconds, nanos) as a Timestamp of ``seconds`` holds them (both stats paths use this)."""
    whole = int(seconds)
    return whole, int((seconds - whole) * 1e9)


def _timestamp(seconds: float) -> timestamp_pb2.Timestamp:
    ts = timestamp_pb2.Timestamp()
    ts.seconds, ts.nanos = split_seconds(seconds)
    return ts


def stats_age(age: float | None) -> stats_pb2.StatValue:
    """ "Stats age": seconds since the instance's newest reading (None: none yet), to 0.1 s."""
    if age is None:
        return na("s", "no reading received yet")
    return stats_pb2.StatValue(
        float_numerator_val=wrappers_pb2.DoubleValue(value=round(max(age, 0.0), 1)),
        unit="s",
        desc="seconds since the newest reading arrived",
    )


def _card_for(inst: Instance, inventory: Inventory) -> Card | None:
    return inventory.by_uuid(inst.card_uuid) or inventory.by_minor(inst.minor)


def build_stats(
    catalog: Catalog,
    inventory: Inventory,
    cache: MetricsCache,
    grant_of: GrantOf,
    now: float,
    interval: float,
    wall_offset: float = 0.0,
) -> device_pb2.StatsResponse:
    """One ``StatsResponse``: a group per catalog group, an entry per fingerprinted instance.

    ``now`` is on the cache's clock (ages, staleness); ``wall_offset`` turns that
    clock into wall time for the timestamps (0 when the cache runs on wall time).
    """
    stale_after = STALE_INTERVALS * (interval if interval > 0 else 1.0)
    card_cache: dict[str, tuple[stats_pb2.StatObject, float | None]] = {}
    response = device_pb2.StatsResponse()
    for group in catalog.groups:
        out = response.groups.add(vendor=group.key.vendor, type=group.key.device_type, name=group.key.name)
        for inst in group.instances:
            card = _card_for(inst, inventory)
            if inst.card_uuid not in card_cache:
                values = _Values(now, stale_after)
                readings = cache.card_readings([inst.card_uuid, str(inst.minor)])
                card_cache[inst.card_uuid] = (card_object(readings, card, values), values.newest)
            card_obj, card_newest = card_cache[inst.card_uuid]
            values = _Values(now, stale_after)
            values.newest = card_newest
            stats = out.instance_stats[inst.id]
            stats.stats.CopyFrom(card_obj)
            if inst.kind is Kind.WHOLE:
                stats.summary.CopyFrom(stats.stats.attributes["Memory state"])
            else:
                allot = _allotment(inst, card, grant_of(inst.id), cache)
                _granted_part(stats.stats, "share" if inst.kind is Kind.SHARE else "mig", inst, allot, values)
                stats.summary.CopyFrom(_summary(inst, allot, values))
            age = now - values.newest if values.newest is not None else None
            stats.stats.attributes["Stats age"].CopyFrom(stats_age(age))
            newest = values.newest if values.newest is not None else now
            stats.timestamp.CopyFrom(_timestamp(newest + wall_offset))
    return response
