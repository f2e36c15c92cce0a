"""``nomad-device-lingjun runtime-kit status|enable|disable``: the Runtime Kit switch of this node.

config-daemon's QueryStatus, Enable and Disable (``xdm/runtime_switch.py``; the plugin itself never
calls the last two), the Runtime Kit Controller's Job Agent for Nomad (docs/operator.md). A switch
asks for confirmation (``--yes``), and ``disable`` refuses while the journal holds grants unless
``--force``: what XDM does to running allocations then is not documented. A status the schema in use
cannot read is "unknown, because ...", and nothing is switched on it. Exit status: 0 done or nothing
to do, 1 failed, refused or unknown, 2 bad usage or config.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from contextlib import closing
from typing import TextIO

from nomad_plugin.cli.common import add_config_options, command_parser, fail, plugin_config
from nomad_plugin.config.model import ConfigError, PluginConfig
from nomad_plugin.journal import Journal, JournalCorrupt
from nomad_plugin.launcher.config import LauncherConfigError
from nomad_plugin.model.errors import PluginError
from nomad_plugin.xdm.runtime_switch import RuntimeKitSwitch


def parser() -> argparse.ArgumentParser:
    p = command_parser("runtime-kit", "Query, enable or disable Runtime Kit on this node through XDM's config-daemon.")
    p.add_argument("action", choices=("status", "enable", "disable"))
    add_config_options(p)
    p.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    p.add_argument("--force", action="store_true", help="disable even while the plugin holds grants")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds Enable/Disable may take (default 120)")
    p.add_argument("--json", action="store_true", help="print one JSON document")
    return p


def _word(enabled: bool) -> str:
    return "enabled" if enabled else "disabled"


def confirm(question: str, stdin: TextIO, stdout: TextIO) -> bool | None:
    """y/N on a terminal; None when there is no terminal to ask on."""
    if not stdin.isatty():
        return None
    stdout.write(f"{question} [y/N] ")
    stdout.flush()
    return stdin.readline().strip().lower() in ("y", "yes")


def main(argv: list[str], ask: Callable[[str, TextIO, TextIO], bool | None] = confirm) -> int:
    args = parser().parse_args(argv)
    try:
        config = plugin_config(args.plugin_config, args.set)
    except (LauncherConfigError, ConfigError, PluginError) as exc:
        return fail("runtime-kit", f"{args.plugin_config or '(defaults)'}: {exc}")
    with closing(RuntimeKitSwitch(config, timeout=args.timeout)) as switch:
        try:
            return _run(args, config, switch, ask)
        except PluginError as exc:
            sys.stderr.write(
                f"runtime-kit: config-daemon ({config.config_socket}): {exc}\n"
                "(is Runtime Kit installed and its config-daemon running? `nomad-device-lingjun doctor` checks it)\n"
            )
            return 1


def _run(
    args: argparse.Namespace,
    config: PluginConfig,
    switch: RuntimeKitSwitch,
    ask: Callable[[str, TextIO, TextIO], bool | None],
) -> int:
    status = switch.status()
    where = switch.describe()
    if args.action == "status":
        if args.json:
            doc = {"enabled": None if status.doubt else status.enabled, "status": status.word, "reason": status.doubt}
            sys.stdout.write(json.dumps({**doc, "message": status.message, "config_daemon": where}) + "\n")
        else:
            note = f", because {status.doubt}" if status.doubt else f" ({status.message})" if status.message else ""
            sys.stdout.write(f"Runtime Kit on this node: {status.word}{note}\nconfig-daemon: {where}\n")
        return 1 if status.doubt else 0
    if status.doubt:
        sys.stderr.write(
            f"runtime-kit: Runtime Kit's status on this node is unknown, because {status.doubt}; "
            f"{args.action} refused: nothing was sent to config-daemon ({where})\n"
        )
        return 1
    wanted = args.action == "enable"
    if status.enabled == wanted:
        sys.stdout.write(f"Runtime Kit is already {_word(wanted)} on this node: nothing changed\n")
        return 0
    if not wanted and not args.force:
        try:
            grants = len(Journal.snapshot(config.data_dir))  # read without writing
        except (OSError, JournalCorrupt):
            grants = 0  # no journal: no grants
        if grants:
            sys.stderr.write(
                f"runtime-kit: the plugin holds {grants} grant(s) on this node (`nomad-device-lingjun grants`); "
                "what XDM does to running allocations while disabled is not documented. Drain the node's device "
                "jobs first (nomad node drain -enable <node>), or pass --force.\n"
            )
            return 1
    if not args.yes:
        answer = ask(
            f"{args.action.capitalize()} Runtime Kit on this node ({where})? It may restart node services; "
            "Runtime Kit's guide advises doing it off-peak.",
            sys.stdin,
            sys.stdout,
        )
        if answer is None:
            sys.stderr.write(f"runtime-kit: no terminal to confirm on: run `runtime-kit {args.action} --yes`\n")
            return 2
        if not answer:
            sys.stdout.write("not changed\n")
            return 1
    outcome = switch.switch("Enable" if wanted else "Disable")
    said = (
        f"{outcome.action} answered "
        + ("success" if outcome.success else "failure" if outcome.success is False else "(no readable success field)")
        + (f": {outcome.message}" if outcome.message else "")
    )
    if args.json:
        doc = {
            "action": outcome.action,
            "before": outcome.before.word,
            "after": outcome.after.word,
            "success": outcome.success,
            "message": outcome.message,
            "done": outcome.done,
        }
        sys.stdout.write(json.dumps(doc) + "\n")
    if not outcome.done:
        after = outcome.after
        now = f"reads unknown, because {after.doubt}" if after.doubt else f"still says {after.word}: nothing changed"
        sys.stderr.write(f"runtime-kit: {said}, but QueryStatus {now}\n")
        return 1
    if not args.json:
        sys.stdout.write(
            f"Runtime Kit: {outcome.before.word} -> {outcome.after.word} ({said})\n"
            f"The plugin's runtime_kit attribute (and {config.node_meta_prefix}runtime_kit meta with node_meta) "
            f"follows within one inventory_resync_period.\n"
        )
    return 0
