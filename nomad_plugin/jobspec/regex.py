"""The ``regexp`` operator with RE2, the engine whose syntax Go's ``regexp`` package implements.

Nomad compiles the constraint's value with ``regexp.Compile`` (job
validation refuses a pattern it rejects) and tests it with ``MatchString``:
an unanchored search over UTF-8 text, ``.`` not matching a newline, ``^``/``$``
at the ends of the text, POSIX classes such as ``[[:alpha:]]``, no
look-around or back-references. The google-re2 binding gives that engine;
patterns are passed as written, never translated. RE2 would log a rejected
pattern on stderr, so logging is turned off: the error comes back as text.

Where the two engines part (tests/jobspec/test_go_oracle_regexp.py compares
them with Go itself), this module follows Go: Go refuses ``\\C`` (any byte),
capture names outside ``[A-Za-z0-9_]`` and 1000 nested capturing groups, all
of which RE2 accepts, so :func:`compile_error` refuses them too. RE2's memory
budget is raised so that it compiles what Go's size limit lets through in
practice (``\\pL{1000}``). What cannot be settled without Go's parser is named
by :func:`caveat`, and check-job prints it as a warning.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import re2

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
