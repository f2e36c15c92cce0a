"""ACL tokens as text: the one shape the plugin sends.

A token read from a file (``NOMAD_TOKEN=$(cat token)``, an HCL heredoc)
often ends in a newline, which HTTP forbids in a header value: the HTTP
library then raised an error that quoted the header, token included, in a
form (``b'...\\n'``) the log redactor did not know. So a trailing newline is
stripped, a control character inside the token makes it unusable (it is
refused, never sent), and the redactor masks every spelling of the token
that Python, JSON or an HTTP library may print: raw, ``repr`` of the text
and of its bytes, JSON-escaped, percent-encoded, and each line of it.
Pure; no I/O.
"""

from __future__ import annotations

import re

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def normalise_token(value: str) -> tuple[str, str | None]:
    """(the token to send, why it cannot be sent or None): trailing CR/LF removed, inner control characters refused."""
    token = value.rstrip("\r\n")
    if _CONTROL.search(token):
        return "", "holds a control character (a newline or tab) inside it; a token is one line of printable text"
    return token, None
