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
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache
from typing import Any

import re2

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


# --- goversion.py ------------------------------------------------------------------------------
# ``version`` and ``semver`` constraint operators: hashicorp/go-version's rules and Nomad's semver variant.
#
# Facts from go-version v1.9.0 (the release Nomad's go.mod pins) and Nomad's
# ``helper/constraints/semver``; ``tests/jobspec`` holds their test tables.
#
# A **version** is ``v``? then dot-separated decimal segments (int64 each;
# fewer than three are padded with zeros), then an optional pre-release,
# then an optional ``+metadata``. The pre-release starts with ``-`` and a
# digit, or with an optional ``-`` and a letter, ``-`` or ``~`` (so
# ``1.7rc2`` is a version); later characters are letters, digits, ``-``,
# ``~`` and dot-separated parts. :func:`parse_version` takes that form;
# ``strict`` (``NewSemver``) requires the ``-`` before any pre-release.
#
# A **constraint** is a comma-separated list of clauses, each
# ``<op> <version>`` with optional ASCII blanks around (``\t\n\f\r`` and
# space), the operator one of ``=`` (or none), ``!=``, ``>``, ``>=``, ``<``,
# ``<=``, ``~>``. go-version's ``>``, ``>=``, ``<``, ``<=`` and ``~>`` apply
# its pre-release rule: a pre-release version satisfies them only when the
# clause's version is a pre-release of the same segments (``2.1.0-beta`` is
# not ``>= 2.0.0``). Nomad's **semver** constraints parse clause versions
# strictly, have no ``~>``, and order pre-releases by Semver 2.0 alone
# (``2.1.0-beta`` *is* ``> 2.0``). In both, the attribute's own value is read
# with go-version's loose parser.


_IDENT = r"[0-9A-Za-z~-]"
_DOTTED = rf"(?:\.{_IDENT}+)*"
# The pre-release alternatives in the order go-version's pattern tries them: numeric first.
_PRE_LOOSE = rf"(?:-(?P<num>[0-9]+{_IDENT}*{_DOTTED})|-?(?P<word>[A-Za-z~-]+{_IDENT}*{_DOTTED}))"
_PRE_STRICT = rf"(?:-(?P<num>[0-9]+{_IDENT}*{_DOTTED})|-(?P<word>[A-Za-z~-]+{_IDENT}*{_DOTTED}))"
_META = rf"(?:\+(?P<meta>{_IDENT}+{_DOTTED}))"
_SEGMENTS = r"v?(?P<segments>[0-9]+(?:\.[0-9]+)*?)"
VERSION_PATTERN = rf"{_SEGMENTS}{_PRE_LOOSE}?{_META}??"
SEMVER_PATTERN = rf"{_SEGMENTS}{_PRE_STRICT}?{_META}??"
_VERSION = re.compile(VERSION_PATTERN)
_SEMVER = re.compile(SEMVER_PATTERN)
_BLANK = "[\t\n\f\r ]*"  # Go's \s: ASCII blanks only (no \v)
_CLAUSE = re.compile(rf"{_BLANK}(?P<op><=|>=|!=|~>|<|>|=|){_BLANK}(?P<version>{VERSION_PATTERN}){_BLANK}")
_SEMVER_CLAUSE = re.compile(rf"{_BLANK}(?P<op><=|>=|!=|<|>|=|){_BLANK}(?P<version>{SEMVER_PATTERN}){_BLANK}")


@dataclass(frozen=True)
class Version:
    segments: tuple[int, ...]  # padded to at least three
    given: int  # how many segments were written (the pessimistic operator uses it)
    pre: str
    meta: str

    def text(self) -> str:
        """go-version's canonical String(): segments, -pre, +meta."""
        out = ".".join(str(s) for s in self.segments)
        return out + (f"-{self.pre}" if self.pre else "") + (f"+{self.meta}" if self.meta else "")


def _segment_error(text: str) -> str:
    """go-version's error for a version whose pattern matched but a segment is no int64."""
    match = _VERSION.fullmatch(text)
    bad = next((p for p in match.group("segments").split(".") if parse_int(p) is None), "") if match else ""
    return f'error parsing version: strconv.ParseInt: parsing "{bad}": value out of range'


def parse_version(text: str, strict: bool = False) -> Version | None:
    """``version.NewVersion`` (or ``NewSemver`` when ``strict``); None where it returns an error."""
    match = (_SEMVER if strict else _VERSION).fullmatch(text)
    if match is None:
        return None
    segments = []
    for part in match.group("segments").split("."):
        value = parse_int(part)
        if value is None:
            return None  # out of int64 range
        segments.append(value)
    given = len(segments)
    segments += [0] * (3 - len(segments))
    pre = match.group("word") or match.group("num") or ""
    return Version(tuple(segments), given, pre, match.group("meta") or "")


def _compare_part(a: str, b: str) -> int:
    if a == b:
        return 0
    na, nb = parse_int(a), parse_int(b)
    if a == "":
        return -1 if nb is not None else 1
    if b == "":
        return 1 if na is not None else -1
    if na is not None and nb is None:
        return -1
    if na is None and nb is not None:
        return 1
    if na is None and nb is None:
        return 1 if a > b else -1
    assert na is not None and nb is not None
    return 1 if na > nb else -1


def _compare_prereleases(a: str, b: str) -> int:
    if a == b:
        return 0
    pa, pb = a.split("."), b.split(".")
    for i in range(max(len(pa), len(pb))):
        order = _compare_part(pa[i] if i < len(pa) else "", pb[i] if i < len(pb) else "")
        if order:
            return order
    return 0


def compare_versions(a: Version, b: Version) -> int:
    """``Version.Compare``: -1, 0 or 1; missing segments count as zeros, metadata never counts."""
    if a.text() == b.text():
        return 0
    if a.segments == b.segments:
        if not a.pre and not b.pre:
            return 0
        if not a.pre:
            return 1
        if not b.pre:
            return -1
        return _compare_prereleases(a.pre, b.pre)
    for i in range(max(len(a.segments), len(b.segments))):
        if i >= len(a.segments):
            return 0 if all(s == 0 for s in b.segments[i:]) else -1
        if i >= len(b.segments):
            return 0 if all(s == 0 for s in a.segments[i:]) else 1
        if a.segments[i] != b.segments[i]:
            return -1 if a.segments[i] < b.segments[i] else 1
    return 0


def _prerelease_ok(v: Version, c: Version) -> bool:
    """go-version's rule for ordered operators: a pre-release matches only its own segments' pre-release clause."""
    if v.pre and c.pre:
        return v.segments == c.segments
    return not (v.pre and not c.pre)


def _pessimistic(v: Version, c: Version) -> bool:
    if not _prerelease_ok(v, c) or (c.pre and not v.pre):
        return False
    if compare_versions(v, c) < 0:
        return False
    width = len(c.segments)
    if width > len(v.segments):
        return False
    if any(v.segments[i] != c.segments[i] for i in range(c.given - 1)):
        return False
    return c.segments[width - 1] <= v.segments[width - 1]


def _holds(op: str, v: Version, c: Version, semver: bool) -> bool:
    if op in ("", "="):
        return compare_versions(v, c) == 0
    if op == "!=":
        return compare_versions(v, c) != 0
    if op == "~>":
        return _pessimistic(v, c)
    if not semver and not _prerelease_ok(v, c):
        return False
    order = compare_versions(v, c)
    return {">": order == 1, "<": order == -1, ">=": order >= 0, "<=": order <= 0}[op]


@dataclass(frozen=True)
class Constraints:
    clauses: tuple[tuple[str, Version], ...]
    semver: bool

    def check(self, version: Version) -> bool:
        return all(_holds(op, version, c, self.semver) for op, c in self.clauses)


def parse_constraints(text: str, semver: bool = False) -> Constraints | str:
    """``version.NewConstraint`` (or Nomad's ``semver.NewConstraint``); their error message where they fail.

    go-version writes "malformed constraint", Nomad's semver copy still "Malformed constraint".
    """
    clauses = []
    for clause in text.split(","):
        match = (_SEMVER_CLAUSE if semver else _CLAUSE).fullmatch(clause)
        if match is None:
            return f"{'Malformed' if semver else 'malformed'} constraint: {clause}"
        version = parse_version(match.group("version"), strict=semver)
        if version is None:
            return _segment_error(match.group("version"))
        clauses.append((match.group("op"), version))
    return Constraints(tuple(clauses), semver)


# --- regex.py ----------------------------------------------------------------------------------
# The ``regexp`` operator with RE2, the engine whose syntax Go's ``regexp`` package implements.
#
# Nomad compiles the constraint's value with ``regexp.Compile`` (job
# validation refuses a pattern it rejects) and tests it with ``MatchString``:
# an unanchored search over UTF-8 text, ``.`` not matching a newline, ``^``/``$``
# at the ends of the text, POSIX classes such as ``[[:alpha:]]``, no
# look-around or back-references. The google-re2 binding gives that engine;
# patterns are passed as written, never translated. RE2 would log a rejected
# pattern on stderr, so logging is turned off: the error comes back as text.
#
# Where the two engines part (tests/jobspec/test_go_oracle_regexp.py compares
# them with Go itself), this module follows Go: Go refuses ``\C`` (any byte),
# capture names outside ``[A-Za-z0-9_]`` and 1000 nested capturing groups, all
# of which RE2 accepts, so :func:`compile_error` refuses them too. RE2's memory
# budget is raised so that it compiles what Go's size limit lets through in
# practice (``\pL{1000}``). What cannot be settled without Go's parser is named
# by :func:`caveat`, and check-job prints it as a warning.


_OPTIONS = re2.Options()
_OPTIONS.log_errors = False
_OPTIONS.never_capture = True  # only whether it matches counts: no group spans to compute
_OPTIONS.max_mem = 64 << 20  # RE2's default (8 MiB) refuses patterns Go compiles, such as \pL{1000}
MAX_CAPTURE_NESTING = 999  # Go refuses a parse tree taller than 1000: 1000 nested captures always are
DEEP_NESTING = 250
TOO_LARGE = "error parsing regexp: expression too large"
_BAD_CLASS = "error parsing regexp: invalid character class range: "
_UNCLOSED = tuple(
    f"error parsing regexp: {w}" for w in ("missing closing )", "missing closing ]", "trailing backslash")
)  # from here on Go's tree height depends on how its parser folds the groups


# RE2's error words -> Go's regexp/syntax words, so a refusal reads as Nomad prints it.
_GO_WORDS = {
    "missing ]": "missing closing ]",
    "missing )": "missing closing )",
    "unexpected )": "unexpected )",
    "invalid escape sequence": "invalid escape sequence",
    "invalid character class range": "invalid character class range",
    "invalid character class": "invalid character class",
    "missing argument to repetition operator": "missing argument to repetition operator",
    "no argument for repetition operator": "missing argument to repetition operator",
    "invalid repetition size": "invalid repeat count",
    "bad repetition operator": "invalid nested repetition operator",
    "invalid perl operator": "invalid or unsupported Perl syntax",
    "invalid UTF-8": "invalid UTF-8",
    "invalid named capture group": "invalid named capture",
    "trailing \\": "trailing backslash at end of expression",
}


def _go_words(detail: str) -> str:
    """``error parsing regexp: <Go's words>: `<the part>```, from RE2's ``<words>: <the part>``."""
    words, _, part = detail.partition(": ")
    go = _GO_WORDS.get(words)
    if go is None:
        return detail
    return f"error parsing regexp: {go}: `{part}`"  # Go always quotes the part, even an empty one


_GO_CAPTURE_NAME = re.compile(r"[A-Za-z0-9_]+")


@dataclass(frozen=True)
class _Shape:
    refusal: str  # what Go refuses that RE2 accepts ("" when nothing)
    refusal_at: int  # where in the pattern Go's parser meets it
    nesting: int  # deepest group nesting, of any kind
    non_boundary: bool  # holds \\B outside a class


@lru_cache(maxsize=256)
def _shape(pattern: str) -> _Shape:
    """One pass over a pattern RE2 accepted: Go's extra refusals and the nesting depth."""
    refusal, refusal_at, depth, deepest, captures, open_groups, non_boundary = "", 0, 0, 0, 0, [], False
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        if c == "\\":
            if pattern.startswith("\\Q", i):
                end = pattern.find("\\E", i + 2)
                i = n if end < 0 else end + 2
                continue
            if pattern.startswith("\\C", i) and not refusal:
                refusal, refusal_at = "error parsing regexp: invalid escape sequence: `\\C`", i
            non_boundary = non_boundary or pattern.startswith("\\B", i)
            i += 2
            continue
        if c == "[":
            i = _class_end(pattern, i)
            continue
        if c == "(":
            capture = not pattern.startswith("(?", i)
            named = re.match(r"\(\?P?<([^>]*)>", pattern[i:])
            if named and not pattern.startswith(("(?<=", "(?<!"), i):
                capture = True
                if not _GO_CAPTURE_NAME.fullmatch(named.group(1)) and not refusal:
                    refusal, refusal_at = f"error parsing regexp: invalid named capture: `{named.group(0)}`", i
            elif pattern.startswith("(?", i) and re.match(r"\(\?[imsU-]*\)", pattern[i:]):
                i = pattern.index(")", i) + 1  # a flag group opens nothing
                continue
            open_groups.append(capture)
            captures += capture
            depth += 1
            deepest = max(deepest, depth)
            if captures > MAX_CAPTURE_NESTING and not refusal:
                refusal, refusal_at = f"error parsing regexp: expression nests too deeply: `{pattern}`", n
        elif c == ")" and open_groups:
            captures -= open_groups.pop()
            depth -= 1
        i += 1
    return _Shape(refusal, refusal_at, deepest, non_boundary)


def _class_end(pattern: str, start: int) -> int:
    """Index just past the character class that opens at ``start`` (RE2 accepted it, so it closes)."""
    i = start + 1
    if pattern.startswith("^", i):
        i += 1
    if pattern.startswith("]", i):
        i += 1
    while i < len(pattern):
        if pattern[i] == "\\":
            i += 2
        elif pattern.startswith("[:", i) and (end := pattern.find(":]", i + 2)) >= 0:
            i = end + 2
        elif pattern[i] == "]":
            return i + 1
        else:
            i += 1
    return len(pattern)


_SURROGATE = re.compile("[\ud800-\udfff]")


def _utf8(text: str) -> str:
    """Text Go could hold: a lone surrogate (from JSON escapes) becomes U+FFFD, as Go's JSON decoder makes it."""
    return _SURROGATE.sub("\ufffd", text)


@lru_cache(maxsize=256)
def _re2(pattern: str) -> tuple[Any, str]:
    """(RE2's compiled pattern, "") or (None, its refusal in Go's words)."""
    try:
        return re2.compile(_utf8(pattern), _OPTIONS), ""
    except re2.error as exc:
        detail = exc.args[0] if exc.args else exc
        text = detail.decode("utf-8", "replace") if isinstance(detail, bytes) else str(detail)
        if text.startswith("pattern too large"):
            return None, f"{TOO_LARGE}: `{pattern}`"  # Go names the whole pattern
        return None, _go_words(text)


def _re2_error(pattern: str) -> str:
    return _re2(pattern)[1]


@lru_cache(maxsize=256)
def compile_error(pattern: str) -> str:
    """Empty when Go's ``regexp.Compile`` would accept ``pattern``, else its reason in Go's words.

    Go's parser stops at the first problem from the left. When RE2 refuses the pattern and Go would
    also refuse something RE2 accepts, the earlier of the two is Go's answer: RE2's problem comes
    first when the text before Go's refusal already fails on its own (other than by being unclosed).
    """
    error, shape = _re2_error(pattern), _shape(pattern)
    if not shape.refusal or (error and shape.refusal_at >= len(pattern)):
        return error
    if error:
        before = _re2_error(pattern[: shape.refusal_at])
        if before and not before.startswith(_UNCLOSED):
            return error
    return shape.refusal


@lru_cache(maxsize=256)
def caveat(pattern: str) -> str:
    """Why check-job's answer for ``pattern`` may not be Nomad's, or empty (docs/operator.md lists these)."""
    error = _re2_error(pattern)
    if error.startswith(TOO_LARGE):
        return (
            f"regexp {pattern[:40]!r}{'...' if len(pattern) > 40 else ''} is too large for RE2, which check-job "
            "runs; Go's regexp, which Nomad runs, measures size differently and may compile it, so Nomad may "
            "accept this job"
        )
    if error.startswith((f"{_BAD_CLASS}`\\p", f"{_BAD_CLASS}`\\P")):
        return (
            f"{error.removeprefix(_BAD_CLASS)} is no Unicode class name RE2 knows; the Go releases Nomad is built "
            "with also look names up ignoring case, spaces, '_' and '-', and know aliases such as Letter, ASCII "
            "and Assigned, so Nomad may accept this job"
        )
    if not error and _shape(pattern).nesting >= DEEP_NESTING and not _shape(pattern).refusal:
        return (
            f"regexp nests {_shape(pattern).nesting} groups deep: Go's regexp refuses a parse tree taller than "
            "1000, RE2 has no such limit, and the height depends on how Go's parser folds the groups, so Nomad "
            "may refuse this job"
        )
    return ""


def search(pattern: str, text: str) -> bool | None:
    """True/False when ``pattern`` matches somewhere in ``text``; None when it does not compile."""
    if compile_error(pattern):
        return None
    compiled, text = _re2(pattern)[0], _utf8(text)
    if not text.isascii() and _shape(pattern).non_boundary:
        # RE2's unanchored search may start inside a multi-byte character, where \\B holds (both
        # neighbouring bytes are non-word); Go's starts only between characters: try those starts.
        return any(compiled.match(text, start) is not None for start in range(len(text) + 1))
    return compiled.search(text) is not None
