"""The ``regexp`` operator with RE2, the engine whose syntax Go's ``regexp`` package implements.

Nomad compiles the constraint's value with ``regexp.Compile`` (job
validation refuses a pattern it rejects) and tests it with ``MatchString``:
an unanchored search over UTF-8 text, ``.`` not matching a newline, ``^``/``$``
at the ends of the text, POSIX classes such as ``[[:alpha:]]``, no
look-around or back-references. The google-re2 binding gives that engine;
patterns are passed as written, never translated. RE2 would log a rejected
pattern on stderr, so logging is turned off: the error comes back as text.
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Any

import re2

_OPTIONS = re2.Options()
_OPTIONS.log_errors = False


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
    "pattern too large - compile failed": "expression too large",
}


def _go_words(detail: str) -> str:
    """``error parsing regexp: <Go's words>: `<the part>```, from RE2's ``<words>: <the part>``."""
    words, _, part = detail.partition(": ")
    go = _GO_WORDS.get(words)
    if go is None:
        return detail
    return f"error parsing regexp: {go}: `{part}`" if part else f"error parsing regexp: {go}"


_SURROGATE = re.compile("[\ud800-\udfff]")


def _utf8(text: str) -> str:
    """Text Go could hold: a lone surrogate (from JSON escapes) becomes U+FFFD, as Go's JSON decoder makes it."""
    return _SURROGATE.sub("\ufffd", text)


@lru_cache(maxsize=256)
def compile_error(pattern: str) -> str:
    """Empty when ``pattern`` compiles, else the engine's reason."""
    try:
        re2.compile(_utf8(pattern), _OPTIONS)
    except re2.error as exc:
        detail = exc.args[0] if exc.args else exc
        return _go_words(detail.decode("utf-8", "replace") if isinstance(detail, bytes) else str(detail))
    return ""


@lru_cache(maxsize=256)
def _compiled(pattern: str) -> Any:
    return re2.compile(_utf8(pattern), _OPTIONS)


def search(pattern: str, text: str) -> bool | None:
    """True/False when ``pattern`` matches somewhere in ``text``; None when it does not compile."""
    if compile_error(pattern):
        return None
    return _compiled(pattern).search(_utf8(text)) is not None
