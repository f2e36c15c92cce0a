"""``nomad-device-lingjun xdm-sim``: run the XDM simulator in the foreground, or control a running one.

The socket directory is locked and its sockets are never taken over from a process that answers
on them (an XDM daemon or another simulator); a path too long for a Unix socket is refused.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import logging
import os
import signal
import socket
import sys
import tempfile
import time
from pathlib import Path
from types import FrameType

from nomad_plugin.cli.common import command_parser, described, fail
from nomad_plugin.sim import Simulator
from nomad_plugin.sim.allocation import STYLES
from nomad_plugin.sim.control import COMMANDS, send_command
from nomad_plugin.sim.profiles import ALIASES, PROFILES
from nomad_plugin.sim.schema import builtin_schema

DEFAULT_DIR = str(Path(tempfile.gettempdir()) / "xdm-sim" / "sockets")

_PROFILES = "\n".join(f"  {name:<10} {spec.description}" for name, spec in PROFILES.items())
_ALIASES = ", ".join(f"{a}={n}" for a, n in ALIASES.items())
_CTL = "\n".join(f"  {cmd:<40} {text}" for cmd, text in COMMANDS.items())

EPILOG = f"""\
profiles (card minors are 0-based):
{_PROFILES}
  nvml       this machine's real NVIDIA GPUs (same as --nvml-mirror)
  aliases: {_ALIASES}

sockets in --socket-dir: dp2mgr.sock (xdm.XpuDeviceManagerService),
config-daemon.sock (config.AmpConfigService), xdm-sim-control.sock (control).
Point the plugin at them with xdm_socket / config_socket.

faults (from another terminal, via `xdm-sim ctl`): restart (sockets vanish,
then return; grants survive), crash (stale socket files, ECONNREFUSED),
revive, slow-start, per-RPC latency or hang, health flips, cards removed and
added, error mode (in-band status or gRPC codes), Runtime Kit disabled.

served schema (both sockets): the reconstruction in proto/lingjun, the
schema the plugin guesses when it is given no other.
  --reflection on serves gRPC server reflection (v1alpha, also answered on the
  v1 path) with the served schema's descriptors; off (default) answers
  UNIMPLEMENTED.
  --emit-schema DIR writes the served schema as api_outer.proto,
  config_service.proto and descriptor_set.pb (a FileDescriptorSet, e.g. for
  grpcurl -protoset against an XDM without reflection), then exits.

control commands (nomad-device-lingjun xdm-sim ctl --socket-dir DIR COMMAND ...):
{_CTL}

examples:
  nomad-device-lingjun xdm-sim --profile m890p-8 --socket-dir /tmp/xdm
  nomad-device-lingjun xdm-sim ctl --socket-dir /tmp/xdm health 3 unhealthy "XID 79"
  nomad-device-lingjun xdm-sim ctl --socket-dir /tmp/xdm restart 2
  nomad-device-lingjun xdm-sim --reflection on --socket-dir /tmp/xdm
  nomad-device-lingjun xdm-sim --emit-schema /tmp/xdm-schema
"""


def _run_parser() -> argparse.ArgumentParser:
    parser = command_parser(
        "xdm-sim",
        "Run a simulated Lingjun XDM node in the foreground (Ctrl-C or SIGTERM stops it). "
        "`xdm-sim ctl ...` controls a running one.",
        epilog=EPILOG,
    )
    parser.add_argument("--profile", default="h800-8", help="node profile (default h800-8; see below)")
    parser.add_argument("--socket-dir", default=DEFAULT_DIR, help=f"where the sockets go (default {DEFAULT_DIR})")
    parser.add_argument("--state-file", help="JSON file keeping grants and the enabled flag across restarts")
    parser.add_argument("--style", choices=STYLES, default="env+devices", help="container spec style of Allocate")
    parser.add_argument("--collect-interval-ms", type=int, default=1000, help="exporter collection interval")
    parser.add_argument("--error-mode", choices=("inband", "grpc"), default="inband")
    parser.add_argument("--push-on-allocation", action="store_true", help="ListAndWatch also pushes on grants")
    parser.add_argument("--topology", choices=("normal", "extra-level", "malformed"), default="normal")
    parser.add_argument("--seed", type=int, default=0, help="metrics random seed")
    parser.add_argument("--nvml-mirror", action="store_true", help="present this machine's real NVIDIA GPUs")
    parser.add_argument(
        "--reflection", choices=("on", "off"), default="off", help="serve gRPC server reflection (default off)"
    )
    parser.add_argument("--emit-schema", metavar="DIR", help="write the served schema (.proto + descriptor set), exit")
    parser.add_argument("-q", "--quiet", action="store_true", help="log warnings only")
    return parser


def _ctl(argv: list[str]) -> int:
    parser = command_parser(
        "xdm-sim ctl", "Send one command to a running simulator's control socket.", epilog="commands:\n" + _CTL
    )
    parser.add_argument("--socket-dir", default=DEFAULT_DIR)
    parser.add_argument("--timeout", type=float, default=120.0)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    if not args.command:
        parser.error("a command is required")
    try:
        result = send_command(Path(args.socket_dir) / "xdm-sim-control.sock", args.command, args.timeout)
    except (ConnectionError, RuntimeError) as exc:
        return fail("xdm-sim ctl", str(exc), 1)
    sys.stdout.write((result if isinstance(result, str) else json.dumps(result, indent=2, sort_keys=True)) + "\n")
    return 0


def main(argv: list[str]) -> int:
    if argv and argv[0] == "ctl":
        return _ctl(argv[1:])
    args = _run_parser().parse_args(argv)
    if args.emit_schema:
        try:
            written = builtin_schema().emit(Path(args.emit_schema))
        except OSError as exc:
            return fail("xdm-sim", f"--emit-schema {args.emit_schema}: {exc.strerror or exc}")
        sys.stderr.write("".join(f"xdm-sim: wrote {path}\n" for path in written))
        return 0
    logging.basicConfig(
        level=logging.WARNING if args.quiet else logging.INFO,
        format="%(asctime)s xdm-sim %(levelname)s %(message)s",
        stream=sys.stderr,
    )
    socket_dir = Path(args.socket_dir)
    if problem := socket_dir_problem(socket_dir):
        return fail("xdm-sim", problem)
    lock = claim_socket_dir(socket_dir)
    if isinstance(lock, str):
        return fail("xdm-sim", lock)
    try:
        return _serve(args, socket_dir)
    finally:
        with contextlib.suppress(OSError):
            (socket_dir / LOCK_NAME).unlink()
        os.close(lock)


SOCKET_NAMES = ("dp2mgr.sock", "config-daemon.sock", "xdm-sim-control.sock")
LOCK_NAME = "xdm-sim.lock"
MAX_SOCKET_PATH = 107  # sun_path is 108 bytes with its terminating NUL


def socket_dir_problem(socket_dir: Path) -> str:
    """Why the simulator cannot serve in ``socket_dir`` ("" if it can): a path too long for a Unix
    socket, or a socket there that answers (an XDM or simulator, never replaced)."""
    for name in SOCKET_NAMES:
        path = socket_dir / name
        size = len(os.fsencode(str(path.absolute())))
        if size > MAX_SOCKET_PATH:
            return (
                f"--socket-dir {socket_dir} is too long: {path} would be {size} bytes and a Unix socket path "
                f"holds at most {MAX_SOCKET_PATH}; choose a shorter directory (e.g. /tmp/xdm)"
            )
    for name in SOCKET_NAMES:
        path = socket_dir / name
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.settimeout(1.0)
            probe.connect(str(path))
        except OSError:
            continue  # absent or stale: the simulator may take the name
        finally:
            probe.close()
        return (
            f"{path} is served by a running process (an XDM daemon or another simulator); xdm-sim leaves it "
            "alone: stop that process first or choose another --socket-dir"
        )
    return ""


def claim_socket_dir(socket_dir: Path) -> int | str:
    """An exclusive lock on ``socket_dir`` (its file descriptor), or why another simulator holds it."""
    try:
        socket_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(socket_dir / LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        return f"--socket-dir {socket_dir}: {exc.strerror or exc}"
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.read(fd, 32).decode(errors="replace").strip() or "?"
        os.close(fd)
        return (
            f"another xdm-sim (pid {holder}) serves {socket_dir}; its sockets are left alone: stop it first or "
            "choose another --socket-dir"
        )
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    return fd


def _serve(args: argparse.Namespace, socket_dir: Path) -> int:
    try:
        sim = Simulator(
            socket_dir,
            "nvml" if args.nvml_mirror else args.profile,
            state_file=args.state_file,
            style=args.style,
            collect_interval_ms=args.collect_interval_ms,
            error_mode=args.error_mode,
            push_on_allocation=args.push_on_allocation,
            topology_variant=args.topology,
            seed=args.seed,
            reflection=args.reflection == "on",
        )
    except (ValueError, RuntimeError, OSError) as exc:
        return fail("xdm-sim", described(exc))
    # Written by the signal handler, which takes no lock (not logging's, not an Event's): it runs on the
    # main thread between two bytecodes and could find that lock held by the code it interrupted.
    stop: list[str] = []

    def _stop(signum: int, _frame: FrameType | None) -> None:
        stop.append(signal.Signals(signum).name)

    signal.signal(signal.SIGINT, _stop)
    signal.signal(signal.SIGTERM, _stop)
    try:
        sim.start()
    except (OSError, RuntimeError) as exc:
        sim.stop()
        return fail("xdm-sim", f"cannot serve in {socket_dir}: {described(exc)}")
    log = logging.getLogger(__name__)
    for card in sim.cards:
        log.info(
            "card %d %s %s %d MiB pci %s%s",
            card.minor, card.uuid, card.model, card.memory_mib, card.pci_bus_id, " MIG" if card.mig_capable else "",
        )  # fmt: skip
    log.info("dp2mgr %s | config %s | control %s", sim.dp2mgr_path, sim.config_path, sim.control_path)
    while not stop:
        time.sleep(0.5)
    log.info("signal %s: stopping", stop[0])
    sim.stop()
    log.info("stopped")
    return 0
