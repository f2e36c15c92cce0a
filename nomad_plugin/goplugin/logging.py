"""The plugin's one log handler: hclog JSON lines on fd 2, secrets redacted, control characters escaped.

go-plugin's client reads the plugin's stderr line by line through a 64 KiB buffer and parses each
line as hclog JSON (go-plugin ``client.go`` ``logStderr``, ``log_entry.go`` ``parseJSON``):
``@level`` is one of trace/debug/info/warn/error, ``@timestamp`` has the layout
``2006-01-02T15:04:05.000000Z07:00``, every other key becomes a key/value pair in the agent's log.
A line that does not parse, or is longer than the buffer, is logged verbatim at debug; so every
record becomes one bounded JSON object.

Modules log with plain ``logging.getLogger(__name__)``; the entry point installs this handler on
the root logger once (``configure``). Redaction and escaping happen here, for every logger,
third-party ones included, so no module needs a logger of its own kind.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import threading
import time
from collections.abc import Iterable, Mapping
from typing import IO, Any

from nomad_plugin import PLUGIN_NAME
from nomad_plugin.util.text import clip, secret_forms

#: The logger whose level ``log_level`` sets; foreign libraries stay at the root's WARNING.
PACKAGE_LOGGER = "nomad_plugin"
TRACE = 5
logging.addLevelName(TRACE, "TRACE")
LEVELS = {"trace": TRACE, "debug": logging.DEBUG, "info": logging.INFO, "warn": logging.WARNING, "error": logging.ERROR}

REDACTED = "<redacted>"
# "token=abc", "X-Nomad-Token: abc", "nomad_token = abc": masked even when never configured (a token
# read from $NOMAD_TOKEN by another layer, echoed by a library).
_TOKEN_ASSIGNMENT = re.compile(
    r"(?i)((?:x-nomad-token|nomad_token|secret_?id|token)[\"']?\s*[:=]\s*[\"']?)([^\s\"',;}]+)"
)

# Bounds well below go-plugin's 64 KiB line buffer.
MAX_MESSAGE = 8192
MAX_ERROR = 16384
MAX_FIELD = 2048

# Nomad's agent writes a plugin's message into its own log as it is: a newline would start a line
# that reads like the agent's own, an ESC sequence rewrites the operator's terminal, a CR hides what
# came before. In a message a newline continues as "  | " (hclog's mark for a continuation line,
# which cannot pass for a new entry) and every other control character but TAB is escaped. Values
# keep their newlines, which hclog itself prefixes with "  | ", and lose every other control character.
_MESSAGE_UNSAFE = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f\u2028\u2029]")
_VALUE_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029]")

_secrets: tuple[str, ...] = ()  # every spelling, longest first; replaced whole, never mutated
log = logging.getLogger(__name__)


def hclog_level(levelno: int) -> str:
    """hclog's level name for a Python level (hclog has no "critical" or "warning")."""
    for limit, name in ((TRACE, "trace"), (logging.DEBUG, "debug"), (logging.INFO, "info"), (logging.WARNING, "warn")):
        if levelno <= limit:
            return name
    return "error"


def hclog_timestamp(created: float) -> str:
    """UTC, exactly six fractional digits and ``Z``: the layout go-plugin's parser accepts."""
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(created)) + f".{int(created % 1 * 1e6):06d}Z"


def module_name(name: str) -> str:
    """``@module``: ``nomad_plugin.xdm.client`` -> ``nomad-device-lingjun.xdm.client``; a foreign logger below it."""
    if name == PLUGIN_NAME or name.startswith(PLUGIN_NAME + "."):
        return name
    name = name.removeprefix(PACKAGE_LOGGER).lstrip(".")
    return f"{PLUGIN_NAME}.{name}" if name else PLUGIN_NAME


def set_secrets(values: Iterable[str]) -> None:
    """Values never to log (config options marked secret); $NOMAD_TOKEN always counts."""
    global _secrets
    forms: set[str] = set()
    for value in [*values, os.environ.get("NOMAD_TOKEN", "")]:
        if isinstance(value, str):
            forms |= secret_forms(value)
    _secrets = tuple(sorted(forms, key=len, reverse=True))  # a secret holding another is masked whole


def redact(text: str) -> str:
    for secret in _secrets:
        if secret in text:
            text = text.replace(secret, REDACTED)
    return _TOKEN_ASSIGNMENT.sub(lambda m: m.group(1) + REDACTED, text)


def _escape(match: re.Match[str]) -> str:
    ch = match.group(0)
    if ch == "\n":
        return "\n  | "
    return f"\\x{ord(ch):02x}" if ord(ch) <= 0xFF else f"\\u{ord(ch):04x}"


def _value(value: Any, depth: int = 0) -> Any:
    if value is None or isinstance(value, (int, float, bool)):
        return value
    if depth < 3 and isinstance(value, (list, tuple)):
        return [_value(v, depth + 1) for v in value[:64]]
    if depth < 3 and isinstance(value, Mapping):
        return {str(k): _value(v, depth + 1) for k, v in list(value.items())[:64]}
    return clip(_VALUE_UNSAFE.sub(_escape, redact(str(value))), MAX_FIELD)


class HclogFormatter(logging.Formatter):
    """One hclog JSON object per record; key/values come from ``extra={"fields": {...}}``."""

    def format(self, record: logging.LogRecord) -> str:
        message = _MESSAGE_UNSAFE.sub(_escape, redact(record.getMessage()))
        entry: dict[str, Any] = {
            "@level": hclog_level(record.levelno),
            "@message": clip(message, MAX_MESSAGE),
            "@module": module_name(record.name),
            "@timestamp": hclog_timestamp(record.created),
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, Mapping):
            entry.update({str(k): _value(v) for k, v in fields.items() if not str(k).startswith("@")})
        if record.exc_info:
            error = redact(self.formatException(record.exc_info))
            entry["error"] = clip(_VALUE_UNSAFE.sub(_escape, error), MAX_ERROR)
        import json  # on the first record, not before the handshake

        return json.dumps(entry, ensure_ascii=True, separators=(",", ":"))  # ASCII: one line, no odd bytes


class _Stderr:
    """fd 2 itself: nothing buffered when the process ends with ``os._exit``, and a stderr whose reader
    died (the agent) is no error to report."""

    def write(self, text: str) -> None:
        data = text.encode("utf-8", "replace")
        try:
            while data:
                data = data[os.write(2, data) :]
        except OSError:
            pass

    def flush(self) -> None:
        return None


def make_handler(stream: IO[str] | None = None) -> logging.Handler:
    """A handler writing hclog JSON lines (to fd 2 unless a stream is given)."""
    handler = logging.StreamHandler(stream if stream is not None else _Stderr())
    handler.setFormatter(HclogFormatter())
    return handler


def configure(level: str = "info", stream: IO[str] | None = None) -> None:
    """Route all logging (third-party warnings and uncaught exceptions too) to the hclog handler, once per process."""
    root = logging.getLogger()
    root.addHandler(make_handler(stream))
    root.setLevel(logging.WARNING)
    set_secrets(())
    set_level(level)
    logging.captureWarnings(True)
    sys.excepthook = _log_uncaught
    threading.excepthook = _log_thread_exception


def set_level(level: str) -> None:
    """Apply the config ``log_level`` to the plugin's own loggers."""
    logging.getLogger(PACKAGE_LOGGER).setLevel(LEVELS.get(level, logging.INFO))


def _log_uncaught(exc_type: type[BaseException], exc: BaseException, tb: Any) -> None:
    log.error("uncaught exception: %s", exc, exc_info=(exc_type, exc, tb))


def _log_thread_exception(args: threading.ExceptHookArgs) -> None:
    if args.exc_type is SystemExit or args.exc_value is None:
        return
    thread = args.thread.name if args.thread is not None else "?"
    log.error(
        "uncaught exception in thread %s: %s",
        thread,
        args.exc_value,
        exc_info=(args.exc_type, args.exc_value, args.exc_traceback),
    )
