"""The go-plugin launch rules, decided before grpc is imported.

The host (Nomad) puts its magic cookie and the app protocol versions it speaks in the plugin's
environment, and reads one line from the plugin's stdout once the gRPC server listens:
``CORE|APP|unix|<socket>|grpc`` (go-plugin ``server.go`` ``Serve``; Nomad's cookie and version:
``plugins/base/plugin.go`` ``Handshake``). No sixth (certificate) field: Nomad never enables
AutoMTLS, and the client loads a sixth field of over 50 characters as a certificate into a TLS
config it never made (``client.go`` ``Start``, ``loadServerCert``).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Container, Mapping, MutableMapping
from typing import NamedTuple

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


class Negotiation(NamedTuple):
    version: int | None  # None: no common version
    warnings: tuple[str, ...] = ()
    error: str = ""


def cookie_error(env: Mapping[str, str]) -> str:
    value = env.get(MAGIC_COOKIE_KEY)
    if value == MAGIC_COOKIE_VALUE:
        return ""
    if value is None:
        return COOKIE_MESSAGE
    return COOKIE_MESSAGE + f"({MAGIC_COOKIE_KEY} is set but does not hold Nomad's cookie value.)\n"


def negotiate(env: Mapping[str, str]) -> Negotiation:
    """Pick the app protocol: the plugin speaks only 2; an absent or empty variable means 2."""
    raw = env.get(PROTOCOL_VERSIONS_ENV, "")
    if not raw.strip():
        return Negotiation(APP_PROTOCOL_VERSION)
    offered: list[int] = []
    warnings: list[str] = []
    for part in raw.split(","):
        try:
            offered.append(int(part.strip()))
        except ValueError:
            warnings.append(f"ignoring bad entry {part.strip()!r} in {PROTOCOL_VERSIONS_ENV}={raw!r}")
    if APP_PROTOCOL_VERSION in offered:
        return Negotiation(APP_PROTOCOL_VERSION, tuple(warnings))
    return Negotiation(
        None,
        tuple(warnings),
        f"incompatible plugin protocol: the host offers {PROTOCOL_VERSIONS_ENV}={raw!r}, "
        f"this plugin speaks only version {APP_PROTOCOL_VERSION} (gRPC, Nomad >= 0.9)",
    )


def handshake_line(socket_path: str, app_version: int = APP_PROTOCOL_VERSION) -> str:
    return f"{CORE_PROTOCOL_VERSION}|{app_version}|unix|{socket_path}|grpc\n"


def make_socket_dir(env: Mapping[str, str] | None = None) -> str:
    """A fresh 0700 directory for the socket, named ``plugin*`` as go-plugin names its own.

    Under $PLUGIN_UNIX_SOCKET_DIR when the host sets it (go-plugin's ``RunnerFunc``), else in the
    first of ``tempfile``'s candidates that takes it, else in /tmp when the socket path would not fit
    a Unix socket address. Not ``tempfile.mkdtemp``: it imports shutil and random, which the launch
    path does without.
    """
    source = os.environ if env is None else env
    host_dir = source.get(SOCKET_DIR_ENV)
    if host_dir:
        candidates = [host_dir]
    else:
        candidates = [source[n] for n in ("TMPDIR", "TEMP", "TMP") if source.get(n)]
        candidates += ["/tmp", "/var/tmp", "/usr/tmp", os.getcwd()]  # noqa: S108 (as tempfile.gettempdir)
    directory = _mkdtemp(candidates)
    if len(os.path.join(directory, SOCKET_NAME)) > MAX_SOCKET_PATH:
        os.rmdir(directory)
        directory = _mkdtemp(["/tmp"])  # noqa: S108 (exclusive mkdir, random name, 0700: as mkdtemp)
    os.chmod(directory, 0o700)  # whatever the umask
    return directory


def _mkdtemp(parents: list[str]) -> str:
    error: OSError = FileNotFoundError("no directory to make the plugin socket in")
    for parent in parents:
        for _ in range(100):
            path = os.path.join(parent, "plugin" + os.urandom(4).hex())
            try:
                os.mkdir(path, 0o700)
            except FileExistsError:
                continue
            except OSError as exc:  # missing, not a directory, not writable: the next candidate
                error = exc
                break
            return os.path.abspath(path)
        else:
            error = FileExistsError(f"no unused name under {parent}")
    raise error


#: grpcio's documented variable, read once when grpc is imported.
VARIABLE = "GRPC_EXPERIMENTS"
#: grpcio's EventEngine endpoints (client, listener, everything else) off.
DIRECT_POLLING = "-event_engine_client,-event_engine_listener,-event_engine_for_all_other_endpoints"


def choose_polling(environ: MutableMapping[str, str] = os.environ, loaded: Container[str] = sys.modules) -> bool:
    """Let grpcio's own poller move the bytes on the threads that wait for them; True when set here.

    grpcio's EventEngine threads would poll and hand each message to the waiting Python thread, which
    costs more CPU than the plugin's few small messages (BENCHMARKS.md). Nothing is set once grpc is
    imported (it has read its configuration) or when the operator set the variable, even empty.
    """
    if VARIABLE in environ or "grpc" in loaded:
        return False
    environ[VARIABLE] = DIRECT_POLLING
    return True
