"""Nomad's attribute literals and unit-aware comparison, as pure functions.

Mirrors ``plugins/shared/structs/{units.go,util.go,attribute.go}``
(nomad-protocol.md §5.3): a constraint value such as ``"80 GiB"`` is parsed
by ``ParseAttribute`` (strip the longest known unit suffix when the last
character is a letter, then int, float, bool, else string), and two
attributes compare only when both carry units of the same base, or neither
does; numbers are converted to the base unit first.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from decimal import Decimal
from fractions import Fraction

from nomad_plugin.nomad_view.types import Attribute

BYTE, BYTE_RATE, HERTZ, WATT = "bytes", "bytes/s", "hertz", "watts"


@dataclass(frozen=True)
class Unit:
    name: str
    base: str
    multiplier: Fraction


def _unit_table() -> dict[str, Unit]:
    table: dict[str, Unit] = {}
    binary = ("KiB", "MiB", "GiB", "TiB", "PiB", "EiB")
    decimal = (("kB", 1), ("KB", 1), ("MB", 2), ("GB", 3), ("TB", 4), ("PB", 5), ("EB", 6))
    for power, name in enumerate(binary, start=1):
        table[name] = Unit(name, BYTE, Fraction(1024**power))
        table[name + "/s"] = Unit(name + "/s", BYTE_RATE, Fraction(1024**power))
    for name, power in decimal:
        table[name] = Unit(name, BYTE, Fraction(1000**power))
        table[name + "/s"] = Unit(name + "/s", BYTE_RATE, Fraction(1000**power))
    table["MHz"] = Unit("MHz", HERTZ, Fraction(10**6))
    table["GHz"] = Unit("GHz", HERTZ, Fraction(10**9))
    for name, power in (("mW", 0), ("W", 1), ("kW", 2), ("MW", 3), ("GW", 4)):
        table[name] = Unit(name, WATT, Fraction(1000**power))
    return table


UNITS: dict[str, Unit] = _unit_table()
# Longest first, so "MiB/s" wins over "s"-less names and "kW" over "W".
_BY_LENGTH = sorted(UNITS, key=lambda n: (-len(n), n))

_GO_INT = re.compile(r"[+-]?[0-9]+")
_GO_FLOAT = re.compile(r"[+-]?(?:(?:[0-9]+(?:_[0-9]+)*)?\.?[0-9]*(?:[eE][+-]?[0-9]+)?|inf|infinity|nan)", re.IGNORECASE)
_GO_BOOL = {"1": True, "t": True, "T": True, "TRUE": True, "true": True, "True": True}
_GO_BOOL.update({"0": False, "f": False, "F": False, "FALSE": False, "false": False, "False": False})
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


def _go_parse_int(text: str) -> int | None:
    if not _GO_INT.fullmatch(text):
        return None
    value = int(text)
    return value if INT64_MIN <= value <= INT64_MAX else None


def _go_parse_float(text: str) -> float | None:
    """strconv.ParseFloat(text, 64) for decimal input (no underscores, no surrounding spaces)."""
    if not text or "_" in text or not _GO_FLOAT.fullmatch(text) or not any(c.isdigit() or c in "iInN" for c in text):
        return None
    try:
        return float(text)
    except ValueError:
        return None


def parse_attribute(text: str) -> Attribute:
    """Nomad's ``ParseAttribute``: ``"80 GiB"`` -> 80 GiB, ``"1.5GHz"`` -> 1.5 GHz, ``"true"`` -> bool."""
    if not text:
        return Attribute(text)
    unit = ""
    numeric = text
    if text[-1].isalpha():
        for name in _BY_LENGTH:
            if text.endswith(name):
                unit = name
                break
        if unit:
            numeric = text[: -len(unit)].strip()
    as_int = _go_parse_int(numeric)
    if as_int is not None:
        return Attribute(as_int, unit)
    as_float = _go_parse_float(numeric)
    if as_float is not None:
        return Attribute(as_float, unit)
    if text in _GO_BOOL:
        return Attribute(_GO_BOOL[text])
    return Attribute(text)


def kind(attr: Attribute) -> str:
    if isinstance(attr.value, bool):
        return "bool"
    if isinstance(attr.value, int):
        return "int"
    if isinstance(attr.value, float):
        return "float"
    return "string"


def comparable(a: Attribute, b: Attribute) -> str:
    """Empty when ``a`` and ``b`` compare, else why not (the words check-job prints)."""
    if a.unit or b.unit:
        ua, ub = UNITS.get(a.unit), UNITS.get(b.unit)
        if a.unit and ua is None:
            return f"unknown unit {a.unit!r}"
        if b.unit and ub is None:
            return f"unknown unit {b.unit!r}"
        if ua is None or ub is None:
            with_unit, without = (a, b) if ua is not None else (b, a)
            if kind(without) == "string":
                return (
                    f"{render(without)} is not a number with a unit: Nomad reads it as a string, which never "
                    f"compares with {render(with_unit)} (write a number and a unit ending in a letter, e.g. "
                    '"80 GiB"; units: KiB..EiB, kB..EB, the same with /s, MHz, GHz, mW..GW)'
                )
            return (
                f"unit mismatch: {render(with_unit)} has unit {with_unit.unit} but {render(without)} has none "
                f'(write the unit, e.g. "{render(without)} {with_unit.unit}")'
            )
        if ua.base != ub.base:
            return f"unit mismatch: {a.unit} ({ua.base}) cannot compare with {b.unit} ({ub.base})"
        return ""
    ka, kb = kind(a), kind(b)
    if ka == "string" or kb == "string":
        return "" if ka == kb else f"type mismatch: {ka} {render(a)} vs {kb} {render(b)}"
    if ka == "bool" or kb == "bool":
        return "" if ka == kb else f"type mismatch: {ka} {render(a)} vs {kb} {render(b)}"
    return ""


def base_value(attr: Attribute) -> Fraction:
    """A numeric attribute in its base unit (bytes, bytes/s, Hz, mW), exactly."""
    if isinstance(attr.value, bool) or not isinstance(attr.value, (int, float)):
        raise TypeError(f"{attr.value!r} is not a number")
    number = Fraction(Decimal(attr.value)) if isinstance(attr.value, float) else Fraction(attr.value)
    unit = UNITS.get(attr.unit)
    return number * unit.multiplier if unit else number


def compare(a: Attribute, b: Attribute) -> tuple[int, str]:
    """(-1/0/1, "") when comparable, else (0, reason). Bools compare for equality only (1 = differ)."""
    why = comparable(a, b)
    if why:
        return 0, why
    if kind(a) == "bool":
        return (0 if a.value == b.value else 1), ""
    if kind(a) == "string":
        sa, sb = str(a.value), str(b.value)
        return (sa > sb) - (sa < sb), ""
    va, vb = base_value(a), base_value(b)
    return (va > vb) - (va < vb), ""


def render(attr: Attribute) -> str:
    if isinstance(attr.value, str):
        return repr(attr.value) if not attr.unit else f"{attr.value} {attr.unit}"
    return attr.render()


def humanize(attr: Attribute) -> str:
    """An attribute plus its size in a friendlier unit when that helps (81559 MiB -> 79.6 GiB)."""
    text = render(attr)
    unit = UNITS.get(attr.unit)
    if unit and unit.base == BYTE and not isinstance(attr.value, bool):
        gib = float(base_value(attr)) / 1024**3
        if attr.unit != "GiB" and gib >= 1:
            text += f" (= {gib:.1f} GiB)"
    return text
