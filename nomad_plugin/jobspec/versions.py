"""``version`` and ``semver`` constraint operators (a compact hashicorp/go-version).

``value = ">= 535.0, < 600"``: comma-separated clauses, each an operator
(``=``, ``!=``, ``>``, ``>=``, ``<``, ``<=``, ``~>``) and a version. Versions
compare segment by segment (missing segments are 0); a pre-release sorts
before its release. ``semver`` additionally requires at most three numeric
segments, as Nomad's semver checker does.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_VERSION = re.compile(
    r"v?(?P<num>[0-9]+(?:\.[0-9]+)*)"
    r"(?:-?(?P<pre>[0-9A-Za-z~-]+(?:\.[0-9A-Za-z~-]+)*))?"
    r"(?:\+(?P<meta>[0-9A-Za-z~-]+(?:\.[0-9A-Za-z~-]+)*))?"
)
_CLAUSE = re.compile(r"\s*(?P<op>~>|>=|<=|!=|=|>|<)?\s*(?P<ver>\S+)\s*")


@dataclass(frozen=True)
class Version:
    segments: tuple[int, ...]
    pre: str
    given: int  # segments written (for ~>)

    def key(self, width: int) -> tuple[tuple[int, ...], int, tuple[tuple[int, int | str], ...]]:
        padded = self.segments + (0,) * (width - len(self.segments))
        pre = tuple((0, int(p)) if p.isdigit() else (1, p) for p in self.pre.split(".")) if self.pre else ()
        return padded, (0 if self.pre else 1), pre


def parse_version(text: str, strict: bool = False) -> Version | None:
    match = _VERSION.fullmatch(text.strip())
    if match is None:
        return None
    segments = tuple(int(s) for s in match.group("num").split("."))
    if strict and len(segments) > 3:
        return None
    return Version(segments, match.group("pre") or "", len(segments))


def _cmp(a: Version, b: Version) -> int:
    width = max(len(a.segments), len(b.segments), 3)
    ka, kb = a.key(width), b.key(width)
    return (ka > kb) - (ka < kb)


def _pessimistic(v: Version, c: Version) -> bool:
    if _cmp(v, c) < 0:
        return False
    prefix = max(1, c.given - 1)
    padded = v.segments + (0,) * (prefix - len(v.segments))
    return padded[:prefix] == c.segments[:prefix]


def check(version_text: str, constraint_text: str, strict: bool = False) -> tuple[bool, str]:
    """(matches, "") or (False, why the version or constraint could not be read)."""
    version = parse_version(version_text, strict)
    if version is None:
        return False, f"{version_text!r} is not a {'semver ' if strict else ''}version"
    for clause in constraint_text.split(","):
        match = _CLAUSE.fullmatch(clause)
        wanted = parse_version(match.group("ver"), strict) if match else None
        if match is None or wanted is None:
            return False, f'{clause.strip()!r} is not a version constraint (e.g. ">= 1.2, < 2")'
        op = match.group("op") or "="
        order = _cmp(version, wanted)
        ok = {
            "=": order == 0,
            "!=": order != 0,
            ">": order > 0,
            ">=": order >= 0,
            "<": order < 0,
            "<=": order <= 0,
            "~>": _pessimistic(version, wanted),
        }[op]
        if not ok:
            return False, ""
    return True, ""
