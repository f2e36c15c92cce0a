"""Nomad's attribute values and its two constraint evaluators, as pure functions.

Attributes are ``plugins/shared/structs`` (``units.go``, ``attribute.go``): two
values compare only with known units of one base or with no known unit on
either side; integers compare as int64 in the base unit (``9 EiB`` wraps,
``1500 mW`` is ``1 W``), any float makes both 256-bit ``big.Float`` values,
where a NaN panics. ``scheduler/feasible/feasible.go`` has two evaluators:
``checkAttributeConstraint`` (:func:`check_attribute`: device rules, typed
sides) and ``checkConstraint`` (:func:`check_string`: node rules, string
sides). ``None`` is a side Nomad does not find.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from nomad_plugin.jobspec import golang
from nomad_plugin.jobspec.golang import parse_bool, parse_float, parse_int, round_big, trim_space, trunc_div, wrap_int64
from nomad_plugin.nomad_view.types import Attribute

BYTE, BYTE_RATE, HERTZ, WATT = "bytes", "bytes/s", "hertz", "watts"
BIG_PRECISION = 256  # the mantissa bits Nomad gives math/big values before comparing them


@dataclass(frozen=True)
class Unit:
    base: str
    multiplier: int
    inverse: bool = False  # base / multiplier (mW) instead of base * multiplier


def _unit_table() -> dict[str, Unit]:
    table = {"MHz": Unit(HERTZ, 10**6), "GHz": Unit(HERTZ, 10**9), "mW": Unit(WATT, 1000, inverse=True)}
    for power, name in enumerate(("KiB", "MiB", "GiB", "TiB", "PiB", "EiB"), start=1):
        table[name], table[name + "/s"] = Unit(BYTE, 1024**power), Unit(BYTE_RATE, 1024**power)
    for name, power in (("kB", 1), ("KB", 1), ("MB", 2), ("GB", 3), ("TB", 4), ("PB", 5), ("EB", 6)):
        table[name], table[name + "/s"] = Unit(BYTE, 1000**power), Unit(BYTE_RATE, 1000**power)
    for name, power in (("W", 0), ("kW", 1), ("MW", 2), ("GW", 3)):
        table[name] = Unit(WATT, 1000**power)
    return table


UNITS: dict[str, Unit] = _unit_table()
_BY_LENGTH = sorted(UNITS, key=lambda n: (-len(n), n))  # the longest suffix wins ("mW" before "W")
UNIT_NAMES = "KiB..EiB, kB/KB..EB, the same with /s, MHz, GHz, mW..GW"


def parse_attribute(text: str) -> Attribute:
    """``ParseAttribute``: a known unit suffix is cut, then ParseInt, ParseFloat, ParseBool (whole text), string."""
    if not text:
        return Attribute(text)
    unit, numeric = "", text
    if text[-1].isalpha():  # Go tests the last byte; only an ASCII letter can end a unit
        unit = next((name for name in _BY_LENGTH if text.endswith(name)), "")
        if unit:
            numeric = trim_space(text[: -len(unit)])
    for parse in (parse_int, parse_float):
        number = parse(numeric)
        if number is not None:
            return Attribute(number, unit)
    as_bool = parse_bool(text)
    return Attribute(text) if as_bool is None else Attribute(as_bool)


def kind(attr: Attribute) -> str:
    if isinstance(attr.value, bool):
        return "bool"
    return {int: "int", float: "float"}.get(type(attr.value), "string")


def _unit(attr: Attribute) -> Unit | None:
    return UNITS.get(attr.unit) if attr.unit else None


def _nan(attr: Attribute) -> bool:
    return isinstance(attr.value, float) and math.isnan(attr.value)


def render(attr: Attribute) -> str:
    if isinstance(attr.value, str):
        return repr(attr.value) if not attr.unit else f"{attr.value!r} {attr.unit}"
    if isinstance(attr.value, float) and not math.isfinite(attr.value):
        text = "NaN" if math.isnan(attr.value) else ("+Inf" if attr.value > 0 else "-Inf")
        return f"{text} {attr.unit}" if attr.unit else text
    return attr.render()


def comparable(a: Attribute, b: Attribute) -> str:
    """Empty when ``Attribute.Comparable`` holds for ``a`` and ``b``, else why not."""
    ua, ub = _unit(a), _unit(b)
    if ua is not None and ub is not None:
        return (
            ""
            if ua.base == ub.base
            else f"unit mismatch: {a.unit} ({ua.base}) cannot compare with {b.unit} ({ub.base})"
        )
    if ua is not None or ub is not None:
        with_unit, without = (a, b) if ua is not None else (b, a)
        if kind(without) == "string":
            return (
                f"{render(without)} is not a number with a unit: Nomad reads it as a string, which never "
                f"compares with {render(with_unit)} (write a number and a unit ending in a letter, e.g. "
                f'"80 GiB"; units: {UNIT_NAMES})'
            )
        return (
            f"unit mismatch: {render(with_unit)} has unit {with_unit.unit} but {render(without)} has none "
            f'(write the unit, e.g. "{render(without)} {with_unit.unit}")'
        )
    ka, kb = kind(a), kind(b)
    if ka in ("string", "bool") or kb in ("string", "bool"):
        return "" if ka == kb else f"type mismatch: {ka} {render(a)} vs {kb} {render(b)}"
    return ""


def exact_value(attr: Attribute) -> Fraction:
    """A finite number in its base unit (bytes, bytes/s, Hz, W), with exact arithmetic."""
    if isinstance(attr.value, bool) or not isinstance(attr.value, (int, float)):
        raise TypeError(f"{attr.value!r} is not a number")
    number, unit = Fraction(attr.value), _unit(attr)
    if unit is None:
        return number
    return number / unit.multiplier if unit.inverse else number * unit.multiplier


def nomad_int(attr: Attribute) -> int:
    """``getInt``: the integer in its base unit, with int64 overflow and truncating division."""
    assert isinstance(attr.value, int) and not isinstance(attr.value, bool)
    unit = _unit(attr)
    if unit is None:
        return attr.value
    return trunc_div(attr.value, unit.multiplier) if unit.inverse else wrap_int64(attr.value * unit.multiplier)


def _nomad_big(attr: Attribute) -> Fraction | float:
    """``getBigFloat``: the value at 256 bits in its base unit (an infinity stays a float)."""
    assert isinstance(attr.value, (int, float)) and not isinstance(attr.value, bool)
    unit = _unit(attr)
    if isinstance(attr.value, float) and math.isinf(attr.value):
        return attr.value
    number = Fraction(attr.value)
    if unit is None:
        return number
    multiplier = round_big(Fraction(1, unit.multiplier), BIG_PRECISION) if unit.inverse else Fraction(unit.multiplier)
    return round_big(number * multiplier, BIG_PRECISION)


def _sign(a: Any, b: Any) -> int:
    return int((a > b) - (a < b))


@dataclass(frozen=True)
class Comparison:
    """``Attribute.Compare``: ``order`` is None when the values do not compare."""

    order: int | None
    why: str = ""  # why they do not compare
    exact: int | None = None  # the order with exact arithmetic, for numbers
    panic: str = ""  # Go panics here (NaN in math/big): the scheduler fails the evaluation
    detail: str = ""  # the base-unit values Nomad compared, when its arithmetic is not exact


def compare(a: Attribute, b: Attribute) -> Comparison:
    """``a.Compare(b)``: -1/0/1; bools give 0 when equal and 1 when not (they have no order)."""
    why = comparable(a, b)
    if why and _nan(a) and _unit(a) is None and _unit(b) is None:
        # Comparable checks only the left side's type; Compare then makes it a big.Float before it finds
        # the right side is no number.
        return Comparison(None, why, panic=f"{render(a)} is NaN: Go's math/big panics on it (ErrNaN)")
    if why:
        return Comparison(None, why)
    ka, kb = kind(a), kind(b)
    if ka == "bool":
        return Comparison(0 if a.value == b.value else 1)
    if ka == "string":
        return Comparison(_sign(str(a.value), str(b.value)))  # code-point order is UTF-8 byte order, as Go's
    if kb not in ("int", "float"):
        return Comparison(None, f"type mismatch: {ka} {render(a)} vs {kb} {render(b)}")
    if ka == "int" and kb == "int":
        na, nb = nomad_int(a), nomad_int(b)
        detail = ""
        if (Fraction(na), Fraction(nb)) != (exact_value(a), exact_value(b)):
            base = (
                {BYTE: "bytes", BYTE_RATE: "bytes/s", HERTZ: "Hz", WATT: "W"}[u.base] if (u := _unit(a)) else "no unit"
            )
            detail = f"Nomad compares them as integers in the base unit: {na} vs {nb} ({base})"
        return Comparison(_sign(na, nb), exact=_sign(exact_value(a), exact_value(b)), detail=detail)
    for side in (a, b):
        if _nan(side):
            return Comparison(None, panic=f"{render(side)} is NaN: Go's math/big panics on it (ErrNaN)")
    exact = [s.value if isinstance(s.value, float) and math.isinf(s.value) else exact_value(s) for s in (a, b)]
    return Comparison(_sign(_nomad_big(a), _nomad_big(b)), exact=_sign(*exact))


def humanize(attr: Attribute) -> str:
    """An attribute plus its size in GiB when that helps (81559 MiB -> 79.6 GiB)."""
    text, unit = render(attr), _unit(attr)
    number = isinstance(attr.value, int) and not isinstance(attr.value, bool)
    if unit and unit.base == BYTE and (number or (isinstance(attr.value, float) and math.isfinite(attr.value))):
        gib = float(exact_value(attr)) / 1024**3
        if attr.unit != "GiB" and gib >= 1:
            text += f" (= {gib:.1f} GiB)"
    return text


# --- operators ----------------------------------------------------------------------------------

EQUAL = ("=", "==", "is")
NOT_EQUAL = ("!=", "not")
ORDER = ("<", "<=", ">", ">=")
SET_ALL = ("set_contains", "set_contains_all")
CLUSTER_OPERATORS = ("distinct_hosts", "distinct_property")  # node-set constraints: other iterators decide them
OPERATORS = (
    *EQUAL, *NOT_EQUAL, *ORDER, "version", "semver", "regexp", *SET_ALL, "set_contains_any", "is_set", "is_not_set",
)  # fmt: skip


@dataclass(frozen=True)
class Outcome:
    holds: bool
    why: str = ""  # why it does not hold when the values' meaning alone would not say (types, units, parsing)
    note: str = ""  # Nomad's arithmetic decided this, not the values' plain meaning
    panic: str = ""  # Nomad's scheduler panics evaluating it: the evaluation fails, nothing is placed

    def __bool__(self) -> bool:
        return self.holds


def _article(word: str) -> str:
    return f"an {word}" if word[0] in "aeiou" else f"a {word}"


def check_version(version_text: str, constraint_text: str, semver: bool) -> Outcome:
    """``checkVersionMatch``: the version read loosely, the constraint by go-version or Nomad's semver."""
    version = golang.parse_version(version_text)
    if version is None:
        return Outcome(False, f"{version_text!r} is not a version go-version reads")
    parsed = golang.parse_constraints(constraint_text, semver=semver)
    if isinstance(parsed, str):
        return Outcome(False, f"{constraint_text!r} is not a {'semver' if semver else 'version'} constraint: {parsed}")
    return Outcome(parsed.check(version))


def _unary(operator: str, left: object) -> Outcome | None:
    """What both evaluators decide before they look at the values."""
    if operator in CLUSTER_OPERATORS:
        return Outcome(True)
    if operator in ("is_set", "is_not_set"):
        return Outcome((left is not None) == (operator == "is_set"))
    if operator not in OPERATORS:
        return Outcome(False, f"unknown operator {operator!r}")
    return None


def _on_strings(operator: str, left: str, right: str) -> Outcome:
    """``regexp`` and the set operators, whose items are trimmed of white space."""
    if operator == "regexp":
        found = golang.search(right, left)
        if found is None:
            return Outcome(False, f"{right!r} is not a regular expression Go accepts: {golang.compile_error(right)}")
        return Outcome(found)
    have = {trim_space(item) for item in left.split(",")}
    wanted = [trim_space(item) in have for item in right.split(",")]
    return Outcome(all(wanted) if operator in SET_ALL else any(wanted))


def _from_order(operator: str, order: int) -> bool:
    """checkAttributeConstraint's reading of Compare's -1/0/1 (bools give only 0 and 1)."""
    if operator in EQUAL or operator in NOT_EQUAL:
        return (order == 0) == (operator in EQUAL)
    return {"<": order == -1, "<=": order != 1, ">": order == 1, ">=": order != -1}[operator]


def mismatch_hint(operator: str, left: Attribute, right: Attribute) -> str:
    """What to write when a type mismatch decides: Nomad never orders a string against a number
    (``Attribute.Comparable``), and ``version`` reads only a string or an integer attribute
    (``checkAttributeVersionMatch``), so ``cuda_driver_version >= "12.0"`` and ``compute_capability
    version ">= 8.0"`` fail whatever the values; the other operator works. "" when none would."""
    lk, rk = kind(left), kind(right)
    numeric = ("int", "float")
    if operator in ORDER and lk == "string" and rk in numeric and golang.parse_version(str(left.value)):
        return f': it is a version string, write operator = "version" and value = "{operator} {right.render()}"'
    if operator in ORDER and rk == "string" and lk in numeric and not right.unit:
        return f': it is a number, write a number as the value (e.g. value = "{left.render()}")'
    if operator in ("version", "semver") and lk == "float" and isinstance(right.value, str):
        first = right.value.split(",")[0].strip()
        op = next((o for o in ("<=", ">=", "<", ">", "=") if first.startswith(o)), ">=")
        number = first[len(op) :].strip() if first.startswith(op) else first
        return f': it is a number, write operator = "{op}" and value = "{number}"'
    return ""


def check_attribute(operator: str, left: Attribute | None, right: Attribute | None) -> Outcome:
    """``checkAttributeConstraint``: ``left <operator> right`` for device attributes."""
    decided = _unary(operator, left)
    if decided is not None:
        return decided
    if operator in NOT_EQUAL and (left is None) != (right is None):
        return Outcome(True)  # "nil != some"
    if left is None or right is None:
        return Outcome(False, "not found")
    if operator in EQUAL or operator in NOT_EQUAL or operator in ORDER:
        comparison = compare(left, right)
        if comparison.panic:
            return Outcome(False, comparison.panic, panic=comparison.panic)
        if comparison.order is None:
            return Outcome(False, comparison.why + mismatch_hint(operator, left, right))
        holds = _from_order(operator, comparison.order)
        note = ""
        if comparison.exact is not None and _from_order(operator, comparison.exact) != holds:
            how = comparison.detail or "Nomad compares them as 256-bit binary floats in the base unit"
            note = f"{how}; with exact arithmetic this would {'fail' if holds else 'hold'}"
        if isinstance(left.value, bool) and operator in ORDER:
            note = note or "bools have no order in Nomad: only >= always holds, <= and > mean equal and unequal"
        return Outcome(holds, note=note)
    if operator in ("version", "semver"):
        if kind(left) not in ("string", "int"):  # Nomad formats an integer attribute and reads it as a version
            return Outcome(
                False,
                f"{operator} needs a string or an integer, not {_article(kind(left))} ({render(left)})"
                + mismatch_hint(operator, left, right),
            )
        if not isinstance(right.value, str):
            return Outcome(
                False,
                f"{operator} needs a string constraint: Nomad reads {render(right)} as {_article(kind(right))} "
                f'(write an operator, e.g. "= {render(right)}" or ">= {render(right)}")',
            )
        return check_version(str(left.value), right.value, operator == "semver")
    if not isinstance(left.value, str) or not isinstance(right.value, str):
        side = right if not isinstance(right.value, str) else left
        return Outcome(False, f"{operator} compares strings only: Nomad reads {render(side)} as {_article(kind(side))}")
    return _on_strings(operator, left.value, right.value)


def check_string(operator: str, left: str | int | None, right: str | int | None) -> Outcome:
    """``checkConstraint``: ``left <operator> right`` for node values.

    An ``int`` side stands for a Go integer, which Nomad's tests pass: ``version`` formats it, the
    other operators refuse it.
    """
    decided = _unary(operator, left)
    if decided is not None:
        return decided
    if operator in NOT_EQUAL:
        lv, rv = ("" if left is None else left), ("" if right is None else right)  # Nomad holds "" when not found
        return Outcome(type(lv) is not type(rv) or lv != rv)
    if left is None or right is None:
        return Outcome(False, "not found")
    if operator in EQUAL:
        return Outcome(type(left) is type(right) and left == right)
    if operator in ("version", "semver"):
        if not isinstance(right, str):
            return Outcome(False, f"{operator} needs a string constraint")
        return check_version(str(left), right, operator == "semver")
    if not isinstance(left, str) or not isinstance(right, str):
        return Outcome(False, f"{operator} compares strings only")
    if operator in ORDER:
        return Outcome(_order_strings(operator, left, right))
    return _on_strings(operator, left, right)


def _order_strings(operator: str, left: str, right: str) -> bool:
    """``checkOrder``: as int64 when both parse, else as float64 when both parse, else lexically."""
    li, ri = parse_int(left), parse_int(right)
    lf, rf = parse_float(left), parse_float(right)
    if li is not None and ri is not None:
        order = _sign(li, ri)
    elif lf is not None and rf is not None:
        if math.isnan(lf) or math.isnan(rf):
            return False  # every comparison with NaN is false in Go
        order = _sign(lf, rf)
    else:
        order = _sign(left, right)
    return {"<": order < 0, "<=": order <= 0, ">": order > 0, ">=": order >= 0}[operator]
