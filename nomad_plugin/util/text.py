"""Strings from outside (XDM, the Nomad API, the operator's config) made safe to repeat, send or use. Pure.

Nomad's agent writes a plugin's log message and a gRPC error's text into its own log as they are: a
newline starts a line that looks like the agent's own, an ESC sequence rewrites the operator's
terminal. So such text is escaped wherever the plugin repeats it, and bounded: one answer must not
fill a log line or overflow gRPC's metadata limit (an error travels in a header).
"""

from __future__ import annotations

import posixpath
import re

# C0 and C1 controls, DEL, and the Unicode marks that reorder or break lines in a terminal.
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u200e\u200f\u202a-\u202e\u2066-\u2069]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
#: Default bound of one repeated text (an error's details, a health reason).
MAX_TEXT = 1024


def _escape(match: re.Match[str]) -> str:
    ch = match.group(0)
    code = ord(ch)
    return _NAMED.get(ch) or (f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}")


def clip(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters, saying how many were left out."""
    if limit <= 0 or len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text) - limit} more characters)"


def printable(text: object, limit: int = MAX_TEXT) -> str:
    """One line of text: control characters escaped (``\\n``, ``\\x1b``), at most ``limit`` characters (0: no bound)."""
    return clip(_UNSAFE.sub(_escape, text if isinstance(text, str) else str(text)), limit)


def has_unsafe(text: str) -> bool:
    """Whether ``text`` holds a character ``printable`` would escape."""
    return _UNSAFE.search(text) is not None


def name(text: object, limit: int = 128) -> str:
    """A name Nomad can carry (a device group, an attribute value's label): printable, one line, no '/'.

    Control characters become spaces, '/' (the separator of Nomad's ``vendor/type/name``) becomes
    '-', runs of spaces shrink to one.
    """
    value = _UNSAFE.sub(" ", text if isinstance(text, str) else str(text)).replace("/", "-")
    return " ".join(value.split())[:limit].strip()


# A token read from a file (``NOMAD_TOKEN=$(cat token)``, an HCL heredoc) often ends in a newline,
# which HTTP forbids in a header value; the HTTP library's error then quotes the header, token
# included, as ``b'...\n'``. So the trailing newline goes, a control character inside refuses the
# token (it is never sent), and the log handler and the API client mask every spelling of it.
_TOKEN_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
#: Shorter fragments would mask ordinary words; no real token is this short.
MIN_SECRET = 4


def normalise_token(value: str) -> tuple[str, str | None]:
    """(the token to send, why it cannot be sent or None): trailing CR/LF removed, inner control characters refused."""
    token = value.rstrip("\r\n")
    if _TOKEN_CONTROL.search(token):
        return "", "holds a control character (a newline or tab) inside it; a token is one line of printable text"
    return token, None


def secret_forms(value: str) -> set[str]:
    """Every printable spelling of a secret: raw, stripped, ``repr`` of the text and of its bytes (an
    HTTP library quotes a bad header as ``b'...\\n'``), JSON-escaped, percent-encoded, each line of it."""
    if not value:
        return set()
    import json  # only with a secret: not on the plugin's launch path
    from urllib.parse import quote

    forms = {
        value,
        value.strip(),
        repr(value)[1:-1],
        repr(value.encode("utf-8", "backslashreplace"))[2:-1],
        json.dumps(value)[1:-1],
        quote(value, safe=""),
    }
    forms.update(part.strip() for part in re.split(r"[\r\n]+", value))
    return {f for f in forms if len(f) >= MIN_SECRET}


# A data_dir is a directory the plugin creates and owns (0700): an absolute, normal path, neither a
# directory the system owns nor a shared scratch directory. SetConfig refuses the others before
# anything runs; ``journal/datadir.py`` applies the same rules to the path a symlink resolves to.

#: Directories the system owns (a directory below them is fine).
SYSTEM_DIRS = frozenset(
    "/ /bin /boot /etc /home /lib /lib32 /lib64 /libx32 /media /mnt /opt /root /run /run/lock /run/user"
    " /sbin /srv /tmp /usr /usr/bin /usr/lib /usr/lib64 /usr/libexec /usr/local /usr/local/bin"
    " /usr/local/lib /usr/local/sbin /usr/sbin /usr/share /var /var/cache /var/lib /var/local /var/lock"
    " /var/log /var/mail /var/opt /var/run /var/spool /var/tmp".split()
)
#: Kernel and device filesystems: nothing below them can hold a journal.
PSEUDO_TREES = ("/proc", "/sys", "/dev")
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def data_dir_problem(path: str) -> str | None:
    """Why ``path`` can never be the plugin's data directory, or None when it may be."""
    if not path:
        return "is empty (the journal would land in the agent's working directory)"
    if _CONTROL.search(path):
        return "holds a control character"
    if not path.startswith("/"):
        return "is relative (it would resolve against the agent's working directory)"
    if ".." in path.split("/"):
        return "has a '..' component"
    normal = posixpath.normpath(path)
    if normal.startswith("//"):
        normal = normal[1:]
    if normal in SYSTEM_DIRS:
        return f"is the system directory {normal} (use a directory of the plugin's own below it)"
    for tree in PSEUDO_TREES:
        if normal == tree or normal.startswith(tree + "/"):
            return f"lies in {tree}, a kernel or device filesystem"
    return None


# An HTTP client's transport errors (httpx's class names) in words.
_TRANSPORT = {
    "ConnectError": "cannot connect",
    "ReadError": "the connection broke while reading the answer",
    "WriteError": "the connection broke while sending the request",
    "RemoteProtocolError": "the answer is not HTTP",
    "LocalProtocolError": "the request could not be sent as HTTP",
    "UnsupportedProtocol": "the address is not http:// or https://",
    "ProxyError": "the proxy refused the request",
}


def transport_words(exc: BaseException) -> str:
    """What failed, then the system's reason without Python's ``[Errno N]``."""
    reason = re.sub(r"\[Errno -?\d+\] ", "", str(exc)) or "no reason given"
    return f"{_TRANSPORT.get(type(exc).__name__, type(exc).__name__)}: {reason}"
