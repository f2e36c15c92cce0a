"""Nomad's ParseAttribute and unit-aware comparison (jobspec.operators)."""

from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nomad_plugin.jobspec.operators import UNITS, comparable, compare, exact_value, parse_attribute
from nomad_plugin.nomad_view.types import Attribute


@pytest.mark.parametrize(
    ("text", "value", "unit"),
    [
        ("80 GiB", 80, "GiB"),
        ("80GiB", 80, "GiB"),
        ("1.5GHz", 1.5, "GHz"),
        ("100 MiB/s", 100, "MiB/s"),
        ("250 W", 250, "W"),
        ("3 kW", 3, "kW"),
        ("7", 7, ""),
        ("-3", -3, ""),
        ("2.5", 2.5, ""),
        ("true", True, ""),
        ("t", True, ""),  # Go's ParseBool accepts t/T/TRUE/True
        ("False", False, ""),
        ("asw-001", "asw-001", ""),
        ("80 GB%", "80 GB%", ""),  # last char not a letter: no unit stripped, a string
        ("GiB", "GiB", ""),  # a unit alone is a string
        ("1_000", 1000.0, ""),  # ParseInt(base 10) refuses the underscore, ParseFloat takes it
        ("0x1p4", 16.0, ""),  # a Go hexadecimal float
        ("0x10", "0x10", ""),  # no p exponent: not a float, a string
        ("1e400", "1e400", ""),  # out of float64 range: ParseFloat errors, a string
        (" 5", " 5", ""),  # and surrounding spaces (without a unit)
        ("9223372036854775808", 9.223372036854776e18, ""),  # past int64: a float
        ("", "", ""),
    ],
)
def test_parse_attribute_like_nomad(text: str, value: object, unit: str) -> None:
    attr = parse_attribute(text)
    assert attr.value == value and type(attr.value) is type(value)
    assert attr.unit == unit


def test_longest_unit_suffix_wins() -> None:
    assert parse_attribute("5 MW").unit == "MW"  # not "W"
    assert parse_attribute("5 mW").unit == "mW"
    assert parse_attribute("5 KiB/s").unit == "KiB/s"


@given(st.integers(min_value=-(2**63), max_value=2**63 - 1), st.sampled_from(sorted(UNITS)))
def test_int_with_any_unit_round_trips(number: int, unit: str) -> None:
    for text in (f"{number} {unit}", f"{number}{unit}"):
        attr = parse_attribute(text)
        assert attr == Attribute(number, unit)


@given(st.floats(allow_nan=False, allow_infinity=False).filter(lambda f: not f.is_integer()))
def test_non_integer_floats_parse_as_floats(number: float) -> None:
    attr = parse_attribute(repr(number))
    assert isinstance(attr.value, float) and attr.value == number and attr.unit == ""


@given(st.text(alphabet="abcxyz-_/.%", min_size=1).filter(lambda s: s not in ("t", "f")))
def test_words_stay_strings(text: str) -> None:
    attr = parse_attribute(text)
    assert isinstance(attr.value, str)


@given(st.integers(min_value=0, max_value=10**6))
def test_binary_units_scale_by_1024(n: int) -> None:
    assert compare(Attribute(n * 1024, "MiB"), Attribute(n, "GiB")).order == 0
    assert compare(Attribute(n * 1000, "MB"), Attribute(n, "GB")).order == 0
    assert compare(Attribute(n * 1000, "MHz"), Attribute(n, "GHz")).order == 0
    assert compare(Attribute(n * 1000, "W"), Attribute(n, "kW")).order == 0
    assert compare(Attribute(n * 1000, "mW"), Attribute(n, "W")).order == 0


@given(st.integers(min_value=1, max_value=10**9), st.integers(min_value=1, max_value=10**9))
def test_order_is_consistent_across_units(a: int, b: int) -> None:
    result = compare(Attribute(a, "MiB"), Attribute(b, "KiB"))
    assert result.why == ""
    assert result.order == ((a * 1024 > b) - (a * 1024 < b))


def test_mixed_int_and_float_compare_exactly() -> None:
    assert compare(Attribute(81559, "MiB"), Attribute(79.5, "GiB")).order == 1
    assert compare(Attribute(81559, "MiB"), Attribute(80, "GiB")).order == -1
    assert exact_value(Attribute(1.5, "GiB")) == Fraction(3, 2) * 1024**3


def test_gib_and_gb_differ() -> None:
    assert compare(Attribute(80, "GiB"), Attribute(80, "GB")).order == 1


@pytest.mark.parametrize(
    ("a", "b", "fragment"),
    [
        (Attribute(1, "MiB"), Attribute(1, "MHz"), "unit mismatch: MiB (bytes) cannot compare with MHz (hertz)"),
        (Attribute(1, "MiB/s"), Attribute(1, "MiB"), "bytes/s"),
        (Attribute(1, "MiB"), Attribute(1), "has unit MiB but 1 has none"),
        (Attribute(1, "MiB"), Attribute("x"), "is not a number with a unit"),
        (Attribute("a"), Attribute(1), "type mismatch"),
        (Attribute(True), Attribute(1), "type mismatch"),
    ],
)
def test_incomparable_pairs_say_why(a: Attribute, b: Attribute, fragment: str) -> None:
    assert fragment in comparable(a, b)
    assert compare(a, b).order is None and compare(a, b).why


def test_strings_and_bools() -> None:
    assert compare(Attribute("a"), Attribute("b")).order == -1
    assert compare(Attribute(True), Attribute(True)).order == 0
    assert compare(Attribute(True), Attribute(False)).order == 1  # bools: equal or not, no order


def test_an_unknown_unit_counts_as_none_as_in_nomad() -> None:
    assert compare(Attribute(1, "%"), Attribute(1)).order == 0
