"""What the operator commands share: their parser, the config options, the config they read, one-line failures.

Each option the commands share is spelled and explained once, here.
"""

from __future__ import annotations

import re
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import argparse

    from nomad_plugin.config.model import PluginConfig


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


def described(exc: BaseException) -> str:
    """An exception in words: an ``OSError`` as "path: reason", without Python's ``[Errno N]``."""
    if isinstance(exc, OSError) and exc.strerror:
        return f"{exc.filename}: {exc.strerror}" if exc.filename is not None else exc.strerror
    return str(exc)


def fail(command: str, message: str, code: int = 2) -> int:
    """One line on stderr, ``<command>: <message>``; the exit status."""
    sys.stderr.write(f"{command}: {message}\n")
    return code
