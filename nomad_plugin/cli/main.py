"""``nomad-device-lingjun``: serve the plugin (what Nomad runs), or run an operator command.

With Nomad's magic cookie and no arguments it serves go-plugin; without either it explains itself
and exits 1 (go-plugin's convention). This module parses the command line and dispatches: the
plugin is assembled in ``app.py`` (the composition root), the options the commands share in
``cli/common.py``. Commands are imported by name and heavy imports stay inside functions: Nomad
launches the plugin three times at every agent start and waits for each handshake.
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import TYPE_CHECKING

from nomad_plugin.goplugin.handshake import MAGIC_COOKIE_KEY

if TYPE_CHECKING:
    from nomad_plugin.goplugin.serve import ServedPlugin

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


def serve(argv: list[str]) -> int:
    """Hand the go-plugin transport a factory of the plugin, which ``app.py`` assembles after the handshake."""
    from nomad_plugin.goplugin import serve as transport

    return transport.main(argv, _assembled_plugin)


def _assembled_plugin() -> ServedPlugin:
    from nomad_plugin.app import NomadDevicePlugin

    return NomadDevicePlugin()


def closed_pipe_exit() -> int:
    """The reader of stdout went away (``doctor | head -1``): stop quietly with 128 + SIGPIPE; stdout
    goes to /dev/null so the interpreter's final flush prints no "Exception ignored"."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return 141


if __name__ == "__main__":
    sys.exit(main())
