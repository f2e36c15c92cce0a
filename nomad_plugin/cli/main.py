"""``nomad-device-lingjun``: serve the plugin (what Nomad runs), or run an operator command.

With Nomad's magic cookie and no arguments it serves go-plugin; without either it explains itself
and exits 1 (go-plugin's convention). Commands are imported by name and heavy imports stay inside
functions: Nomad launches the plugin three times at every agent start and waits for each handshake.
The options the commands share are built here, so each is spelled and explained once.
"""

from __future__ import annotations

import importlib
import os
import re
import sys
from typing import TYPE_CHECKING

from nomad_plugin.goplugin.handshake import MAGIC_COOKIE_KEY

if TYPE_CHECKING:
    import argparse

    import grpc

    from nomad_plugin.config.model import PluginConfig
    from nomad_plugin.goplugin.serve import Lifecycle

# command -> ("module[:function]" taking argv and returning the exit status, one-line help)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "serve": ("nomad_plugin.cli.main:serve", "serve the plugin (what Nomad runs; needs the magic cookie)"),
    "xdm-sim": ("nomad_plugin.cli.xdm_sim", "run the XDM simulator on a socket directory"),
    "demo": ("nomad_plugin.cli.demo", "simulator + plugin + a job, shown as Nomad would show them"),
    "doctor": ("nomad_plugin.cli.doctor", "check a node's install and say what to fix"),
    "grants": ("nomad_plugin.cli.grants", "list the grants the plugin holds and why; release one by hand"),
    "check-job": ("nomad_plugin.cli.check_job", "dry-run a job's device blocks against the live fingerprint"),
    "fingerprint": ("nomad_plugin.cli.fingerprint", "print the fingerprint this node would send to Nomad"),
    "xdm-probe": ("nomad_plugin.cli.xdm_probe", "probe XDM's sockets and print raw responses"),
    "node-meta": (
        "nomad_plugin.cli.fingerprint:node_meta_command",
        "print this node's topology keys as a client meta block",
    ),
    "topology": ("nomad_plugin.cli.topology", "where a job of N cards fits: the cluster by pod and leaf switch"),
    "runtime-kit": ("nomad_plugin.cli.runtime_kit", "Runtime Kit on this node: status, enable, disable"),
}

USAGE = f"""\
nomad-device-lingjun: a HashiCorp Nomad device plugin for Alibaba Cloud Lingjun
(XDM) accelerators: whole cards, time-division shares and MIG slices.

This binary is a plugin. It is not meant to be executed directly: Nomad runs
it from its plugin_dir. To install it:

  1. copy this file into the agent's plugin_dir, named nomad-device-lingjun
  2. add to the client's agent configuration (see plugin.hcl):
       plugin "nomad-device-lingjun" {{
         config {{ }}
       }}
  3. restart the Nomad agent; `nomad node status -verbose` lists the devices.

Operator commands:
{chr(10).join(f"  {name:<12} {text}" for name, (_, text) in SUBCOMMANDS.items())}

Run `nomad-device-lingjun <command> --help` for details.
"""

INTERNAL_ERROR = "internal error"  # tests/operator/test_dist_adverse.py fails on it: a case to handle


def main(argv: list[str] | None = None) -> int:
    """Run a command; a closed stdout ends it quietly, whatever wrote to it (argparse's --help too)."""
    try:
        try:
            return _dispatch(list(sys.argv[1:] if argv is None else argv))
        finally:
            sys.stdout.flush()
    except BrokenPipeError:
        return closed_pipe_exit()


def _dispatch(args: list[str]) -> int:
    if not args:
        if os.environ.get(MAGIC_COOKIE_KEY) is None:
            sys.stderr.write(USAGE)
            return 1
        args = ["serve"]
    if args[0] in ("-h", "--help", "help"):
        sys.stdout.write(USAGE)
        return 0
    if args[0] in ("-v", "--version", "version"):
        from nomad_plugin import __version__

        sys.stdout.write(f"nomad-device-lingjun {__version__}\n")
        return 0
    if args[0] == "--self-check":  # hidden: the shipped executable's interpreter (tests/operator/test_dist.py)
        from nomad_plugin.util.bundle import self_check

        return self_check()
    if args[0] == "serve":
        from nomad_plugin.goplugin.handshake import choose_polling

        choose_polling()  # before grpc is imported: it reads GRPC_EXPERIMENTS once
        return serve(args[1:])
    if args[0] not in SUBCOMMANDS:
        import difflib

        close = difflib.get_close_matches(args[0], list(SUBCOMMANDS), n=1, cutoff=0.6)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        sys.stderr.write(f"unknown command {args[0]!r}{hint}\n\n{USAGE}")
        return 2
    module, _, function = SUBCOMMANDS[args[0]][0].partition(":")
    try:
        result: int = getattr(importlib.import_module(module), function or "main")(args[1:])
    except (BrokenPipeError, SystemExit):
        raise
    except KeyboardInterrupt:
        sys.stderr.write("\n")
        return 130  # 128 + SIGINT, as a shell reports Ctrl-C
    except Exception as exc:  # a case the command did not foresee: one line, never a traceback
        detail = " ".join(str(exc).split())[:300]
        sys.stderr.write(
            f"nomad-device-lingjun {args[0]}: {INTERNAL_ERROR}: {type(exc).__name__}: {detail} "
            "(a bug: please report it with the command line)\n"
        )
        return 70  # EX_SOFTWARE
    return result


def closed_pipe_exit() -> int:
    """The reader of stdout went away (``doctor | head -1``): stop quietly with 128 + SIGPIPE; stdout
    goes to /dev/null so the interpreter's final flush prints no "Exception ignored"."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return 141


# -- serve: the composition root -----------------------------------------------------------


class NomadDevicePlugin:
    """Nomad's BasePlugin and DevicePlugin services over one ``PluginApp``: the one place where the
    transport meets Nomad's services and the engines (docs/architecture.md)."""

    def __init__(self) -> None:
        from nomad_plugin.app import PluginApp

        self.app = PluginApp()

    def register(self, server: grpc.Server, lifecycle: Lifecycle) -> None:
        from nomad_plugin._proto.nomad import base_pb2_grpc, device_pb2_grpc
        from nomad_plugin.nomad.services import BaseService, DeviceService

        base_pb2_grpc.add_BasePluginServicer_to_server(BaseService(self.app, apply_logging), server)
        device_pb2_grpc.add_DevicePluginServicer_to_server(DeviceService(self.app, lifecycle), server)

    def close(self) -> None:
        self.app.close()


def apply_logging(config: PluginConfig) -> None:
    """SetConfig's log level and secrets (the token in ``nomad_token_file`` too), for the hclog handler on
    stderr (the agent's log)."""
    from nomad_plugin.config.decode import secret_values
    from nomad_plugin.goplugin import logging as hclog
    from nomad_plugin.util.secret_file import SecretFile

    in_file = SecretFile(config.nomad_token_file, "nomad_token_file").secret if config.nomad_token_file else ""
    hclog.set_secrets([*secret_values(config), in_file])
    hclog.set_level(config.log_level)


def serve(argv: list[str]) -> int:
    from nomad_plugin.goplugin import serve as transport

    return transport.main(argv, NomadDevicePlugin)


# -- what the operator commands share -----------------------------------------------------


def command_parser(name: str, doc: str, paragraph: int = 0, epilog: str | None = None) -> argparse.ArgumentParser:
    """The parser of ``nomad-device-lingjun <name>``, described by one paragraph of ``doc`` with its
    markup (``x``, :role:`x`) as plain text."""
    import argparse
    import textwrap

    parts = [part for part in doc.strip().split("\n\n") if part.strip()]
    text = re.sub(r":[a-z]+:`([^`]+)`", r"\1", re.sub(r"``([^`]+)``", r"\1", parts[min(paragraph, len(parts) - 1)]))
    return argparse.ArgumentParser(
        prog=f"nomad-device-lingjun {name}",
        description=textwrap.fill(" ".join(text.split()), 100),
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )


def add_config_options(p: argparse.ArgumentParser, node: bool = False) -> argparse._MutuallyExclusiveGroup | None:
    """``--plugin-config`` and ``--set``; with ``node`` also ``--profile`` or ``--socket-dir``."""
    source = None
    if node:
        source = p.add_mutually_exclusive_group()
        source.add_argument("--profile", help="an embedded XDM simulator with this profile (e.g. h800-8)")
        source.add_argument("--socket-dir", help="XDM socket directory (dp2mgr.sock, config-daemon.sock)")
    p.add_argument("--plugin-config", help="agent file or directory with the plugin block (e.g. /etc/nomad.d)")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help='override a config option (an HCL literal, e.g. default_mode="tdm")',
    )
    return source


def plugin_config(path: str | None, overrides: list[str], validate: bool = False) -> PluginConfig:
    """The config SetConfig decodes from the agent's files and overrides (``validate``: and checks)."""
    from nomad_plugin.backend_select import accept_config
    from nomad_plugin.config.decode import decode_config
    from nomad_plugin.launcher.config import load_config, msgpack_config

    return (accept_config if validate else decode_config)(msgpack_config(load_config(path, overrides)))


def fail(command: str, message: str, code: int = 2) -> int:
    """One line on stderr, ``<command>: <message>``; the exit status."""
    sys.stderr.write(f"{command}: {message}\n")
    return code


if __name__ == "__main__":
    sys.exit(main())
