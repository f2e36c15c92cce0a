"""Go's standard-library readings of text that Nomad's scheduler relies on, as pure functions.

Nomad parses constraint values with ``strconv`` and compares numbers with
``int64`` and ``math/big`` arithmetic; Python's own parsers accept other
spellings (``float(" 1")``, ``float("+nan")``, ``int("\\u0661")`` (an Arabic-Indic one)) and its integers
never overflow. Each function here answers what the Go function answers,
written from the Go documentation of each function:

- :func:`parse_int` = ``strconv.ParseInt(s, 10, 64)``;
- :func:`parse_float` = ``strconv.ParseFloat(s, 64)`` (decimal and hex
  mantissas, ``_`` between digits, ``inf``/``infinity``/``nan``, an out-of-range
  value is an error);
- :func:`parse_bool` = ``strconv.ParseBool``;
- :func:`trim_space` = ``strings.TrimSpace`` (Unicode White_Space only);
- :func:`wrap_int64` = two's-complement ``int64`` overflow;
- :func:`round_big` = a ``big.Float`` result rounded to its precision.
"""

from __future__ import annotations

import math
import re
from fractions import Fraction

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1

_DECIMAL_INT = re.compile(r"[+-]?[0-9]+")
_BOOLS = {"1": True, "t": True, "T": True, "TRUE": True, "true": True, "True": True}
_BOOLS.update({"0": False, "f": False, "F": False, "FALSE": False, "false": False, "False": False})
# Unicode's White_Space property: what Go's unicode.IsSpace (and so strings.TrimSpace) trims.
# Python's str.strip() also trims U+001C..U+001F, which Go keeps.
GO_SPACE = "\t\n\v\f\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000"


def trim_space(text: str) -> str:
    return text.strip(GO_SPACE)


def parse_int(text: str) -> int | None:
    """``strconv.ParseInt(text, 10, 64)``: ASCII digits with an optional sign, within int64."""
    if not _DECIMAL_INT.fullmatch(text):
        return None
    value = int(text)
    return value if INT64_MIN <= value <= INT64_MAX else None


def parse_bool(text: str) -> bool | None:
    return _BOOLS.get(text)


def _special(text: str) -> float | None:
    """``inf``/``infinity`` with an optional sign, or ``nan`` without one, in any case."""
    body, sign = text, 1.0
    if body[:1] in ("+", "-"):
        sign = -1.0 if body[0] == "-" else 1.0
        body = body[1:]
        if body.lower() in ("inf", "infinity"):
            return math.copysign(math.inf, sign)
        return None
    if body.lower() in ("inf", "infinity"):
        return math.inf
    if body.lower() == "nan":
        return math.nan
    return None


def _underscores_ok(text: str) -> bool:
    """Go's rule: an underscore only between two digits (a base prefix counts as a digit)."""
    body = text[1:] if text[:1] in ("+", "-") else text
    hexa = False
    saw = "^"
    i = 0
    if len(body) >= 2 and body[0] == "0" and body[1].lower() in "box":
        i, saw, hexa = 2, "0", body[1].lower() == "x"
    for c in body[i:]:
        if c.isascii() and (c.isdigit() or (hexa and c.lower() in "abcdef")):
            saw = "0"
            continue
        if c == "_":
            if saw != "0":
                return False
            saw = "_"
            continue
        if saw == "_":
            return False
        saw = "!"
    return saw != "_"


def _scan_float(text: str) -> tuple[str, bool] | None:
    """(the number without underscores, hexadecimal?) when ``text`` is one whole Go float literal."""
    i, n = 0, len(text)
    if i < n and text[i] in "+-":
        i += 1
    hexa = n - i > 2 and text[i] == "0" and text[i + 1] in "xX"
    if hexa:
        i += 2
    digits = "0123456789abcdefABCDEF" if hexa else "0123456789"
    saw_digits = saw_dot = underscores = False
    while i < n:
        c = text[i]
        if c == "_":
            underscores = True
        elif c == "." and not saw_dot:
            saw_dot = True
        elif c in digits:
            saw_digits = True
        else:
            break
        i += 1
    if not saw_digits:
        return None
    if i < n and text[i].lower() == ("p" if hexa else "e"):
        i += 1
        if i < n and text[i] in "+-":
            i += 1
        if i >= n or text[i] not in "0123456789":
            return None
        while i < n and (text[i] in "0123456789" or text[i] == "_"):
            underscores = underscores or text[i] == "_"
            i += 1
    elif hexa:
        return None  # a hexadecimal mantissa needs its p exponent
    if i != n or (underscores and not _underscores_ok(text)):
        return None
    return text.replace("_", ""), hexa


def parse_float(text: str) -> float | None:
    """``strconv.ParseFloat(text, 64)``; None where Go returns an error (syntax or out of range)."""
    if not text:
        return None
    special = _special(text)
    if special is not None:
        return special
    scanned = _scan_float(text)
    if scanned is None:
        return None
    clean, hexa = scanned
    try:
        value = float.fromhex(clean) if hexa else float(clean)
    except (OverflowError, ValueError):
        return None
    return None if math.isinf(value) else value  # overflow is ErrRange in Go; an inf literal returned above


def wrap_int64(value: int) -> int:
    """``value`` as an int64 multiplication leaves it: the low 64 bits, two's complement."""
    return (value + 2**63) % 2**64 - 2**63


def trunc_div(a: int, b: int) -> int:
    """Go's integer division: towards zero (Python's ``//`` floors)."""
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b > 0) else -q


def round_big(value: Fraction, prec: int = 256) -> Fraction:
    """``value`` rounded to ``prec`` mantissa bits, to nearest even (``big.Float``'s default mode)."""
    if value == 0:
        return value
    sign = -1 if value < 0 else 1
    mag = abs(value)
    exp = mag.numerator.bit_length() - mag.denominator.bit_length()
    if Fraction(2) ** exp > mag:
        exp -= 1
    # mag is in [2**exp, 2**(exp+1)): keep prec bits, i.e. a multiple of 2**(exp - prec + 1).
    quantum = Fraction(2) ** (exp - prec + 1)
    units, rest = divmod(mag / quantum, 1)
    units = int(units)
    if rest > Fraction(1, 2) or (rest == Fraction(1, 2) and units % 2 == 1):
        units += 1
    return sign * units * quantum
