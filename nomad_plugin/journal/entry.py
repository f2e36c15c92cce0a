"""One journal entry and its JSON form (pure; no I/O)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace
from typing import Any

from nomad_plugin.model.grant import DeviceAsk, GrantedDevice


class EntryState(enum.Enum):
    #: Written before Allocate: the grant may or may not exist at XDM, and XDM may still
    #: commit it until ``settle_until``.
    INTENT = "intent"
    #: Allocate succeeded and Reserve returned (or is about to).
    GRANTED = "granted"
    #: To be released: a release failed (XDM down), or XDM may still commit the grant
    #: (``settle_until`` lies ahead); retried until a release at or after ``settle_until`` succeeds.
    RELEASING = "releasing"


@dataclass(frozen=True)
class JournalEntry:
    """What the plugin must remember about one grant to release it later."""

    grant_id: str
    device_ids: tuple[str, ...]
    group: str  # GroupKey as "vendor/type/name"
    kind: str  # model.instances.Kind value
    cards: tuple[str, ...]  # card UUIDs the grant touches
    asks: tuple[DeviceAsk, ...]
    created_at: float  # unix seconds
    state: EntryState = EntryState.INTENT
    granted: tuple[GrantedDevice, ...] = ()
    # Unix seconds until which XDM may still commit this grant: set on every
    # intent (its Allocate's deadline and one more), kept when the Allocate
    # ended without XDM's answer, 0 once XDM answered. Until then a release,
    # even one answered "not found", is not final and the entry stays.
    settle_until: float = 0.0

    def with_state(self, state: EntryState, granted: tuple[GrantedDevice, ...] | None = None) -> JournalEntry:
        return replace(self, state=state, granted=self.granted if granted is None else granted)

    def to_json(self) -> dict[str, Any]:
        return {
            "grant_id": self.grant_id,
            "device_ids": list(self.device_ids),
            "group": self.group,
            "kind": self.kind,
            "cards": list(self.cards),
            "asks": [
                {"minor": a.minor, "core": a.core, "memory_gib": a.memory_gib, "slices": a.slices} for a in self.asks
            ],
            "granted": [
                {
                    "minor": d.minor,
                    "uuid": d.uuid,
                    "core": d.core,
                    "memory_gib": d.memory_gib,
                    "slices": d.slices,
                    "mig_uuid": d.mig_uuid,
                }
                for d in self.granted
            ],
            "created_at": self.created_at,
            "state": self.state.value,
            "settle_until": self.settle_until,
        }

    @classmethod
    def from_json(cls, raw: Any) -> JournalEntry:
        """Parse one entry; raises ``ValueError`` naming the bad field."""
        if not isinstance(raw, dict):
            raise ValueError(f"entry is {type(raw).__name__}, not an object")
        return cls(
            grant_id=_str(raw, "grant_id"),
            device_ids=tuple(_str_list(raw, "device_ids")),
            group=_str(raw, "group"),
            kind=_str(raw, "kind"),
            cards=tuple(_str_list(raw, "cards")),
            asks=tuple(
                DeviceAsk(
                    minor=_int(a, "minor"),
                    core=_int(a, "core"),
                    memory_gib=_int(a, "memory_gib"),
                    slices=_int(a, "slices"),
                )
                for a in _obj_list(raw, "asks")
            ),
            granted=tuple(
                GrantedDevice(
                    minor=_int(d, "minor"),
                    uuid=_str(d, "uuid"),
                    core=_int(d, "core"),
                    memory_gib=_int(d, "memory_gib"),
                    slices=_int(d, "slices"),
                    mig_uuid=_str(d, "mig_uuid"),
                )
                for d in _obj_list(raw, "granted")
            ),
            created_at=_float(raw, "created_at"),
            state=_state(raw),
            settle_until=_float(raw, "settle_until") if "settle_until" in raw else 0.0,
        )


def _field(raw: dict[str, Any], name: str) -> Any:
    if name not in raw:
        raise ValueError(f"field {name!r} missing")
    return raw[name]


def _str(raw: dict[str, Any], name: str) -> str:
    value = _field(raw, name)
    if not isinstance(value, str):
        raise ValueError(f"field {name!r} = {value!r} is not a string")
    return value


def _int(raw: dict[str, Any], name: str) -> int:
    value = _field(raw, name)
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"field {name!r} = {value!r} is not an integer")
    return value


def _float(raw: dict[str, Any], name: str) -> float:
    value = _field(raw, name)
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise ValueError(f"field {name!r} = {value!r} is not a number")
    return float(value)


def _str_list(raw: dict[str, Any], name: str) -> list[str]:
    value = _field(raw, name)
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"field {name!r} = {value!r} is not a list of strings")
    return value


def _obj_list(raw: dict[str, Any], name: str) -> list[dict[str, Any]]:
    value = _field(raw, name)
    if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
        raise ValueError(f"field {name!r} is not a list of objects")
    return value


def _state(raw: dict[str, Any]) -> EntryState:
    value = _str(raw, "state")
    try:
        return EntryState(value)
    except ValueError:
        raise ValueError(f"field 'state' = {value!r} is not one of intent/granted/releasing") from None
