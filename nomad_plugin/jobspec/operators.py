"""Nomad's device attribute values: literal parsing and unit-aware comparison, as pure functions.

The facts are those of ``plugins/shared/structs`` (``units.go``,
``attribute.go``; nomad-protocol.md §5.3):

- ``ParseAttribute``: when the last character is a letter, the longest known
  unit suffix is cut and the rest trimmed; then Go's ``ParseInt`` (base 10),
  ``ParseFloat`` (so ``1_000`` and ``0x1p4`` are numbers) and ``ParseBool``
  (on the whole text) are tried, else the text is a string;
- two values compare only when both have known units of one base, or neither
  has a known unit (an unknown unit counts as none); strings compare with
  strings, bools with bools (equal or not: there is no order), numbers with
  numbers;
- two integers compare as ``int64`` values in the base unit: the multiplier
  can overflow (``9 EiB`` wraps negative) and milliwatts are divided by 1000
  with truncation (``1500 mW`` is ``1 W``); any float side makes both
  256-bit ``big.Float`` values (a milliwatt is then ``x * round(1/1000)``),
  and a NaN there makes Go panic (also when a NaN on the left meets a string
  or a bool: Go's ``Comparable`` looks only at the left side's type).

:func:`compare` returns Nomad's answer and, for numbers, the exact one, so a
caller can say when Nomad's arithmetic decides a verdict.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

from nomad_plugin.jobspec import golang
from nomad_plugin.jobspec.golang import parse_bool, parse_float, parse_int, round_big, trim_space, trunc_div, wrap_int64
from nomad_plugin.nomad_view.types import Attribute

BYTE, BYTE_RATE, HERTZ, WATT = "bytes", "bytes/s", "hertz", "watts"
BIG_PRECISION = 256  # the mantissa bits Nomad gives math/big values before comparing them


@dataclass(frozen=True)
class Unit:
    name: str
    base: str
    multiplier: int
    inverse: bool = False  # base / multiplier (mW) instead of base * multiplier


def _unit_table() -> dict[str, Unit]:
    table: dict[str, Unit] = {}
    for power, name in enumerate(("KiB", "MiB", "GiB", "TiB", "PiB", "EiB"), start=1):
        table[name] = Unit(name, BYTE, 1024**power)
        table[name + "/s"] = Unit(name + "/s", BYTE_RATE, 1024**power)
    for name, power in (("kB", 1), ("KB", 1), ("MB", 2), ("GB", 3), ("TB", 4), ("PB", 5), ("EB", 6)):
        table[name] = Unit(name, BYTE, 1000**power)
        table[name + "/s"] = Unit(name + "/s", BYTE_RATE, 1000**power)
    table["MHz"] = Unit("MHz", HERTZ, 10**6)
    table["GHz"] = Unit("GHz", HERTZ, 10**9)
    table["mW"] = Unit("mW", WATT, 1000, inverse=True)
    for name, power in (("W", 0), ("kW", 1), ("MW", 2), ("GW", 3)):
        table[name] = Unit(name, WATT, 1000**power)
    return table


UNITS: dict[str, Unit] = _unit_table()
# Longest first: "MiB/s" before "B/s"-less names, "kW" and "mW" before "W". Two names of one
# length are never both suffixes of one text, so their relative order does not matter.
_BY_LENGTH = sorted(UNITS, key=lambda n: (-len(n), n))
UNIT_NAMES = "KiB..EiB, kB/KB..EB, the same with /s, MHz, GHz, mW..GW"


def parse_attribute(text: str) -> Attribute:
    """Nomad's ``ParseAttribute``: ``"80 GiB"`` -> 80 GiB, ``".98   GiB/s"`` -> 0.98 GiB/s, ``"t"`` -> true."""
    if not text:
        return Attribute(text)
    unit = ""
    numeric = text
    if text[-1].isalpha():  # Go tests the last byte; only an ASCII letter can end a unit
        unit = next((name for name in _BY_LENGTH if text.endswith(name)), "")
        if unit:
            numeric = trim_space(text[: -len(unit)])
    as_int = parse_int(numeric)
    if as_int is not None:
        return Attribute(as_int, unit)
    as_float = parse_float(numeric)
    if as_float is not None:
        return Attribute(as_float, unit)
    as_bool = parse_bool(text)
    if as_bool is not None:
        return Attribute(as_bool)
    return Attribute(text)


def kind(attr: Attribute) -> str:
    if isinstance(attr.value, bool):
        return "bool"
    if isinstance(attr.value, int):
        return "int"
    if isinstance(attr.value, float):
        return "float"
    return "string"


def _typed_unit(attr: Attribute) -> Unit | None:
    return UNITS.get(attr.unit) if attr.unit else None


def render(attr: Attribute) -> str:
    if isinstance(attr.value, str):
        return repr(attr.value) if not attr.unit else f"{attr.value!r} {attr.unit}"
    if isinstance(attr.value, float) and not math.isfinite(attr.value):
        text = "NaN" if math.isnan(attr.value) else ("+Inf" if attr.value > 0 else "-Inf")
        return f"{text} {attr.unit}" if attr.unit else text
    return attr.render()


def comparable(a: Attribute, b: Attribute) -> str:
    """Empty when Nomad's ``Attribute.Comparable`` holds for ``a`` and ``b``, else why not."""
    ua, ub = _typed_unit(a), _typed_unit(b)
    if ua is not None and ub is not None:
        if ua.base != ub.base:
            return f"unit mismatch: {a.unit} ({ua.base}) cannot compare with {b.unit} ({ub.base})"
        return ""
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
    number = Fraction(attr.value)
    unit = _typed_unit(attr)
    if unit is None:
        return number
    return number / unit.multiplier if unit.inverse else number * unit.multiplier


def nomad_int(attr: Attribute) -> int:
    """``getInt``: the integer in its base unit with int64 overflow and truncating division."""
    assert isinstance(attr.value, int) and not isinstance(attr.value, bool)
    unit = _typed_unit(attr)
    if unit is None:
        return attr.value
    if unit.inverse:
        return trunc_div(attr.value, unit.multiplier)
    return wrap_int64(attr.value * unit.multiplier)


def _nomad_big(attr: Attribute) -> Fraction | float:
    """``getBigFloat``: the value at 256 bits in its base unit (an infinity stays a float)."""
    assert isinstance(attr.value, (int, float)) and not isinstance(attr.value, bool)
    unit = _typed_unit(attr)
    if isinstance(attr.value, float) and math.isinf(attr.value):
        return attr.value  # inf times a positive multiplier is the same inf
    number = Fraction(attr.value)
    if unit is None:
        return number
    multiplier = round_big(Fraction(1, unit.multiplier), BIG_PRECISION) if unit.inverse else Fraction(unit.multiplier)
    return round_big(number * multiplier, BIG_PRECISION)


def _sign(a: Fraction | float, b: Fraction | float) -> int:
    return (a > b) - (a < b)


@dataclass(frozen=True)
class Comparison:
    """Nomad's ``Attribute.Compare``: ``order`` is None when the values do not compare."""

    order: int | None
    why: str = ""  # why they do not compare
    exact: int | None = None  # the order with exact arithmetic, for numbers
    panic: str = ""  # Go panics here (NaN in math/big): the scheduler fails the evaluation
    detail: str = ""  # the base-unit values Nomad compared, when its arithmetic is not exact


def compare(a: Attribute, b: Attribute) -> Comparison:
    """``a.Compare(b)``: -1/0/1; bools give 0 when equal and 1 when not (they have no order)."""
    why = comparable(a, b)
    if why and _nan(a) and _typed_unit(a) is None and _typed_unit(b) is None:
        # Go's Comparable holds for any number on the left (it checks only the left side's type); the
        # comparison then turns the left side into a big.Float before it finds the right one is no number.
        return Comparison(None, why, panic=f"{render(a)} is NaN: Go's math/big panics on it (ErrNaN)")
    if why:
        return Comparison(None, why)
    ka, kb = kind(a), kind(b)
    if ka == "bool":
        return Comparison(0 if a.value == b.value else 1)
    if ka == "string":
        sa, sb = str(a.value), str(b.value)  # code-point order is UTF-8 byte order, as Go's
        return Comparison((sa > sb) - (sa < sb))
    if kb not in ("int", "float"):
        return Comparison(None, f"type mismatch: {ka} {render(a)} vs {kb} {render(b)}")
    if ka == "int" and kb == "int":
        na, nb = nomad_int(a), nomad_int(b)
        exact = _sign(exact_value(a), exact_value(b))
        detail = ""
        if (Fraction(na), Fraction(nb)) != (exact_value(a), exact_value(b)):
            detail = f"Nomad compares them as integers in the base unit: {na} vs {nb} ({_base(a)})"
        return Comparison(_sign(na, nb), exact=exact, detail=detail)
    for side in (a, b):
        if isinstance(side.value, float) and math.isnan(side.value):
            return Comparison(None, panic=f"{render(side)} is NaN: Go's math/big panics on it (ErrNaN)")
    fa, fb = _nomad_big(a), _nomad_big(b)
    exact = _sign(_exact_or_inf(a), _exact_or_inf(b))
    return Comparison(_sign(fa, fb), exact=exact)


def _nan(attr: Attribute) -> bool:
    return isinstance(attr.value, float) and math.isnan(attr.value)


def _exact_or_inf(attr: Attribute) -> Fraction | float:
    if isinstance(attr.value, float) and math.isinf(attr.value):
        return attr.value
    return exact_value(attr)


def _base(attr: Attribute) -> str:
    unit = _typed_unit(attr)
    return {BYTE: "bytes", BYTE_RATE: "bytes/s", HERTZ: "Hz", WATT: "W"}[unit.base] if unit else "no unit"


def humanize(attr: Attribute) -> str:
    """An attribute plus its size in a friendlier unit when that helps (81559 MiB -> 79.6 GiB)."""
    text = render(attr)
    unit = _typed_unit(attr)
    if unit and unit.base == BYTE and isinstance(attr.value, (int, float)) and not isinstance(attr.value, bool):
        if isinstance(attr.value, float) and not math.isfinite(attr.value):
            return text
        gib = float(exact_value(attr)) / 1024**3
        if attr.unit != "GiB" and gib >= 1:
            text += f" (= {gib:.1f} GiB)"
    return text


# --- operators.py ------------------------------------------------------------------------------
# Nomad's constraint and affinity operators as pure functions of (operator, left value, right value).
#
# Two evaluators, because Nomad has two (``scheduler/feasible/feasible.go``):
#
# - :func:`check_attribute` is ``checkAttributeConstraint``: device
#   constraints and affinities, whose sides are typed attributes
#   (:class:`~nomad_plugin.nomad_view.types.Attribute`; a literal is read with
#   :func:`~nomad_plugin.jobspec.units.parse_attribute`). ``None`` is a side
#   that was not found.
# - :func:`check_string` is ``checkConstraint``: job, group and task
#   constraints and affinities on node values (``${attr.*}``, ``${meta.*}``,
#   ``${node.*}``), whose sides are strings. ``None`` is a value the node does
#   not have (Nomad then holds ``""`` and "not found").
#
# Both return an :class:`Outcome`: whether it holds, and the words a job
# author needs when it does not (or when Nomad's arithmetic, not the values'
# plain meaning, decided it).


EQUAL = ("=", "==", "is")
NOT_EQUAL = ("!=", "not")
ORDER = ("<", "<=", ">", ">=")
SET_ALL = ("set_contains", "set_contains_all")
NOT_HANDLED = ("distinct_hosts", "distinct_property")  # node-set constraints: other iterators decide them
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


def _from_order(operator: str, order: int) -> bool:
    """checkAttributeConstraint's reading of Compare's -1/0/1 (bools give only 0 and 1)."""
    return {
        "=": order == 0, "==": order == 0, "is": order == 0, "!=": order != 0, "not": order != 0,
        "<": order == -1, "<=": order != 1, ">": order == 1, ">=": order != -1,
    }[operator]  # fmt: skip


def _article(word: str) -> str:
    return f"an {word}" if word[0] in "aeiou" else f"a {word}"


def _string_of(attr: Attribute) -> str | None:
    return attr.value if isinstance(attr.value, str) else None


def set_contains_all(left: str, right: str) -> bool:
    """Every comma-separated item of ``right`` is one of ``left``'s (items trimmed of white space)."""
    have = {trim_space(item) for item in left.split(",")}
    return all(trim_space(item) in have for item in right.split(","))


def set_contains_any(left: str, right: str) -> bool:
    have = {trim_space(item) for item in left.split(",")}
    return any(trim_space(item) in have for item in right.split(","))


def check_version(version_text: str, constraint_text: str, semver: bool) -> Outcome:
    """``checkVersionMatch``: the version read loosely, the constraint by go-version or Nomad's semver."""
    version = golang.parse_version(version_text)
    if version is None:
        return Outcome(False, f"{version_text!r} is not a version go-version reads")
    parsed = golang.parse_constraints(constraint_text, semver=semver)
    if isinstance(parsed, str):
        return Outcome(False, f"{constraint_text!r} is not a {'semver' if semver else 'version'} constraint: {parsed}")
    return Outcome(parsed.check(version))


def check_regexp(text: str, pattern: str) -> Outcome:
    found = golang.search(pattern, text)
    if found is None:
        return Outcome(False, f"{pattern!r} is not a regular expression Go accepts: {golang.compile_error(pattern)}")
    return Outcome(found)


def check_attribute(operator: str, left: Attribute | None, right: Attribute | None) -> Outcome:
    """``checkAttributeConstraint``: ``left <operator> right`` for device attributes (None: not found)."""
    if operator in NOT_HANDLED:
        return Outcome(True)
    if operator == "is_set":
        return Outcome(left is not None)
    if operator == "is_not_set":
        return Outcome(left is None)
    if operator not in OPERATORS:
        return Outcome(False, f"unknown operator {operator!r}")
    if operator in NOT_EQUAL and (left is None) != (right is None):
        return Outcome(True)  # one side missing: "nil != some"
    if left is None or right is None:
        return Outcome(False, "not found")
    if operator in EQUAL or operator in NOT_EQUAL or operator in ORDER:
        comparison = compare(left, right)
        if comparison.panic:
            return Outcome(False, comparison.panic, panic=comparison.panic)
        if comparison.order is None:
            return Outcome(False, comparison.why)
        holds = _from_order(operator, comparison.order)
        note = ""
        if comparison.exact is not None and _from_order(operator, comparison.exact) != holds:
            how = comparison.detail or "Nomad compares them as 256-bit binary floats in the base unit"
            note = f"{how}; with exact arithmetic this would {'fail' if holds else 'hold'}"
        if isinstance(left.value, bool) and operator in ORDER:
            note = note or "bools have no order in Nomad: only >= always holds, <= and > mean equal and unequal"
        return Outcome(holds, note=note)
    if operator in ("version", "semver"):
        if isinstance(left.value, str):
            version_text = left.value
        elif isinstance(left.value, int) and not isinstance(left.value, bool):
            version_text = str(left.value)  # Nomad formats an integer attribute and reads it as a version
        else:
            return Outcome(
                False, f"{operator} needs a string or an integer, not {_article(kind(left))} ({render(left)})"
            )
        constraint_text = _string_of(right)
        if constraint_text is None:
            return Outcome(
                False,
                f"{operator} needs a string constraint: Nomad reads {render(right)} as {_article(kind(right))} "
                f'(write an operator, e.g. "= {render(right)}" or ">= {render(right)}")',
            )
        return check_version(version_text, constraint_text, operator == "semver")
    ls, rs = _string_of(left), _string_of(right)
    if ls is None or rs is None:
        side = right if rs is None else left
        return Outcome(
            False,
            f"{operator} compares strings only: Nomad reads {render(side)} as {_article(kind(side))}",
        )
    if operator == "regexp":
        return check_regexp(ls, rs)
    if operator in SET_ALL:
        return Outcome(set_contains_all(ls, rs))
    return Outcome(set_contains_any(ls, rs))


def _ordered(operator: str, order: int) -> bool:
    return {"<": order < 0, "<=": order <= 0, ">": order > 0, ">=": order >= 0}[operator]


def _order_strings(operator: str, left: str, right: str) -> bool:
    """``checkOrder``: as int64 when both parse, else as float64 when both parse, else lexically."""
    li, ri = parse_int(left), parse_int(right)
    if li is not None and ri is not None:
        return _ordered(operator, (li > ri) - (li < ri))
    lf, rf = parse_float(left), parse_float(right)
    if lf is not None and rf is not None:
        if math.isnan(lf) or math.isnan(rf):
            return False  # every comparison with NaN is false in Go
        return _ordered(operator, (lf > rf) - (lf < rf))
    return _ordered(operator, (left > right) - (left < right))


def check_string(operator: str, left: str | int | None, right: str | int | None) -> Outcome:
    """``checkConstraint``: ``left <operator> right`` for node values (None: not found).

    An ``int`` side stands for a Go integer, which Nomad's tests pass: ``version`` formats it, the
    other operators refuse it.
    """
    if operator in NOT_HANDLED:
        return Outcome(True)
    if operator == "is_set":
        return Outcome(left is not None)
    if operator == "is_not_set":
        return Outcome(left is None)
    if operator not in OPERATORS:
        return Outcome(False, f"unknown operator {operator!r}")
    if operator in NOT_EQUAL:
        lv, rv = ("" if left is None else left), ("" if right is None else right)
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
    if operator == "regexp":
        return check_regexp(left, right)
    if operator in SET_ALL:
        return Outcome(set_contains_all(left, right))
    return Outcome(set_contains_any(left, right))
