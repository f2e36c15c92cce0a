"""Turn XDM failures into the plugin's error types (R7, R15).

Transport trouble becomes ``BackendUnavailable`` with a ``kind`` that tells an
operator what to do: "socket-missing" (XDM not installed or not started),
"connection-refused" (a stale socket file: the daemon is down),
"permission-denied" (not root), "unimplemented" (proto package/service or
schema mismatch), "timeout", "unavailable", "message-too-large". XDM's own
refusals, in-band ``status != 0`` or a refusal-type gRPC code, become
``BackendRefused`` with XDM's message passed through, escaped and bounded
(``util/text.printable``): XDM's text reaches the agent's log and Nomad's
task events, where a newline or ESC in it would forge lines. A stream reset
(``RST_STREAM``, which gRPC reports as INTERNAL) is a transport failure,
not a refusal: it says nothing about what XDM did with the call.
"""

from __future__ import annotations

import errno
import os
import socket
import stat

import grpc

from nomad_plugin.model.errors import BackendRefused, BackendUnavailable, PluginError, SchemaMismatch
from nomad_plugin.util.text import printable

# gRPC codes that mean "XDM understood the request and said no".
REFUSAL_CODES = frozenset(
    {
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.FAILED_PRECONDITION,
        grpc.StatusCode.ALREADY_EXISTS,
        grpc.StatusCode.NOT_FOUND,
        grpc.StatusCode.OUT_OF_RANGE,
        grpc.StatusCode.PERMISSION_DENIED,
        grpc.StatusCode.UNAUTHENTICATED,
        grpc.StatusCode.UNKNOWN,
        grpc.StatusCode.DATA_LOSS,
    }
)
# Transport-level codes (retryable; the socket is diagnosed to say why). INTERNAL is one: gRPC
# reports a reset stream with it, and a broken transport, neither of which is XDM saying no.
TRANSPORT_CODES = frozenset(
    {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED, grpc.StatusCode.ABORTED, grpc.StatusCode.INTERNAL}
)

# grpcio reports a failing response deserializer like this (INTERNAL).
_DECODE_FAILURE = "Exception deserializing response"
# ...a stream the peer (or a proxy) reset like this (INTERNAL): "Received RST_STREAM with error code 2".
_STREAM_RESET = "RST_STREAM"
# ...and a message over the channel's receive limit like this (RESOURCE_EXHAUSTED).
_TOO_LARGE = "larger than max"
#: Bound of XDM text repeated in an error (a gRPC error travels in a header; the agent logs it).
MAX_DETAILS = 1024


class GrpcRefused(BackendRefused):
    """A refusal XDM expressed as a gRPC status code (``code`` keeps which)."""

    def __init__(self, message: str, code: grpc.StatusCode) -> None:
        super().__init__(message, status=_grpc_code_number(code))
        self.code = code


def socket_problem(path: str) -> BackendUnavailable | None:
    """Why ``path`` cannot be dialled right now, or None if a connect works.

    Checked before dialling and after a transport failure: a missing path, a
    path that is not a socket, a stale socket file (ECONNREFUSED) and EACCES
    each get their own kind.
    """
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return BackendUnavailable(f"XDM socket {path} does not exist (is XDM running?)", kind="socket-missing")
    except PermissionError:
        return BackendUnavailable(
            f"no permission to reach XDM socket {path} (XDM sockets are root-only)", "permission-denied"
        )
    except OSError as exc:
        return classify_errno(exc.errno or 0, path)
    if not stat.S_ISSOCK(mode):
        return BackendUnavailable(f"XDM socket path {path} exists but is not a socket", kind="socket-missing")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.settimeout(1.0)
        probe.connect(path)
    except OSError as exc:
        return classify_errno(exc.errno or 0, path)
    finally:
        probe.close()
    return None


def classify_errno(err: int, path: str) -> BackendUnavailable:
    """Map an OS error from reaching the socket to a ``BackendUnavailable``."""
    if err in (errno.ENOENT, errno.ENOTDIR):
        return BackendUnavailable(f"XDM socket {path} does not exist (is XDM running?)", kind="socket-missing")
    if err == errno.ECONNREFUSED:
        return BackendUnavailable(
            f"XDM socket {path} refuses connections: a stale socket file, the XDM daemon is down",
            kind="connection-refused",
        )
    if err in (errno.EACCES, errno.EPERM):
        return BackendUnavailable(
            f"no permission to connect to XDM socket {path} (XDM sockets are root-only; run the plugin as root)",
            kind="permission-denied",
        )
    if err in (errno.ETIMEDOUT, errno.EAGAIN):
        return BackendUnavailable(f"connecting to XDM socket {path} timed out", kind="timeout")
    return BackendUnavailable(f"cannot connect to XDM socket {path}: {os.strerror(err)}", kind="unavailable")


def classify_rpc_error(
    code: grpc.StatusCode | None, details: str, method: str, diagnosis: BackendUnavailable | None
) -> PluginError:
    """Map a failed call to a plugin error. ``diagnosis`` is ``socket_problem``'s verdict."""
    where = f"XDM {method}"
    details = printable(details, MAX_DETAILS)
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED and _TOO_LARGE in details:
        return BackendUnavailable(
            f"{where}: XDM's message is over the plugin's receive limit ({details}); a 16-card node needs far "
            "less, so XDM's answer is malformed or the schema binding is wrong",
            kind="message-too-large",
        )
    if code == grpc.StatusCode.INTERNAL and _STREAM_RESET in details:
        return BackendUnavailable(f"{where} unavailable: the stream was reset ({details})", kind="unavailable")
    if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED) and diagnosis is not None:
        return diagnosis
    if code == grpc.StatusCode.UNIMPLEMENTED:
        return BackendUnavailable(
            f"{where} is not implemented by XDM ({details}): proto package/service name or schema mismatch",
            kind="unimplemented",
        )
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return BackendUnavailable(f"{where} timed out ({details})", kind="timeout")
    if code == grpc.StatusCode.INTERNAL and _DECODE_FAILURE in details:
        return SchemaMismatch(f"XDM schema mismatch: {where}: the response does not decode with the bound schema")
    if code in TRANSPORT_CODES or code is None:
        return BackendUnavailable(f"{where} unavailable: {details or code}", kind="unavailable")
    if code in REFUSAL_CODES:
        return GrpcRefused(details or f"{where} failed with {code.name}", code)
    return BackendUnavailable(f"{where} failed: {code}: {details}", kind="unavailable")


def inband_refusal(status: int, message: str, method: str) -> BackendRefused | None:
    """XDM's in-band ``status``/``message``: 0 is success, anything else a refusal."""
    if status == 0:
        return None
    return BackendRefused(printable(message, MAX_DETAILS) or f"XDM {method} returned status {status}", status=status)


def is_not_found(error: BackendRefused) -> bool:
    """Did XDM refuse because the thing does not exist (Release idempotency, R6)?

    A gRPC refusal counts only when its code is NOT_FOUND. In-band codes are
    undocumented, so an in-band refusal counts when its message says the id is
    unknown (the one place the plugin reads XDM's message text; documented in
    docs/xdm-risks.md, R6).
    """
    if isinstance(error, GrpcRefused):
        return error.code == grpc.StatusCode.NOT_FOUND
    text = str(error).lower()
    return any(
        marker in text
        for marker in ("not found", "not exist", "no such", "no allocation", "unknown allocation", "unknown id")
    )


def _grpc_code_number(code: grpc.StatusCode) -> int:
    value = code.value[0]
    return int(value)
