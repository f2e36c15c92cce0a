"""The StatsResponse as bytes, assembled from parts built once (same content as ``layout.build_stats``).

Why: Nomad asks every second, and most of a response repeats. Every
instance carved from a card carries that card's whole StatObject, so
``build_stats`` copied it into each instance (7 copies per tdm card) and
gRPC then serialised the lot (2.8 MB at 256 cards x 7 shares, 185 ms;
issue 14). Here each card's object is built and serialised once per tick,
the share/MIG part of an instance that holds no grant (it has no readings,
so it never changes) once per catalog, and an instance's bytes are the
concatenation of its parts: in protobuf's wire format, concatenating two
serialised messages merges them (map entries add up), so this is exactly
the message ``build_stats`` returns, and it goes to gRPC as bytes, never
re-encoded. ``tests/stats/test_assemble.py`` checks the equality.

Everything an instance shows is still computed by ``layout``'s builders
(``card_object``, the granted part, the summary), so new attributes there
appear here unchanged.
"""

from __future__ import annotations

from nomad_plugin._proto.nomad import device_pb2, stats_pb2
from nomad_plugin.model.card import Card, Inventory
from nomad_plugin.model.instances import Catalog, Instance, Kind
from nomad_plugin.stats.cache import MetricsCache
from nomad_plugin.stats.layout import (
    STALE_INTERVALS,
    GrantLookup,
    Spec,
    _Allotment,
    _allotment,
    _timestamp,
    _Values,
    card_specs,
    granted_specs,
    split_seconds,
    stat_value,
    stats_age,
    summary_spec,
)

_LEN = 2  # wire type of strings, bytes and messages
_MAX_STATIC = 65536  # bound on cached static parts (far above any node's instances)
_MAX_HEADS = 4096  # bound on cached entry heads (a few per card and tick)
# Encoded attributes kept beyond what one build uses (see ``StatsAssembler.build``).
_MEMO_SLACK = 2048


def _varint(value: int) -> bytes:
    if value < 0x80:
        return _SMALL[value]
    if value < 0x4000:
        return bytes(((value & 0x7F) | 0x80, value >> 7))
    if value < 0x200000:
        return bytes(((value & 0x7F) | 0x80, ((value >> 7) & 0x7F) | 0x80, value >> 14))
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


_SMALL = [bytes((i,)) for i in range(0x80)]


def _field(number: int, payload: bytes) -> bytes:
    """One length-delimited field: tag, length, payload."""
    return _varint((number << 3) | _LEN) + _varint(len(payload)) + payload


_GROUPS = device_pb2.StatsResponse.DESCRIPTOR.fields_by_name["groups"].number
_INSTANCES = device_pb2.DeviceGroupStats.DESCRIPTOR.fields_by_name["instance_stats"].number
_MAP_KEY, _MAP_VALUE = 1, 2  # protobuf's map entry layout
_STATS = device_pb2.DeviceStats.DESCRIPTOR.fields_by_name["stats"].number
_NESTED = stats_pb2.StatObject.DESCRIPTOR.fields_by_name["nested"].number
_ATTRIBUTES = stats_pb2.StatObject.DESCRIPTOR.fields_by_name["attributes"].number
_XDM_KEY = _field(_MAP_KEY, b"xdm")
_SHARE_KEY = _field(_MAP_KEY, b"share")
_MIG_KEY = _field(_MAP_KEY, b"mig")
_SUMMARY = device_pb2.DeviceStats.DESCRIPTOR.fields_by_name["summary"].number
_INSTANCE_TAG = _varint((_INSTANCES << 3) | _LEN)
_VALUE_TAG = _varint((_MAP_VALUE << 3) | _LEN)


_TIMESTAMP = device_pb2.DeviceStats.DESCRIPTOR.fields_by_name["timestamp"].number
_SECONDS_TAG = _varint(1 << 3)  # google.protobuf.Timestamp: seconds = 1, nanos = 2, both varints
_NANOS_TAG = _varint(2 << 3)
_MAX_AGES = 4096  # bound on cached "Stats age" parts (a stale card shows a new age every tick)


def _age_part(age: float | None) -> bytes:
    """DeviceStats{stats: {"Stats age": ...}} for an age already rounded (None: no reading yet)."""
    part = device_pb2.DeviceStats()
    part.stats.attributes["Stats age"].CopyFrom(stats_age(age))
    return part.SerializeToString()


def _time_part(seconds: float) -> bytes:
    """DeviceStats{timestamp}, as ``layout._timestamp`` fills it and protobuf encodes it."""
    whole, nanos = split_seconds(seconds)
    if whole < 0 or nanos < 0:  # before 1970: leave negative varints to protobuf
        return device_pb2.DeviceStats(timestamp=_timestamp(seconds)).SerializeToString()
    stamp = (_SECONDS_TAG + _varint(whole) if whole else b"") + (_NANOS_TAG + _varint(nanos) if nanos else b"")
    return _field(_TIMESTAMP, stamp)


class _CardParts:
    """One card's parts for one tick."""

    __slots__ = ("body", "card", "newest", "tail", "whole_summary")

    def __init__(self, card: Card | None, body: bytes, newest: float | None, tail: bytes, whole_summary: bytes) -> None:
        self.card = card
        self.body = body  # DeviceStats{stats: the card's StatObject}
        self.newest = newest
        self.tail = tail  # "Stats age" + timestamp for an instance whose newest reading is the card's
        self.whole_summary = whole_summary  # DeviceStats{summary: "Memory state"}


class StatsAssembler:
    """Builds ``StatsResponse`` bytes; keeps the parts that do not change between ticks."""

    def __init__(self) -> None:
        # Encoded attributes by their (name, spec) pair, exactly as the layout lists them, so a
        # lookup needs no new key. Readings wander within a range, so after a few minutes nearly
        # every value a card shows has been encoded before (a 16-card node: about 6 new ones a
        # tick). New values accumulate, so the memo is emptied once it holds more than twice
        # what one build needs plus _MEMO_SLACK, and refilled by the next build.
        self._memo: dict[tuple[str, Spec], bytes] = {}
        self._values: dict[Spec, bytes] = {}  # StatValues alone (summaries), kept alike
        self._memo_limit = 0  # set by the first build after each emptying
        self._catalog: Catalog | None = None
        self._static: dict[tuple[str, int], bytes] = {}
        self._headers: dict[tuple[str, str, str], bytes] = {}
        self._ages: dict[float | None, bytes] = {}  # "Stats age" part by age (None: no reading yet)
        self._keys: dict[str, bytes] = {}  # instance id -> its encoded map key
        # (key length, value length) -> what goes around the key: the entry's tag and length, and
        # the value's tag and length. Few distinct pairs per tick (one or two per card).
        self._heads: dict[tuple[int, int], tuple[bytes, bytes]] = {}

    def build(
        self,
        catalog: Catalog,
        inventory: Inventory,
        cache: MetricsCache,
        grant_of: GrantLookup,
        now: float,
        interval: float,
        wall_offset: float = 0.0,
    ) -> bytes:
        if catalog is not self._catalog:
            self._catalog = catalog
            self._static.clear()
            self._keys.clear()
        stale_after = STALE_INTERVALS * (interval if interval > 0 else 1.0)
        fresh = len(self._memo) + len(self._values) > self._memo_limit
        if fresh:
            self._memo.clear()
            self._values.clear()
        cards: dict[str, _CardParts] = {}
        by_uuid: dict[str, Card] = {}
        by_minor: dict[int, Card] = {}
        for known in inventory.cards:  # first match wins, as Inventory.by_uuid/by_minor (linear scans)
            by_uuid.setdefault(known.uuid, known)
            by_minor.setdefault(known.minor, known)
        keys = self._keys
        heads = self._heads
        out: list[bytes] = []
        for group in catalog.groups:
            key = (group.key.vendor, group.key.device_type, group.key.name)
            header = self._headers.get(key)
            if header is None:
                header = device_pb2.DeviceGroupStats(vendor=key[0], type=key[1], name=key[2]).SerializeToString()
                self._headers[key] = header
            parts = [header]
            for inst in group.instances:
                card_parts = cards.get(inst.card_uuid)
                if card_parts is None:
                    card = by_uuid.get(inst.card_uuid) or by_minor.get(inst.minor)
                    card_parts = self._card_parts(inst, card, cache, now, stale_after, wall_offset)
                    cards[inst.card_uuid] = card_parts
                body = card_parts.body
                if inst.kind is Kind.WHOLE:
                    own, tail = card_parts.whole_summary, card_parts.tail
                else:
                    own, tail = self._instance(inst, card_parts, cache, grant_of, now, stale_after, wall_offset)
                key_bytes = keys.get(inst.id)
                if key_bytes is None:
                    key_bytes = keys[inst.id] = _field(_MAP_KEY, inst.id.encode())
                # Pieces, joined once per group: no per-instance copies of the (large) card body.
                # The two lengths before the body are the same for every instance of a card.
                body_len = len(body) + len(own) + len(tail)
                lengths = heads.get((len(key_bytes), body_len))
                if lengths is None:
                    if len(heads) >= _MAX_HEADS:
                        heads.clear()
                    value_head = _VALUE_TAG + _varint(body_len)
                    entry_len = len(key_bytes) + len(value_head) + body_len
                    lengths = heads[(len(key_bytes), body_len)] = (_INSTANCE_TAG + _varint(entry_len), value_head)
                parts += (lengths[0], key_bytes, lengths[1], body, own, tail)
            out.append(_field(_GROUPS, b"".join(parts)))
        if fresh:
            self._memo_limit = 2 * (len(self._memo) + len(self._values)) + _MEMO_SLACK
        return b"".join(out)

    def _card_parts(
        self, inst: Instance, card: Card | None, cache: MetricsCache, now: float, stale_after: float, wall_offset: float
    ) -> _CardParts:
        values = _Values(now, stale_after)
        readings = cache.card_readings([inst.card_uuid, str(inst.minor)])
        top, xdm = card_specs(readings, card, values)
        known, encode = self._memo.get, self._encode
        nested = _field(_MAP_VALUE, b"".join([known(item) or encode(item) for item in xdm]))
        obj = b"".join([known(item) or encode(item) for item in top]) + _field(_NESTED, _XDM_KEY + nested)
        body = _field(_STATS, obj)  # DeviceStats{stats: the card's StatObject}
        memory_state = next(spec for name, spec in top if name == "Memory state")
        summary = _field(_SUMMARY, self._value(memory_state))
        return _CardParts(card, body, values.newest, self._tail(values.newest, now, wall_offset), summary)

    def _tail(self, newest: float | None, now: float, wall_offset: float) -> bytes:
        """What every instance ends with: "Stats age" and the timestamp of its newest reading."""
        age = None if newest is None else round(max(now - newest, 0.0), 1)
        part = self._ages.get(age)
        if part is None:
            if len(self._ages) >= _MAX_AGES:
                self._ages.clear()
            part = self._ages[age] = _age_part(age)
        return part + _time_part((newest if newest is not None else now) + wall_offset)

    def _encode(self, item: tuple[str, Spec]) -> bytes:
        """One ``attributes`` map entry of a StatObject, encoded and kept (the memo had none)."""
        name, spec = item
        value = stat_value(spec).SerializeToString()
        found = self._memo[item] = _field(_ATTRIBUTES, _field(_MAP_KEY, name.encode()) + _field(_MAP_VALUE, value))
        return found

    def _instance(
        self,
        inst: Instance,
        parts: _CardParts,
        cache: MetricsCache,
        grant_of: GrantLookup,
        now: float,
        stale_after: float,
        wall_offset: float,
    ) -> tuple[bytes, bytes]:
        """A share's or MIG unit's own part and tail (the card body goes before them)."""
        card = parts.card
        grant = grant_of(inst.id)
        if grant is None and inst.kind is Kind.SHARE:
            # The common case, before any allotment is built: a share nobody holds has no readings
            # (what ``_allotment`` would find: its own memory, else the whole card's).
            memory_mib = inst.memory_gib * 1024 or (card.memory_mib if card is not None else 0)
            static = self._static.get((inst.id, memory_mib))
            if static is not None:
                return static, parts.tail
        allot = _allotment(inst, card, grant, cache)
        if grant is None and not allot.readings:
            # Nothing in it is a reading: the same bytes every tick until the catalog changes.
            key = (inst.id, allot.memory_mib)
            static = self._static.get(key)
            if static is None:
                static = self._own_part(inst, allot, _Values(now, stale_after))
                if len(self._static) < _MAX_STATIC:
                    self._static[key] = static
            return static, parts.tail
        values = _Values(now, stale_after)
        values.newest = parts.newest
        own = self._own_part(inst, allot, values)
        if values.newest == parts.newest:
            return own, parts.tail
        return own, self._tail(values.newest, now, wall_offset)

    def _own_part(self, inst: Instance, allot: _Allotment, values: _Values) -> bytes:
        """The instance's ``share``/``mig`` object and its summary, encoded: DeviceStats{stats, summary}."""
        known, encode = self._memo.get, self._encode
        inner = b"".join([known(item) or encode(item) for item in granted_specs(inst, allot, values)])
        key = _SHARE_KEY if inst.kind is Kind.SHARE else _MIG_KEY
        stats = _field(_STATS, _field(_NESTED, key + _field(_MAP_VALUE, inner)))
        return stats + _field(_SUMMARY, self._value(summary_spec(inst, allot, values)))

    def _value(self, spec: Spec) -> bytes:
        """One StatValue, encoded once per distinct spec (same bound as the attribute memo)."""
        found = self._values.get(spec)
        if found is None:
            found = self._values[spec] = stat_value(spec).SerializeToString()
        return found
