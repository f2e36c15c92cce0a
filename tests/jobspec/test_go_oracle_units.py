"""units.py reads and compares device attributes exactly as Nomad's plugins/shared/structs does.

Nomad's ``attribute.go`` and ``units.go`` are not packaged by Debian and not
copied here: the Go oracle compiles them from a Nomad source mirror at build
time, and these tests skip (with that reason) where there is none. With the
mirror, each literal goes through ``ParseAttribute`` and each pair through
``Attribute.Compare`` (a NaN on the big.Float path makes Go panic; the oracle
recovers and reports it).
"""

from __future__ import annotations

import itertools
import math
import struct
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from nomad_plugin.jobspec import units
from nomad_plugin.nomad_view.types import Attribute
from tests.jobspec.oracle.client import GoOracle

BASES = {1: units.BYTE, 2: units.BYTE_RATE, 3: units.HERTZ, 4: units.WATT}
NUMBERS = (
    "0", "1", "-1", "+1", "80", "81559", "1500", "1_000", "1__0", "0x10", "0x1p4", "0x1p-2", "1.5", ".98", "-0.5",
    "1e3", "1E-3", "1e308", "1e309", "-1e309", "inf", "-Inf", "+infinity", "NaN", "nan", "9", "8", "16", "9223372036854775807",
    "9223372036854775808", "-9223372036854775808", "18446744073709551615", "0.001", "1e-400", "t", "true", "F", "",
    "abc", "1 2", "\u0663", "1,5",
)  # fmt: skip
UNIT_TEXTS = (
    *units.UNITS, "", "B", "b", "kb", "KIB", "iB", "Gib", "mw", "w", "MHZ", "Hz", "GiB/S", "/s", "s", "KiB/", "KiBs",
    "B/s", "W/s", "GW/s", "MiBMiB", "\u00b5W",
)  # fmt: skip
SPACES = ("", " ", "  ", "\t", "\u00a0", "\u2003", "\x1c")


def _attributes() -> list[str]:
    out = {n + s + u for n, s, u in itertools.product(NUMBERS, SPACES[:3], UNIT_TEXTS)}
    out |= {s + n + s2 + u for s, s2, n, u in itertools.product(SPACES, SPACES, ("1", "1.5", "t"), ("GiB", "", "W"))}
    return sorted(out)


ATTRIBUTES = _attributes()


def _bits(value: float) -> int:
    return int(struct.unpack("<Q", struct.pack("<d", value))[0])


def _same_attribute(py: Attribute, go: dict[str, Any]) -> bool:
    kind = units.kind(py)
    if kind != go["kind"] or py.unit != go["unit"]:
        return False
    if kind == "float":
        assert isinstance(py.value, float)
        return (math.isnan(py.value) and go["nan"]) or (not go["nan"] and _bits(py.value) == go["bits"])
    return bool(py.value == go[kind])


def test_unit_table(nomad_oracle: GoOracle) -> None:
    go = nomad_oracle.one(op="units")["units"]
    ours = {
        name: {
            "base": next(k for k, v in BASES.items() if v == u.base),
            "multiplier": u.multiplier,
            "inverse": u.inverse,
        }
        for name, u in units.UNITS.items()
    }
    assert ours == go


def test_parse_attribute(nomad_oracle: GoOracle) -> None:
    answers = nomad_oracle.ask({"op": "attribute", "s": text} for text in ATTRIBUTES)
    found = [
        f"ParseAttribute({text!r}): python {units.parse_attribute(text)}, Go {go}"
        for text, go in zip(ATTRIBUTES, answers, strict=True)
        if not _same_attribute(units.parse_attribute(text), go)
    ]
    assert not found, f"{len(found)} of {len(ATTRIBUTES)} disagree:\n" + "\n".join(found[:40])


def compare_disagreements(oracle: GoOracle, pairs: list[tuple[str, str]]) -> list[str]:
    answers = oracle.ask({"op": "compare", "a": a, "b": b} for a, b in pairs)
    found = []
    for (a, b), go in zip(pairs, answers, strict=True):
        ours = units.compare(units.parse_attribute(a), units.parse_attribute(b))
        if "panic" in go:
            same = bool(ours.panic)
        elif not go["comparable"]:
            same = ours.order is None and not ours.panic
        else:
            same = ours.order == go["order"]
        if not same:
            found.append(f"Compare({a!r}, {b!r}): python {ours}, Go {go}")
    return found


COMPARED = [
    "0", "1", "-1", "8", "9", "16", "80", "1000", "1500", "1_000", "0x1p4", "1.5", "0.98", "-0.5", "1e3", "inf",
    "-inf", "nan", "9223372036854775807", "-9223372036854775808", "t", "true", "false", "f", "abc", "ABC", "", "é",
    "80 GiB", "81559 MiB", "79.6 GiB", "80 GB", "1 EiB", "8 EiB", "9 EiB", "16 EiB", "-9 EiB", "1.5 EiB", "9.0 EiB",
    "1 KiB", "1024", "1024 B", "1 kB", "1000 B/s", "1 KB/s", "1 KiB/s", "1500 mW", "1 W", "1.5 W", "1499 mW",
    "1501 mW", "-1500 mW", "1 mW", "0.001 W", "1 kW", "1000 W", "1 GW", "1e9 W", "2 GHz", "2000 MHz", "2e3 MHz",
    "2000.5 MHz", "inf GiB", "-inf MiB", "nan MiB", "nan W", "1 foo", "1 foo GiB", "0x1p4 KiB", "1_000 MB",
    "9223372036854775807 mW", "9223372036854775807 KiB", "0.1 kW", "100 W", "3.3333333333333333 mW",
    "0.0033333333333333335 W",
]  # fmt: skip


def test_compare_pairs(nomad_oracle: GoOracle) -> None:
    pairs = list(itertools.product(COMPARED, repeat=2))
    found = compare_disagreements(nomad_oracle, pairs)
    assert not found, f"{len(found)} of {len(pairs)} disagree:\n" + "\n".join(found[:40])


NUMBER = st.one_of(
    st.integers(-(2**64), 2**64).map(str),
    st.floats(allow_nan=False).map(repr),
    st.floats(allow_nan=False, allow_infinity=False).map(float.hex),
    st.sampled_from(NUMBERS),
)
ATTRIBUTE = st.tuples(NUMBER, st.sampled_from(SPACES[:3]), st.sampled_from(UNIT_TEXTS)).map("".join)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(ATTRIBUTE, ATTRIBUTE), min_size=1, max_size=8))
def test_generated(nomad_oracle: GoOracle, pairs: list[tuple[str, str]]) -> None:
    texts = [t for pair in pairs for t in pair]
    answers = nomad_oracle.ask({"op": "attribute", "s": t} for t in texts)
    found = [
        f"ParseAttribute({t!r}): {go}"
        for t, go in zip(texts, answers, strict=True)
        if not _same_attribute(units.parse_attribute(t), go)
    ]
    found += compare_disagreements(nomad_oracle, pairs)
    assert not found, "\n".join(found[:20])
