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
        return detail.decode("utf-8", "replace") if isinstance(detail, bytes) else str(detail)
    return ""


@lru_cache(maxsize=256)
def _compiled(pattern: str) -> Any:
    return re2.compile(_utf8(pattern), _OPTIONS)


def search(pattern: str, text: str) -> bool | None:
    """True/False when ``pattern`` matches somewhere in ``text``; None when it does not compile."""
    if compile_error(pattern):
        return None
    return _compiled(pattern).search(_utf8(text)) is not None
