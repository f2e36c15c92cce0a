"""What Go answers where Nomad's scheduler relies on Go: ``strconv``, hashicorp/go-version, ``regexp``.

Python's parsers accept other spellings (``float(" 1")``, ``int("\\u0661")``)
and its integers never overflow; each function here answers as its Go
namesake does. tests/jobspec/test_go_oracle_*.py compare them with Go itself.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache
from typing import Any

import re2

# --- strconv, strings, int64, math/big ---------------------------------------------------------

# Unicode's White_Space: what strings.TrimSpace trims (str.strip() also trims U+001C..U+001F).
GO_SPACE = "\t\n\v\f\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000"
_BOOLS = dict.fromkeys(("1", "t", "T", "TRUE", "true", "True"), True)
_BOOLS.update(dict.fromkeys(("0", "f", "F", "FALSE", "false", "False"), False))
_DEC = "[0-9](?:_?[0-9])*"  # strconv's underscoreOK: "_" only between digits
_HEX = "[0-9a-fA-F](?:_?[0-9a-fA-F])*"
_GO_FLOAT = re.compile(
    rf"[+-]?(?:(?:{_DEC}(?:\.(?:{_DEC})?)?|\.{_DEC})(?:[eE][+-]?{_DEC})?"
    rf"|0[xX](?:_?{_HEX}(?:\.(?:{_HEX})?)?|\.{_HEX})[pP][+-]?{_DEC})"  # a hex mantissa needs its p exponent
)


def trim_space(text: str) -> str:
    return text.strip(GO_SPACE)


def parse_int(text: str) -> int | None:
    """``strconv.ParseInt(text, 10, 64)``."""
    if not re.fullmatch(r"[+-]?[0-9]+", text):
        return None
    value = int(text)
    return value if -(2**63) <= value < 2**63 else None


def parse_bool(text: str) -> bool | None:
    return _BOOLS.get(text)


def parse_float(text: str) -> float | None:
    """``strconv.ParseFloat(text, 64)``; None where Go returns an error (syntax or out of range)."""
    body = text[1:] if text[:1] in ("+", "-") else text
    if body.lower() in ("inf", "infinity"):
        return -math.inf if text[0] == "-" else math.inf
    if text.lower() == "nan":  # no sign
        return math.nan
    if not _GO_FLOAT.fullmatch(text):
        return None
    clean = text.replace("_", "")
    try:
        value = float.fromhex(clean) if "x" in clean.lower() else float(clean)
    except (OverflowError, ValueError):
        return None
    return None if math.isinf(value) else value  # ErrRange


def wrap_int64(value: int) -> int:
    """Two's-complement int64 overflow."""
    return (value + 2**63) % 2**64 - 2**63


def trunc_div(a: int, b: int) -> int:
    """Go's integer division rounds towards zero (Python's ``//`` floors)."""
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
    quantum = Fraction(2) ** (exp - prec + 1)  # mag is in [2**exp, 2**(exp+1)): keep prec bits
    units, rest = divmod(mag / quantum, 1)
    units = int(units)
    if rest > Fraction(1, 2) or (rest == Fraction(1, 2) and units % 2 == 1):
        units += 1
    return sign * units * quantum


# --- go-version (the release Nomad's go.mod pins) and Nomad's helper/constraints/semver ----------

_IDENT = r"[0-9A-Za-z~-]"
_DOTTED = rf"(?:\.{_IDENT}+)*"
# go-version's pre-release alternatives, numeric first; loose allows "1.7rc2", strict (NewSemver) needs the "-".
_PRE_LOOSE = rf"(?:-(?P<num>[0-9]+{_IDENT}*{_DOTTED})|-?(?P<word>[A-Za-z~-]+{_IDENT}*{_DOTTED}))"
_PRE_STRICT = rf"(?:-(?P<num>[0-9]+{_IDENT}*{_DOTTED})|-(?P<word>[A-Za-z~-]+{_IDENT}*{_DOTTED}))"
_META = rf"(?:\+(?P<meta>{_IDENT}+{_DOTTED}))"
_SEGMENTS = r"v?(?P<segments>[0-9]+(?:\.[0-9]+)*?)"
_VERSION_PATTERN = rf"{_SEGMENTS}{_PRE_LOOSE}?{_META}??"
_SEMVER_PATTERN = rf"{_SEGMENTS}{_PRE_STRICT}?{_META}??"
_VERSION = re.compile(_VERSION_PATTERN)
_SEMVER = re.compile(_SEMVER_PATTERN)
_BLANK = "[\t\n\f\r ]*"  # Go's \s: ASCII blanks only (no \v)
_CLAUSE = re.compile(rf"{_BLANK}(?P<op><=|>=|!=|~>|<|>|=|){_BLANK}(?P<version>{_VERSION_PATTERN}){_BLANK}")
_SEMVER_CLAUSE = re.compile(rf"{_BLANK}(?P<op><=|>=|!=|<|>|=|){_BLANK}(?P<version>{_SEMVER_PATTERN}){_BLANK}")


@dataclass(frozen=True)
class Version:
    segments: tuple[int, ...]  # padded to at least three
    given: int  # how many segments were written (the pessimistic operator uses it)
    pre: str
    meta: str

    def text(self) -> str:
        """go-version's String()."""
        out = ".".join(str(s) for s in self.segments)
        return out + (f"-{self.pre}" if self.pre else "") + (f"+{self.meta}" if self.meta else "")


def parse_version(text: str, strict: bool = False) -> Version | None:
    """``version.NewVersion`` (``NewSemver`` when ``strict``); None where it returns an error."""
    match = (_SEMVER if strict else _VERSION).fullmatch(text)
    if match is None:
        return None
    segments = [parse_int(part) for part in match.group("segments").split(".")]
    if None in segments:
        return None  # out of int64 range
    given = len(segments)
    padded = tuple(s for s in segments if s is not None) + (0,) * (3 - given)
    return Version(padded, given, match.group("word") or match.group("num") or "", match.group("meta") or "")


def _compare_part(a: str, b: str) -> int:
    if a == b:
        return 0
    na, nb = parse_int(a), parse_int(b)
    if a == "":
        return -1 if nb is not None else 1
    if b == "":
        return 1 if na is not None else -1
    if (na is None) != (nb is None):
        return -1 if na is not None else 1
    if na is None or nb is None:
        return 1 if a > b else -1
    return 1 if na > nb else -1


def compare_versions(a: Version, b: Version) -> int:
    """``Version.Compare``: metadata never counts; with equal segments, a pre-release sorts first."""
    if a.text() == b.text():
        return 0
    if a.segments == b.segments:
        if not a.pre or not b.pre:
            return (not a.pre) - (not b.pre)
        pa, pb = a.pre.split("."), b.pre.split(".")
        for i in range(max(len(pa), len(pb))):
            order = _compare_part(pa[i] if i < len(pa) else "", pb[i] if i < len(pb) else "")
            if order:
                return order
        return 0
    width = max(len(a.segments), len(b.segments))  # missing segments count as zeros, pre-releases do not count
    sa, sb = (v.segments + (0,) * (width - len(v.segments)) for v in (a, b))
    return (sa > sb) - (sa < sb)


def _prerelease_ok(v: Version, c: Version) -> bool:
    """go-version's ordered operators: a pre-release matches only a pre-release clause of its own segments."""
    if v.pre and c.pre:
        return v.segments == c.segments
    return not (v.pre and not c.pre)


def _holds(op: str, v: Version, c: Version, semver: bool) -> bool:
    order = compare_versions(v, c)
    if op in ("", "=", "!="):
        return (order == 0) == (op != "!=")
    if op == "~>":
        if not _prerelease_ok(v, c) or (c.pre and not v.pre) or order < 0 or len(c.segments) > len(v.segments):
            return False
        last = len(c.segments) - 1
        return v.segments[: c.given - 1] == c.segments[: c.given - 1] and c.segments[last] <= v.segments[last]
    if not semver and not _prerelease_ok(v, c):
        return False  # Nomad's semver orders pre-releases by Semver 2.0 alone
    return {">": order == 1, "<": order == -1, ">=": order >= 0, "<=": order <= 0}[op]


@dataclass(frozen=True)
class Constraints:
    clauses: tuple[tuple[str, Version], ...]
    semver: bool

    def check(self, version: Version) -> bool:
        return all(_holds(op, version, c, self.semver) for op, c in self.clauses)


def parse_constraints(text: str, semver: bool = False) -> Constraints | str:
    """``version.NewConstraint`` (Nomad's ``semver.NewConstraint``: strict, no ``~>``), else its error."""
    clauses = []
    for clause in text.split(","):
        match = (_SEMVER_CLAUSE if semver else _CLAUSE).fullmatch(clause)
        if match is None:
            return f"{'Malformed' if semver else 'malformed'} constraint: {clause}"
        version = parse_version(match.group("version"), strict=semver)
        if version is None:  # the pattern matched, so a segment is no int64
            loose = _VERSION.fullmatch(match.group("version"))
            bad = next((p for p in loose.group("segments").split(".") if parse_int(p) is None), "") if loose else ""
            return f'error parsing version: strconv.ParseInt: parsing "{bad}": value out of range'
        clauses.append((match.group("op"), version))
    return Constraints(tuple(clauses), semver)


# --- regexp: RE2 (google-re2), the syntax Go's regexp implements, where they part: Go's answer ------

_OPTIONS = re2.Options()
_OPTIONS.log_errors = False  # RE2 would print a refused pattern on stderr
_OPTIONS.never_capture = True
_OPTIONS.max_mem = 64 << 20  # RE2's default (8 MiB) refuses patterns Go compiles, such as \pL{1000}
MAX_CAPTURE_NESTING = 999  # Go refuses a parse tree taller than 1000: 1000 nested captures always are
DEEP_NESTING = 250
TOO_LARGE = "error parsing regexp: expression too large"
_BAD_CLASS = "error parsing regexp: invalid character class range: "
# From here on Go's tree height depends on how its parser folds the groups.
_UNCLOSED = tuple(
    f"error parsing regexp: {w}" for w in ("missing closing )", "missing closing ]", "trailing backslash")
)
# RE2's error words as Go's regexp/syntax words them.
_SAME_WORDS = (
    "unexpected )", "invalid escape sequence", "invalid character class range", "invalid character class",
    "missing argument to repetition operator", "invalid UTF-8",
)  # fmt: skip
_GO_WORDS = {
    **{w: w for w in _SAME_WORDS},
    "missing ]": "missing closing ]",
    "missing )": "missing closing )",
    "no argument for repetition operator": "missing argument to repetition operator",
    "invalid repetition size": "invalid repeat count",
    "bad repetition operator": "invalid nested repetition operator",
    "invalid perl operator": "invalid or unsupported Perl syntax",
    "invalid named capture group": "invalid named capture",
    "trailing \\": "trailing backslash at end of expression",
}
_GO_CAPTURE_NAME = re.compile(r"[A-Za-z0-9_]+")
_SURROGATE = re.compile("[\ud800-\udfff]")


def go_utf8(text: str) -> str:
    """Text Go could hold: a lone surrogate (from a JSON escape) is U+FFFD, as Go's JSON decoder makes it."""
    return _SURROGATE.sub("\ufffd", text)


def _go_words(detail: str) -> str:
    words, _, part = detail.partition(": ")
    go = _GO_WORDS.get(words)
    return detail if go is None else f"error parsing regexp: {go}: `{part}`"  # Go quotes even an empty part


@dataclass(frozen=True)
class _Shape:
    refusal: str  # what Go refuses that RE2 accepts ("" when nothing)
    refusal_at: int  # where in the pattern Go's parser meets it
    nesting: int  # deepest group nesting, of any kind
    non_boundary: bool  # holds \\B outside a class


@lru_cache(maxsize=256)
def _shape(pattern: str) -> _Shape:
    """One pass over a pattern RE2 accepted: Go's extra refusals (``\\C``, capture names, nesting)."""
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


@lru_cache(maxsize=256)
def _re2(pattern: str) -> tuple[Any, str]:
    """(RE2's compiled pattern, "") or (None, its refusal in Go's words)."""
    try:
        return re2.compile(go_utf8(pattern), _OPTIONS), ""
    except re2.error as exc:
        detail = exc.args[0] if exc.args else exc
        text = detail.decode("utf-8", "replace") if isinstance(detail, bytes) else str(detail)
        if text.startswith("pattern too large"):
            return None, f"{TOO_LARGE}: `{pattern}`"  # Go names the whole pattern
        return None, _go_words(text)


@lru_cache(maxsize=256)
def compile_error(pattern: str) -> str:
    """Empty when Go's ``regexp.Compile`` accepts ``pattern``, else its reason in Go's words.

    Go's parser stops at the first problem from the left: RE2's comes first when the text before Go's
    own refusal already fails (other than by being unclosed).
    """
    error, shape = _re2(pattern)[1], _shape(pattern)
    if not shape.refusal or (error and shape.refusal_at >= len(pattern)):
        return error
    if error:
        before = _re2(pattern[: shape.refusal_at])[1]
        if before and not before.startswith(_UNCLOSED):
            return error
    return shape.refusal


@lru_cache(maxsize=256)
def caveat(pattern: str) -> str:
    """Why check-job's answer for ``pattern`` may not be Nomad's, or empty (docs/operator.md lists these)."""
    error = _re2(pattern)[1]
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
    """``MatchString``, an unanchored search; None when the pattern does not compile."""
    if compile_error(pattern):
        return None
    compiled, text = _re2(pattern)[0], go_utf8(text)
    if not text.isascii() and _shape(pattern).non_boundary:
        # RE2 may start a search inside a multi-byte character, where \\B holds; Go starts only between
        # characters: try those starts.
        return any(compiled.match(text, start) is not None for start in range(len(text) + 1))
    return compiled.search(text) is not None
