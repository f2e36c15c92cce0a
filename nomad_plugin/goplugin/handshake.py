"""The go-plugin handshake rules, as pure functions (nomad-protocol.md §1.1-1.4).

The host (Nomad) puts a magic cookie and the app protocol versions it speaks
in our environment; we answer with one line on stdout once the gRPC server
listens: ``CORE|APP|unix|<socket>|grpc``. No sixth (certificate) field: Nomad
never enables AutoMTLS, and a long sixth field would make it try to load a
certificate into a nil TLS config.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Container, Mapping, MutableMapping

#: Nomad's base.Handshake cookie: the host sets it, so a plugin run by hand can say what it is.
MAGIC_COOKIE_KEY = "NOMAD_PLUGIN_MAGIC_COOKIE"
MAGIC_COOKIE_VALUE = "e4327c2e01eabfd75a8a67adb114fb34a757d57eee7728d857a8cec6e91a7255"
CORE_PROTOCOL_VERSION = 1
APP_PROTOCOL_VERSION = 2  # Nomad's base.Handshake.ProtocolVersion (gRPC plugins)
PROTOCOL_VERSIONS_ENV = "PLUGIN_PROTOCOL_VERSIONS"
SOCKET_DIR_ENV = "PLUGIN_UNIX_SOCKET_DIR"
SOCKET_NAME = "plugin.sock"
MAX_SOCKET_PATH = 100  # sun_path is 108 bytes on Linux; keep a margin

COOKIE_MESSAGE = (
    "This binary is a plugin. These are not meant to be executed directly.\n"
    "Please execute the program that consumes these plugins, which will\n"
    "load any plugins automatically (Nomad: put it in the agent's plugin_dir\n"
    'and add a plugin "nomad-device-lingjun" block; run it with --help for more).\n'
)


class Negotiation:
    """The outcome of ``negotiate``: a plain class, as neither ``dataclasses`` nor a NamedTuple's
    class machinery is worth its import time before the handshake (issue 14)."""

    __slots__ = ("error", "version", "warnings")

    def __init__(self, version: int | None, warnings: tuple[str, ...] = (), error: str = "") -> None:
        self.version = version  # None: no common version
        self.warnings = warnings
        self.error = error

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Negotiation):
            return NotImplemented
        return (self.version, self.warnings, self.error) == (other.version, other.warnings, other.error)

    def __hash__(self) -> int:
        return hash((self.version, self.warnings, self.error))

    def __repr__(self) -> str:
        return f"Negotiation(version={self.version!r}, warnings={self.warnings!r}, error={self.error!r})"


def cookie_error(env: Mapping[str, str]) -> str:
    """Empty when the magic cookie is right, else the message for a human on stderr."""
    value = env.get(MAGIC_COOKIE_KEY)
    if value == MAGIC_COOKIE_VALUE:
        return ""
    if value is None:
        return COOKIE_MESSAGE
    return COOKIE_MESSAGE + f"({MAGIC_COOKIE_KEY} is set but does not hold Nomad's cookie value.)\n"


def negotiate(env: Mapping[str, str]) -> Negotiation:
    """Pick the app protocol: we speak only 2; an absent variable means 2."""
    raw = env.get(PROTOCOL_VERSIONS_ENV)
    if raw is None or raw.strip() == "":
        return Negotiation(APP_PROTOCOL_VERSION)
    offered: list[int] = []
    warnings: list[str] = []
    for part in raw.split(","):
        item = part.strip()
        try:
            offered.append(int(item))
        except ValueError:
            warnings.append(f"ignoring bad entry {item!r} in {PROTOCOL_VERSIONS_ENV}={raw!r}")
    if APP_PROTOCOL_VERSION in offered:
        return Negotiation(APP_PROTOCOL_VERSION, tuple(warnings))
    return Negotiation(
        None,
        tuple(warnings),
        f"incompatible plugin protocol: the host offers {PROTOCOL_VERSIONS_ENV}={raw!r}, "
        f"this plugin speaks only version {APP_PROTOCOL_VERSION} (gRPC, Nomad >= 0.9)",
    )


def handshake_line(socket_path: str, app_version: int = APP_PROTOCOL_VERSION) -> str:
    """The single line go-plugin reads from our stdout (newline included)."""
    return f"{CORE_PROTOCOL_VERSION}|{app_version}|unix|{socket_path}|grpc\n"


def make_socket_dir(env: Mapping[str, str] | None = None) -> str:
    """A fresh private (0700) directory for the socket.

    Under PLUGIN_UNIX_SOCKET_DIR when the host sets it (go-plugin's RunnerFunc
    path; Nomad does not), else under $TMPDIR (then $TEMP, $TMP, /tmp, /var/tmp,
    /usr/tmp, the first that takes it, as ``tempfile``), else /tmp if the path
    would be too long for a Unix socket address. Made here rather than with
    ``tempfile.mkdtemp``: tempfile imports shutil, random and the compression
    modules, a third of our own import time before the handshake (issue 14).
    """
    source = env if env is not None else os.environ
    parent = source.get(SOCKET_DIR_ENV) or None
    directory = _mkdtemp([parent] if parent else _temp_dirs())
    if len(os.path.join(directory, SOCKET_NAME)) > MAX_SOCKET_PATH:
        os.rmdir(directory)
        directory = _mkdtemp(["/tmp"])  # noqa: S108 (exclusive mkdir, random name, 0700: as mkdtemp)
    os.chmod(directory, 0o700)
    return directory


_NAME_CHARS = "abcdefghijklmnopqrstuvwxyz012345"  # 32: an unbiased pick from a random byte's low bits


def _temp_dirs() -> list[str]:
    """Where ``tempfile.gettempdir`` would look, in its order."""
    found = [os.environ[name] for name in ("TMPDIR", "TEMP", "TMP") if os.environ.get(name)]
    return [*found, "/tmp", "/var/tmp", "/usr/tmp", os.getcwd()]  # noqa: S108 (see _mkdtemp)


def _mkdtemp(parents: list[str]) -> str:
    """``<parent>/plugin`` + 8 random characters, made 0700 in the first parent that allows it."""
    last: OSError | None = None
    for parent in parents:
        for _ in range(100):
            path = os.path.join(parent, "plugin" + "".join(_NAME_CHARS[b & 31] for b in os.urandom(8)))
            try:
                os.mkdir(path, 0o700)
            except FileExistsError:
                continue
            except OSError as exc:  # not a directory, not writable: the next candidate
                last = exc
                break
            return os.path.abspath(path)
        else:
            last = FileExistsError(f"no unused name under {parent}")
    raise last if last is not None else FileNotFoundError("no directory to make the plugin socket in")


# How grpcio's core moves the plugin's bytes: on the threads that already wait for them.
#
# Why: grpcio (1.85) hands every socket to its EventEngine by default: four
# ``event_engine`` threads poll, and each message then crosses from one of
# them to the Python thread waiting on the completion queue. The plugin's
# traffic is a few small messages a second on Unix sockets (Nomad's Stats and
# Fingerprint streams, XDM's exporter stream), so those hand-offs were about
# a quarter of its steady-state CPU and thread switches. With the EventEngine
# endpoints off, grpcio's own poller runs on the thread that waits for the
# event. Measured with ``benchmarks/plugin_load.py`` (BENCHMARKS.md, issue
# 14): 86 -> 57 thread switches a second, about 15 % less plugin CPU.
#
# It is grpcio's documented ``GRPC_EXPERIMENTS`` variable, read once when
# grpcio is imported, so this runs first thing in the serving process. An
# operator who sets ``GRPC_EXPERIMENTS`` (even empty) keeps their value.
#

VARIABLE = "GRPC_EXPERIMENTS"
#: grpcio's EventEngine endpoints (client, listener, everything else) off.
DIRECT_POLLING = "-event_engine_client,-event_engine_listener,-event_engine_for_all_other_endpoints"


def choose_polling(environ: MutableMapping[str, str] = os.environ, loaded: Container[str] = sys.modules) -> bool:
    """Default ``GRPC_EXPERIMENTS`` for this process; True when set here.

    Does nothing once grpc is imported (grpcio read its configuration then)
    or when the variable is already set.
    """
    if VARIABLE in environ or "grpc" in loaded:
        return False
    environ[VARIABLE] = DIRECT_POLLING
    return True
