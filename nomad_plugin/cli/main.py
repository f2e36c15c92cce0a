"""``nomad-device-lingjun``: serve the plugin, or run an operator subcommand.

Nomad starts this executable with its magic cookie in the environment and no
arguments: then we serve the go-plugin protocol. A person running it without
the cookie and without a subcommand gets an explanation and exit status 1
(go-plugin's convention). Subcommands are imported lazily so the plugin's
launch path imports only what serving needs (Nomad launches us three times
at every agent start).
"""

from __future__ import annotations

import importlib
import os
import sys

from nomad_plugin.goplugin.handshake import MAGIC_COOKIE_KEY
from nomad_plugin.goplugin.handshake import MAGIC_COOKIE_VALUE as MAGIC_COOKIE_VALUE  # re-exported for old callers

# subcommand -> (module, one-line help)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "serve": ("nomad_plugin.cli.serve", "serve the plugin (what Nomad runs; needs the magic cookie)"),
    "xdm-sim": ("nomad_plugin.cli.xdm_sim", "run the XDM simulator on a socket directory"),
    "demo": ("nomad_plugin.cli.demo", "simulator + plugin + a job, shown as Nomad would show them"),
    "doctor": ("nomad_plugin.cli.doctor", "check a node's install and say what to fix"),
    "grants": ("nomad_plugin.cli.grants", "list the grants the plugin holds and why; release one by hand"),
    "check-job": ("nomad_plugin.cli.check_job", "dry-run a job's device blocks against the live fingerprint"),
    "fingerprint": ("nomad_plugin.cli.fingerprint", "print the fingerprint this node would send to Nomad"),
    "xdm-probe": ("nomad_plugin.cli.xdm_probe", "probe XDM's sockets and print raw responses"),
    "node-meta": ("nomad_plugin.cli.node_meta", "print this node's topology keys as a client meta block"),
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


def main(argv: list[str] | None = None) -> int:
    """Run a command; a closed stdout ends it quietly, whatever wrote to it (argparse's --help too)."""
    try:
        code = _dispatch(list(sys.argv[1:] if argv is None else argv))
        sys.stdout.flush()
    except BrokenPipeError:
        return closed_pipe_exit()
    except SystemExit:
        try:
            sys.stdout.flush()
        except BrokenPipeError:
            return closed_pipe_exit()
        raise
    return code


INTERNAL_ERROR = "internal error"  # tests/operator/test_dist_adverse.py fails on it: a case to handle


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
    entry = SUBCOMMANDS.get(args[0])
    if entry is None:
        import difflib

        close = difflib.get_close_matches(args[0], list(SUBCOMMANDS), n=1, cutoff=0.6)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        sys.stderr.write(f"unknown command {args[0]!r}{hint}\n\n{USAGE}")
        return 2
    if args[0] == "serve":
        from nomad_plugin.goplugin.handshake import choose_polling

        choose_polling()  # before grpc is imported: it reads GRPC_EXPERIMENTS once
    module = importlib.import_module(entry[0])
    if args[0] == "serve":
        result: int = module.main(args[1:])
        return result
    try:
        result = module.main(args[1:])
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
    """The reader of stdout went away (``doctor | head -1``): stop quietly, as a shell tool does.

    stdout is pointed at /dev/null so the interpreter's final flush does not
    print "Exception ignored ... BrokenPipeError"; 141 is 128 + SIGPIPE.
    """
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return 141


if __name__ == "__main__":
    sys.exit(main())
