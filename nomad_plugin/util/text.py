"""Text from outside (XDM, the Nomad API) made safe to log, to put in an error, or to hand to Nomad.

Nomad's agent writes a plugin's log message and a gRPC error's text into its
own log as they are: a newline in them starts a line that looks like the
agent's own (``[ERROR] agent: ...``), an ESC sequence recolours or rewrites
the operator's terminal, a carriage return hides what came before it. Such
text is therefore escaped (``\\n``, ``\\x1b``) wherever the plugin repeats
it, and bounded, so that one answer cannot fill a log line or overflow
gRPC's metadata limit (an error travels in a header). Pure; no I/O.
"""

from __future__ import annotations

import re

# C0 and C1 controls, DEL, and the Unicode marks that reorder or break lines in a terminal.
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u200e\u200f\u202a-\u202e\u2066-\u2069]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
#: Default bound of one repeated text (an error's details, a health reason).
MAX_TEXT = 1024


def _escape(match: re.Match[str]) -> str:
    ch = match.group(0)
    named = _NAMED.get(ch)
    if named is not None:
        return named
    code = ord(ch)
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def clip(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters, saying how many were left out."""
    if limit <= 0 or len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text) - limit} more characters)"


def printable(text: object, limit: int = MAX_TEXT) -> str:
    """One line of text: control characters escaped (``\\n``, ``\\x1b``), at most ``limit`` characters (0: no bound)."""
    value = text if isinstance(text, str) else str(text)
    if _UNSAFE.search(value):
        value = _UNSAFE.sub(_escape, value)
    return clip(value, limit)


def has_unsafe(text: str) -> bool:
    """Whether ``text`` holds a character ``printable`` would escape."""
    return _UNSAFE.search(text) is not None


def name(text: object, limit: int = 128) -> str:
    """A name Nomad can carry (a device group, an attribute value's label): printable, one line, no '/'.

    Control characters become spaces, '/' (the separator of Nomad's
    ``vendor/type/name``) becomes '-', runs of spaces shrink to one.
    """
    value = text if isinstance(text, str) else str(text)
    value = _UNSAFE.sub(" ", value).replace("/", "-")
    value = " ".join(value.split())
    return value[:limit].strip()
