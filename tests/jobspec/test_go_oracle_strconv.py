"""golang.py answers exactly what Go's strconv and strings answer (the Go oracle asks Go itself).

Hostile corpora (signs, underscores, base prefixes, hex mantissas, exponents,
inf/nan spellings, int64 and float64 edges, non-ASCII digits, white space of
every kind) plus hypothesis-generated literals; every disagreement is listed.
"""

from __future__ import annotations

import itertools
import math
import struct
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nomad_plugin.jobspec import golang
from tests.jobspec.oracle.client import GoOracle

SIGNS = ("", "+", "-", "--", "+-", " -")
BODIES = (
    "0", "00", "1", "01", "007", "10", "1_000", "1__000", "_1", "1_", "1_0_0", "0_1", "0x10", "0X1F", "0b101", "0o17",
    "0x1p4", "0X1P-4", "0x1P+4", "0x_1p4", "0x1_p4", "0x1p_4", "0x1p4_", "0x1.8p1", "0x.8p1", "0x1.p1", "0x.p1",
    "0x1", "0x", "0xp1", "0x1e5", "0x1.8", "0xg", "0x1p", "0x1p+", "0x1.fffffffffffffp1023", "0x1.fffffffffffff8p1023",
    "0x1p1023", "0x1p1024", "0x1p-1074", "0x1p-1075", "0x1p-1076", "0x0.0000000000001p-1022", "0x1p-2000",
    "1e5", "1E+5", "1e-5", "1e", "1e+", "1e_5", "1_e5", "1e5_", "1e0_5", "1.5", ".5", "5.", ".", "..5", "1.2.3",
    "1_000.000_1", "1_000._5", "1._5", "1.5_", "1.5e1_0", "0.000_1", "1e308", "1.8e308", "1.7976931348623157e308",
    "1.7976931348623158e308", "1.7976931348623159e308", "179769313486231580793728971405301e276", "4.9e-324",
    "2.4703282292062327e-324", "2.4703282292062328e-324", "2e-324", "1e-400", "1e400", "1e-4000000000",
    "1e99999999999999999999", "0e99999999999999999999", "123456789012345678901234567890",
    "0.1000000000000000055511151231257827021181583404541015625", "9007199254740993", "9007199254740993.0",
    "9223372036854775807", "9223372036854775808", "9223372036854775809", "18446744073709551616",
    "inf", "Inf", "INF", "iNf", "infinity", "Infinity", "INFINITY", "infinit", "infinityy", "in", "nan", "NaN", "NAN",
    "nAn", "nan(1)", "nan0", "snan", "qnan", "1inf", "inf_", "∞",
    "\u0663", "\uff11", "1\u0663", "\u00b2", "1\u00a0", "1\u200b", "1,000", "1'000", "1 000", "0x1p4i", "1i", "1f", "1d",
    "t", "T", "true", "True", "TRUE", "tRUE", "yes", "f", "F", "false", "False", "FALSE", "fAlse", "no", "on", "", " ",
)  # fmt: skip
WRAPS = ("", " ", "\t", "\n", "\u00a0", "\u2003", "\u3000", "\x1c")


def _corpus() -> list[str]:
    cases = {sign + body for sign, body in itertools.product(SIGNS, BODIES)}
    cases |= {w + body for w, body in itertools.product(WRAPS, BODIES)}
    cases |= {body + w for w, body in itertools.product(WRAPS, BODIES)}
    return sorted(cases)


CORPUS = _corpus()


def _bits(value: float) -> int:
    return int(struct.unpack("<Q", struct.pack("<d", value))[0])


def _int_disagreement(text: str, go: dict[str, Any]) -> str:
    py = golang.parse_int(text)
    if (py is not None) != go["ok"] or (py is not None and py != go["int"]):
        return f"parse_int({text!r}): python {py!r}, Go {go['int'] if go['ok'] else go['err']!r}"
    return ""


def _float_disagreement(text: str, go: dict[str, Any]) -> str:
    py = golang.parse_float(text)
    same = (py is not None) == go["ok"]
    if same and py is not None:
        same = (math.isnan(py) and go["nan"]) or (not math.isnan(py) and not go["nan"] and _bits(py) == go["bits"])
    if not same:
        go_text = struct.unpack("<d", struct.pack("<Q", go["bits"]))[0] if go["ok"] else go["err"]
        return f"parse_float({text!r}): python {py!r}, Go {go_text!r}"
    return ""


def _bool_disagreement(text: str, go: dict[str, Any]) -> str:
    py = golang.parse_bool(text)
    if (py is not None) != go["ok"] or (py is not None and py != go["bool"]):
        return f"parse_bool({text!r}): python {py!r}, Go {go['bool'] if go['ok'] else go['err']!r}"
    return ""


def _trim_disagreement(text: str, go: dict[str, Any]) -> str:
    py = golang.trim_space(text)
    return "" if py == go["out"] else f"trim_space({text!r}): python {py!r}, Go {go['out']!r}"


CHECKS = {
    "parse_int": _int_disagreement,
    "parse_float": _float_disagreement,
    "parse_bool": _bool_disagreement,
    "trim_space": _trim_disagreement,
}


def disagreements(oracle: GoOracle, op: str, texts: list[str]) -> list[str]:
    answers = oracle.ask({"op": op, "s": text} for text in texts)
    found = [CHECKS[op](text, go) for text, go in zip(texts, answers, strict=True)]
    return [d for d in found if d]


def _report(found: list[str], total: int) -> str:
    return f"{len(found)} of {total} disagree with Go:\n" + "\n".join(found[:40])


def test_corpus_parse_int(go_oracle: GoOracle) -> None:
    found = disagreements(go_oracle, "parse_int", CORPUS)
    assert not found, _report(found, len(CORPUS))


def test_corpus_parse_float(go_oracle: GoOracle) -> None:
    found = disagreements(go_oracle, "parse_float", CORPUS)
    assert not found, _report(found, len(CORPUS))


def test_corpus_parse_bool(go_oracle: GoOracle) -> None:
    found = disagreements(go_oracle, "parse_bool", CORPUS)
    assert not found, _report(found, len(CORPUS))


def test_trim_space_every_code_point_below_u3100(go_oracle: GoOracle) -> None:
    """Each code point on both ends of a word, and alone: what Go's unicode.IsSpace trims."""
    points = [*range(0, 0x3100), 0x180E, 0x200B, 0x2060, 0xFEFF, 0xFFFD, 0x10FFFF]
    texts = [f"{chr(p)}x{chr(p)}" for p in points] + [chr(p) * 2 for p in points]
    found = disagreements(go_oracle, "trim_space", texts)
    assert not found, _report(found, len(texts))


NUMBERISH = st.text(alphabet="0123456789_+-.eEpPxXabcdfinINFty \t\u00a0", max_size=14)


def _decorated(value: float) -> st.SearchStrategy[str]:
    """Spellings of one float: repr, %e, %g, hex, with underscores dropped in."""
    spellings = [repr(value), f"{value:e}", f"{value:.17g}", value.hex(), f"{value:.3f}"]
    return st.sampled_from(spellings).flatmap(
        lambda text: st.lists(st.integers(0, max(len(text), 1)), max_size=2).map(
            lambda cuts: "".join(ch + ("_" if i + 1 in cuts else "") for i, ch in enumerate(text))
        )
    )


FLOATS = st.one_of(
    st.floats(allow_nan=False, allow_infinity=False).flatmap(_decorated),
    st.integers(-(2**65), 2**65).map(str),
    NUMBERISH,
)


@settings(max_examples=200, deadline=None)
@given(st.lists(FLOATS, min_size=1, max_size=8))
def test_generated_numbers(go_oracle: GoOracle, texts: list[str]) -> None:
    for op in ("parse_int", "parse_float", "parse_bool"):
        found = disagreements(go_oracle, op, texts)
        assert not found, _report(found, len(texts))


SPACEY = st.text(
    alphabet=st.sampled_from([*golang.GO_SPACE, "\x1c", "\x1d", "\x1e", "\x1f", "\u200b", "\ufeff", "a", "1", "é"])
)


@settings(max_examples=300, deadline=None)
@given(st.lists(SPACEY, min_size=1, max_size=8))
def test_generated_trim_space(go_oracle: GoOracle, texts: list[str]) -> None:
    found = disagreements(go_oracle, "trim_space", texts)
    assert not found, _report(found, len(texts))


def test_the_comparison_catches_a_wrong_reading(go_oracle: GoOracle, monkeypatch: pytest.MonkeyPatch) -> None:
    """Python's own float() in place of parse_float: the oracle must flag " 1", "1_000" and "infinit"."""

    def python_float(text: str) -> float | None:
        try:
            return float(text)
        except ValueError:
            return None

    monkeypatch.setattr(golang, "parse_float", python_float)
    found = disagreements(go_oracle, "parse_float", [" 1", "1_000", "+nan", "1", "0x1p4"])
    assert [d.split(":")[0] for d in found] == ["parse_float(' 1')", "parse_float('+nan')", "parse_float('0x1p4')"]
