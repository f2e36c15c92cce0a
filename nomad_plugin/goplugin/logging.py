"""hclog-style JSON log lines on the real stderr, with secrets redacted.

go-plugin reads the plugin's stderr line by line and parses each line as an
hclog JSON entry: ``@level`` must be one of trace/debug/info/warn/error (not
"warning"), ``@timestamp`` must have exactly six fractional digits and a
``Z`` or ``±hh:mm`` offset, and every other key becomes a key/value pair in
Nomad's agent log. A line that does not parse is logged verbatim at DEBUG,
so every line we write must be one complete JSON object.

The rest of the code base logs through ``get_logger(__name__)``; the module
name becomes ``@module`` ("nomad-device-lingjun.xdm.client").
"""

from __future__ import annotations

import logging
import os
import re
import sys
import threading
from collections.abc import Iterable, Mapping
from typing import IO, Any

ROOT_MODULE = "nomad-device-lingjun"
TRACE = 5
logging.addLevelName(TRACE, "TRACE")

# config log_level -> Python level
LEVELS: dict[str, int] = {
    "trace": TRACE,
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warn": logging.WARNING,
    "error": logging.ERROR,
}

REDACTED = "<redacted>"
# "token=abc", "X-Nomad-Token: abc", "nomad_token = abc": mask the value even
# when it was never configured (e.g. read from $NOMAD_TOKEN by another layer).
_ASSIGNMENT_PATTERN = r"(?i)((?:x-nomad-token|nomad_token|secret_?id|token)[\"']?\s*[:=]\s*[\"']?)([^\s\"',;}]+)"
_token_assignment: re.Pattern[str] | None = None  # compiled on the first record, not before the handshake


def _token_pattern() -> re.Pattern[str]:
    global _token_assignment
    if _token_assignment is None:
        _token_assignment = re.compile(_ASSIGNMENT_PATTERN)
    return _token_assignment


# go-plugin reads stderr with a 64 KiB line buffer and splits longer lines,
# which then no longer parse as JSON: keep every line well below that.
MAX_MESSAGE = 8192
MAX_ERROR = 16384
MAX_FIELD = 2048


def hclog_level(levelno: int) -> str:
    """The hclog level name for a Python level (hclog has no "critical" or "warning")."""
    if levelno <= TRACE:
        return "trace"
    if levelno <= logging.DEBUG:
        return "debug"
    if levelno <= logging.INFO:
        return "info"
    if levelno <= logging.WARNING:
        return "warn"
    return "error"


def hclog_timestamp(created: float) -> str:
    """``YYYY-MM-DDTHH:MM:SS.ffffffZ``: the layout go-plugin's parser accepts."""
    from datetime import datetime, timezone  # on the first record, not before the handshake (issue 14)

    return datetime.fromtimestamp(created, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def module_name(name: str) -> str:
    """``nomad_plugin.xdm.client`` -> ``nomad-device-lingjun.xdm.client``."""
    if name == ROOT_MODULE or name.startswith(ROOT_MODULE + "."):
        return name
    for prefix in ("nomad_plugin.", "nomad_plugin"):
        if name.startswith(prefix):
            name = name[len(prefix) :]
            break
    return f"{ROOT_MODULE}.{name}" if name else ROOT_MODULE


def get_logger(module: str) -> logging.Logger:
    """The logger for one part of the plugin; pass ``__name__`` or a short name like "xdm"."""
    return logging.getLogger(module_name(module))


#: Shorter fragments would mask ordinary words; no real token is this short.
MIN_SECRET = 4


def secret_forms(value: str) -> set[str]:
    """Every printable spelling of a secret worth masking.

    Raw and stripped; ``repr`` of the text and of its bytes (an HTTP library
    quotes a bad header as ``b'...\\n'``); JSON-escaped; percent-encoded; and
    each line of it. Pieces shorter than ``MIN_SECRET`` are left out.
    """
    if not value:
        return set()
    import json  # only with a secret: this module is read before the handshake
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


class SecretRedactor(logging.Filter):
    """Replaces configured secret values (and token-looking assignments) in every record.

    Attached to the handler, so it covers records from every logger,
    including third-party ones (grpc) that might echo request data.
    """

    def __init__(self) -> None:
        super().__init__()
        self._secrets: tuple[str, ...] = ()
        self._lock = threading.Lock()

    def set_secrets(self, values: Iterable[str]) -> None:
        # Every spelling of each secret (raw, repr- and JSON-escaped, as the bytes an HTTP library
        # quotes, each line of it: util/tokens.py), longest first so a secret containing another is
        # masked whole; very short values would mask ordinary words, and are not real tokens.
        forms: set[str] = set()
        for value in values:
            if isinstance(value, str) and value:
                forms |= secret_forms(value)
        kept = sorted(forms, key=len, reverse=True)
        with self._lock:
            self._secrets = tuple(kept)

    def redact(self, text: str) -> str:
        for secret in self._secrets:
            if secret in text:
                text = text.replace(secret, REDACTED)
        return _token_pattern().sub(lambda m: m.group(1) + REDACTED, text)

    def filter(self, record: logging.LogRecord) -> bool:
        message = self.redact(record.getMessage())
        record.msg, record.args = message, None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = self.redact(record.exc_text)
        record.exc_info = None
        fields = getattr(record, "fields", None)
        if isinstance(fields, Mapping):
            record.fields = {k: self.redact(v) if isinstance(v, str) else v for k, v in fields.items()}
        return True


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + f"... ({len(text) - limit} more chars)"


# Nomad's agent writes a plugin's message into its own log as it is (hclog), so a newline in it
# starts a line that reads like the agent's own, an ESC sequence rewrites the operator's terminal,
# a carriage return hides what came before. Messages get no raw control character: a newline
# continues as "  | " (hclog's own mark for a value's continuation lines, which cannot pass for a
# new entry), every other control character but TAB is escaped. Values keep their newlines, which
# hclog itself prefixes with "  | ", and lose every other control character.
_MESSAGE_UNSAFE = "[\x00-\x08\x0a-\x1f\x7f-\x9f\u2028\u2029]"
_VALUE_UNSAFE = "[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029]"
_unsafe: dict[str, re.Pattern[str]] = {}  # compiled on the first record, not before the handshake


def _escape_control(match: re.Match[str]) -> str:
    ch = match.group(0)
    if ch == "\n":
        return "\n  | "
    return f"\\x{ord(ch):02x}" if ord(ch) <= 0xFF else f"\\u{ord(ch):04x}"


def _sub(pattern: str, text: str) -> str:
    compiled = _unsafe.get(pattern)
    if compiled is None:
        compiled = _unsafe[pattern] = re.compile(pattern)
    return compiled.sub(_escape_control, text)


def safe_message(text: str) -> str:
    """A log message that cannot forge a line in the agent's log (see above)."""
    return _sub(_MESSAGE_UNSAFE, text) if not text.isprintable() else text


def safe_value(text: str) -> str:
    """A key/value string without control characters other than newline and TAB (hclog prefixes newlines)."""
    return _sub(_VALUE_UNSAFE, text) if not text.isprintable() else text


def _jsonable(value: Any, depth: int = 0) -> Any:
    if value is None or isinstance(value, (int, float, bool)):
        return value
    if isinstance(value, str):
        return _clip(safe_value(value), MAX_FIELD)
    if depth < 3 and isinstance(value, (list, tuple)):
        return [_jsonable(v, depth + 1) for v in value[:64]]
    if depth < 3 and isinstance(value, Mapping):
        return {str(k): _jsonable(v, depth + 1) for k, v in list(value.items())[:64]}
    return _clip(safe_value(str(value)), MAX_FIELD)


class HclogJsonFormatter(logging.Formatter):
    """One hclog JSON object per record; extra key/values come from ``extra={"fields": {...}}``."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "@level": hclog_level(record.levelno),
            "@message": _clip(safe_message(record.getMessage()), MAX_MESSAGE),
            "@module": module_name(record.name),
            "@timestamp": hclog_timestamp(record.created),
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, Mapping):
            for key, value in fields.items():
                if not str(key).startswith("@"):
                    entry[str(key)] = _jsonable(value)
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            entry["error"] = _clip(safe_value(record.exc_text), MAX_ERROR)
        import json  # on the first record, not before the handshake (issue 14)

        # ensure_ascii keeps the line free of raw newlines and odd bytes.
        return json.dumps(entry, ensure_ascii=True, separators=(",", ":"))


class _Fd2Stream:
    """Writes straight to file descriptor 2, whatever ``sys.stderr`` is later rebound to."""

    def __init__(self, fd: int = 2) -> None:
        self._fd = fd

    def write(self, text: str) -> int:
        data = text.encode("utf-8", "replace")
        view = memoryview(data)
        while view:
            try:
                written = os.write(self._fd, view)
            except InterruptedError:
                continue
            except OSError:
                return 0  # stderr gone (agent died): nothing useful left to do
            view = view[written:]
        return len(text)

    def flush(self) -> None:
        return None


REDACTOR = SecretRedactor()
_handler: logging.Handler | None = None


def make_handler(stream: IO[str] | None = None) -> logging.Handler:
    """A handler writing hclog JSON lines (to fd 2 unless a stream is given)."""
    handler = logging.StreamHandler(stream if stream is not None else _Fd2Stream())
    handler.setFormatter(HclogJsonFormatter())
    handler.addFilter(REDACTOR)
    return handler


def configure(level: str = "info", stream: IO[str] | None = None) -> None:
    """Route all logging (ours and third-party warnings) to one hclog JSON handler."""
    global _handler
    root = logging.getLogger()
    if _handler is not None:
        root.removeHandler(_handler)
    _handler = make_handler(stream)
    root.addHandler(_handler)
    root.setLevel(logging.WARNING)  # foreign libraries: warnings and errors only
    env_token = os.environ.get("NOMAD_TOKEN", "")
    if env_token:
        REDACTOR.set_secrets([env_token])
    set_level(level)
    logging.captureWarnings(True)
    sys.excepthook = _log_uncaught
    threading.excepthook = _log_thread_exception


def set_level(level: str) -> None:
    """Apply the config ``log_level`` to the plugin's own loggers."""
    logging.getLogger(ROOT_MODULE).setLevel(LEVELS.get(level, logging.INFO))


def set_secrets(values: Iterable[str]) -> None:
    """Values that must never appear in a log line (config options marked secret)."""
    extra = [os.environ.get("NOMAD_TOKEN", "")]
    REDACTOR.set_secrets([*values, *extra])


def _log_uncaught(exc_type: type[BaseException], exc: BaseException, tb: Any) -> None:
    get_logger("crash").error("uncaught exception: %s", exc, exc_info=(exc_type, exc, tb))


def _log_thread_exception(args: threading.ExceptHookArgs) -> None:
    if args.exc_type is SystemExit or args.exc_value is None:
        return
    thread = args.thread.name if args.thread is not None else "?"
    get_logger("crash").error(
        "uncaught exception in thread %s: %s",
        thread,
        args.exc_value,
        exc_info=(args.exc_type, args.exc_value, args.exc_traceback),
    )
