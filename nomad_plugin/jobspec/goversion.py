"""``version`` and ``semver`` constraint operators: hashicorp/go-version's rules and Nomad's semver variant.

Facts from go-version v1.9.0 (the release Nomad's go.mod pins) and Nomad's
``helper/constraints/semver``; ``tests/jobspec`` holds their test tables.

A **version** is ``v``? then dot-separated decimal segments (int64 each;
fewer than three are padded with zeros), then an optional pre-release,
then an optional ``+metadata``. The pre-release starts with ``-`` and a
digit, or with an optional ``-`` and a letter, ``-`` or ``~`` (so
``1.7rc2`` is a version); later characters are letters, digits, ``-``,
``~`` and dot-separated parts. :func:`parse_version` takes that form;
``strict`` (``NewSemver``) requires the ``-`` before any pre-release.

A **constraint** is a comma-separated list of clauses, each
``<op> <version>`` with optional ASCII blanks around (``\\t\\n\\f\\r`` and
space), the operator one of ``=`` (or none), ``!=``, ``>``, ``>=``, ``<``,
``<=``, ``~>``. go-version's ``>``, ``>=``, ``<``, ``<=`` and ``~>`` apply
its pre-release rule: a pre-release version satisfies them only when the
clause's version is a pre-release of the same segments (``2.1.0-beta`` is
not ``>= 2.0.0``). Nomad's **semver** constraints parse clause versions
strictly, have no ``~>``, and order pre-releases by Semver 2.0 alone
(``2.1.0-beta`` *is* ``> 2.0``). In both, the attribute's own value is read
with go-version's loose parser.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from nomad_plugin.jobspec.golang import parse_int

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


def compare(a: Version, b: Version) -> int:
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
    if compare(v, c) < 0:
        return False
    width = len(c.segments)
    if width > len(v.segments):
        return False
    if any(v.segments[i] != c.segments[i] for i in range(c.given - 1)):
        return False
    return c.segments[width - 1] <= v.segments[width - 1]


def _holds(op: str, v: Version, c: Version, semver: bool) -> bool:
    if op in ("", "="):
        return compare(v, c) == 0
    if op == "!=":
        return compare(v, c) != 0
    if op == "~>":
        return _pessimistic(v, c)
    if not semver and not _prerelease_ok(v, c):
        return False
    order = compare(v, c)
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
