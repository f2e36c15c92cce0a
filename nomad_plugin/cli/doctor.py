"""nomad-device-lingjun doctor: check a node's install and say what to fix.

Each check yields a finding (ok / warn / fail / skip) with a next step. The config is judged by
the agent's parser (HCL v1), the schema's types and the plugin's own SetConfig; then the data dir,
XDM (sockets, schema, Runtime Kit, inventory, topology) or NVML, the Nomad API and its token, node
metadata, the running plugin's grants, the plugin file and lj-runtime. doctor writes nothing.
Exit status 0 when nothing failed (warnings allowed), 1 otherwise.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from nomad_plugin import PLUGIN_NAME, __version__
from nomad_plugin.backend_select import accept_config, choose_backend_name
from nomad_plugin.cli.common import add_config_options, command_parser
from nomad_plugin.cli.doctor_node import FAIL, OK, SKIP, WARN, Finding, Host, NodeChecks
from nomad_plugin.config.model import ConfigError, PluginConfig
from nomad_plugin.journal import datadir, plugin_running
from nomad_plugin.launcher.config import (
    LauncherConfigError,
    PluginBlocks,
    agent_plugin_dir,
    duplicate_notes,
    find_plugin_blocks,
    load_config,
    msgpack_config,
)
from nomad_plugin.model.errors import PluginError
from nomad_plugin.nomad_view.types import Style
from nomad_plugin.reconcile.node_meta import WRITE_POLICY, load_publisher_state, node_write, state_path
from nomad_plugin.reconcile.nomad_api import (
    META_PATH,
    RECOMMENDED_POLICY,
    NomadApiError,
    NomadApiSettings,
    NomadClient,
    check_visibility,
)
from nomad_plugin.reconcile.reconciler import ReconcilerState, reconciler_state_path
from nomad_plugin.util.bundle import plugin_file_identity

NVIDIA_PLUGIN = "nomad-device-nvidia"
CONTAINERD_CONFIG = "etc/containerd/config.toml"
XPU_RUNTIME = "usr/local/harp/kitC/xpu-container-runtime"
RUNTIME_HANDLER = "lj-runtime"


@dataclass
class Doctor(NodeChecks):
    plugin_config: str | None = None
    plugin_dir: str | None = None
    overrides: list[str] = field(default_factory=list)
    host: Host = field(default_factory=Host)
    findings: list[Finding] = field(default_factory=list)
    config: PluginConfig | None = None
    blocks: PluginBlocks | None = None
    verbose: bool = False

    def check_config(self) -> None:
        where = self.plugin_config or "(no --plugin-config: defaults)"
        try:
            if self.plugin_config:
                self.blocks = find_plugin_blocks(self.plugin_config)
            data = msgpack_config(load_config(self.plugin_config, self.overrides))
            self.config = accept_config(data)
        except (LauncherConfigError, ConfigError, PluginError) as exc:
            self.add("config", FAIL, f"{where}: {exc}", _config_next_step(str(exc)))
            self.config = None
            return
        for note in duplicate_notes(self.blocks) if self.blocks is not None else []:
            self.add(
                "plugin block",
                WARN,
                note,
                f'keep one plugin "{PLUGIN_NAME}" block with one config block: what the agent drops silently is '
                "easily edited by mistake",
            )
        self.add(
            "config",
            OK,
            f"{where}: read as the Nomad agent reads it and accepted by the plugin's SetConfig "
            f"(backend {self.config.backend})",
        )
        self._token_placement(where)
        if not self.config.enabled:
            self.add(
                "enabled",
                WARN,
                "enabled = false: the plugin fingerprints no device and refuses every Reserve",
                "set enabled = true to offer the cards; unlike nomad-device-nvidia the plugin keeps its Fingerprint "
                "stream open meanwhile, so Nomad keeps it loaded (docs/nvidia-dropin.md)",
            )

    def _token_placement(self, where: str) -> None:
        """A ``nomad_token`` stands in the agent configuration, which ``/v1/agent/self`` shows (docs/reserve.md)."""
        if self.config is not None and self.config.nomad_token:
            self.add(
                "nomad token",
                WARN,
                f"nomad_token is written in the plugin's config block ({where}): GET /v1/agent/self returns the agent's "
                "configuration, plugin blocks unredacted, to every ACL token with agent:read (monitoring tokens too)",
                "write the token to a file only the Nomad client's user can read (mode 0600) and set nomad_token_file "
                "to its path (read again whenever it changes), or set NOMAD_TOKEN in the agent's environment; then "
                "delete nomad_token, restart the agent and rotate the token",
            )

    def check_data_dir(self) -> None:
        assert self.config is not None
        problem = journal_write_problem(Path(self.config.data_dir))
        if problem:
            self.add(
                "data dir",
                FAIL,
                f"data_dir {self.config.data_dir!r}: {problem}",
                "the grant journal lives there and Reserve refuses every request until it is usable: set data_dir "
                "to a local directory the Nomad client (root) can create and write, e.g. /var/lib/nomad-device-lingjun",
            )
            return
        self.add("data dir", OK, f"data_dir {self.config.data_dir!r} can hold the grant journal")

    def check_nomad(self) -> None:
        assert self.config is not None
        settings = NomadApiSettings.from_config(self.config, self.host.environ)
        if not self.config.reconcile:
            self.add("nomad api", SKIP, "reconcile = false: the plugin does not use the Nomad API")
            return
        policy = " ".join(RECOMMENDED_POLICY.split())
        with contextlib.closing(NomadClient(settings)) as client:
            try:
                node_id = self.config.nomad_node_id or client.node_id()
                page = client.node_allocations(node_id)
                visibility = check_visibility(client)
            except NomadApiError as exc:
                steps = {
                    "forbidden": "the token needs node:read, agent:read (unless nomad_node_id is set) and read-job on "
                    f"every namespace: give it a policy with {policy}; set nomad_token or NOMAD_TOKEN",
                    "unreachable": f"is the Nomad agent running and listening on {settings.address}? set "
                    "nomad_address or NOMAD_ADDR (and the TLS options for an https agent)",
                    "timeout": f"the agent at {settings.address} is too slow to answer; check its load",
                }
                step = steps.get(exc.kind, "check nomad_address and the TLS options")
                self.add("nomad api", FAIL, f"{settings.address}: {exc}", step)
                return
        self.add(
            "nomad api",
            OK,
            f"{settings.address}: node {node_id} readable with the token ({len(page.allocs)} allocations visible)",
        )
        if visibility.complete:
            self.add("nomad visibility", OK, f"the token sees every allocation: {visibility.reason}")
            return
        self.add(
            "nomad visibility",
            WARN,
            f"the token does not see every namespace: {visibility.reason}. Nomad silently leaves those allocations "
            "out, so the plugin releases a grant only after it sees its allocation end (grants of jobs it cannot "
            "see are kept, and shown as unverifiable by `nomad-device-lingjun grants`)",
            f"add a policy to the token with: {policy}",
        )

    def check_node_meta(self) -> None:
        """May the token write node metadata (judged from its policies, nothing written), and did the
        running plugin manage to (``node-meta-state.json``)?"""
        assert self.config is not None
        config, check = self.config, "node meta"
        if not config.node_meta:
            self.add(
                check,
                SKIP,
                "node_meta = false: the topology is not published as node metadata "
                "(`nomad-device-lingjun node-meta` prints it as a client meta block)",
            )
            return
        settings = NomadApiSettings.from_config(config, self.host.environ)
        fix = (
            f"give the token a policy with {WRITE_POLICY} (node:write), or set node_meta = false and put the output "
            "of `nomad-device-lingjun node-meta` in the agent's client { meta { } }"
        )
        with contextlib.closing(NomadClient(settings)) as client:
            try:
                view = client.node_meta()
                allowed, why = node_write(client)
            except NomadApiError as exc:
                step = (
                    fix if exc.kind == "forbidden" else f"check nomad_address ({settings.address}) and the TLS options"
                )
                self.add(check, FAIL, f"{settings.address}{META_PATH}: {exc}", step)
                return
        prefix = config.node_meta_prefix
        published = {k: v for k, v in view.meta.items() if k.startswith(prefix)}
        failed = not allowed
        if not allowed:
            self.add(
                check,
                FAIL,
                f"the Nomad token lacks node:write ({why}): POST {META_PATH} is refused, so the plugin publishes "
                "no topology keys (it keeps serving devices)",
                fix,
            )
        try:
            state = load_publisher_state(state_path(config.data_dir)) if plugin_running(config.data_dir) else None
        except OSError:
            state = None
        if state is not None and state.last_error:
            failed = True
            self.add(check, FAIL, f"the running plugin could not publish: {state.last_error}", state.hint or fix)
        elif state is not None and state.in_sync:
            stale = {k for k, v in state.wanted.items() if published.get(k) != v}
            if stale:
                self.add(
                    check,
                    WARN,
                    f"the agent's metadata differs from what the plugin published for {', '.join(sorted(stale))}",
                    "the plugin rewrites them within one inventory_resync_period; if they keep differing, another "
                    f"tool writes under {prefix!r}: give the plugin its own node_meta_prefix",
                )
        if not failed:
            shown = ", ".join(f"{k}={v}" for k, v in sorted(published.items())) or "none yet"
            self.add(check, OK, f"the token may write node metadata ({why}); published under {prefix!r}: {shown}")

    def check_grants(self) -> None:
        """Grants the running plugin keeps because nothing visible claims them (reconciler-state.json)."""
        assert self.config is not None
        try:
            running = plugin_running(self.config.data_dir)
        except OSError as exc:
            self.add("grants", SKIP, f"data_dir {self.config.data_dir} cannot be read: {exc}")
            return
        if not running:
            self.add("grants", SKIP, "no running plugin on this data_dir (see `nomad-device-lingjun grants`)")
            return
        state = ReconcilerState.load(reconciler_state_path(self.config.data_dir))
        if state is None:
            self.add("grants", SKIP, "a plugin runs on this data_dir; it has not reported its grants' owners yet")
            return
        if not state.unverifiable:
            self.add("grants", OK, f"the running plugin can verify every grant ({len(state.claims)} claimed)")
            return
        shown = ", ".join(state.unverifiable[:5]) + (" ..." if len(state.unverifiable) > 5 else "")
        self.add(
            "grants",
            WARN,
            f"{len(state.unverifiable)} grant(s) kept because no allocation visible to the token claims them: {shown}",
            "run `nomad-device-lingjun grants` to see them; fix the token's policy (see `nomad visibility`), or "
            "check the jobs and release one with `nomad-device-lingjun grants release <id> --force`",
        )

    def check_plugin_dir(self) -> None:
        found = self._plugin_dir()
        if found is None:
            return
        directory, source = found
        if not directory.is_dir():
            self.add(
                "plugin dir",
                FAIL,
                f"{directory} ({source}) is not a directory",
                "create it and set plugin_dir in the agent config",
            )
            return
        if not self.plugin_dir:
            self.add("plugin dir", OK, f"{directory} ({source})")
        blocks = self._block_names()
        try:
            entries = sorted(directory.iterdir())
        except OSError as exc:
            self.add("plugin dir", FAIL, f"{directory} cannot be listed: {exc.strerror or exc}", "run doctor as root")
            return
        self._check_nvidia_neighbour(directory, blocks or set())
        # The agent runs every executable file of plugin_dir whose name (less ".exe") a plugin block names
        # and skips the rest (helper/pluginutils/loader scan): our file is judged, a checksum beside it is not.
        ours = [p for p in entries if p.name in (PLUGIN_NAME, PLUGIN_NAME + ".exe")]
        renamed = [p for p in entries if p not in ours and "lingjun" in p.name and _executable_file(p)]
        if not ours and not renamed:
            self.add(
                "plugin dir",
                FAIL,
                f"no {PLUGIN_NAME} file in {directory}",
                f"copy dist/{PLUGIN_NAME} to {directory / PLUGIN_NAME} and chmod 0755 it",
            )
            return
        for path in [*ours, *renamed]:
            name = path.name[:-4] if path.name.endswith(".exe") else path.name
            if path.is_dir():
                self.add("plugin file", FAIL, f"{path} is a directory", "Nomad skips sub-directories of plugin_dir")
            elif not _executable_file(path):
                self.add(
                    "plugin file",
                    FAIL,
                    f"{path} is not executable",
                    f"chmod 0755 {path} (Nomad skips files without an execute bit)",
                )
            elif blocks is None:
                self.add(
                    "plugin file",
                    SKIP,
                    f"{path} is executable; its name was not matched against a plugin block (the agent config "
                    "could not be read, see the config finding)",
                )
            elif name not in blocks:
                self.add(
                    "plugin file",
                    FAIL,
                    f'{path.name} has no matching plugin "{name}" block (blocks: {", ".join(sorted(blocks)) or "none"})',
                    f"Nomad >= 1.10 only runs plugin files referenced by a plugin block of the same name: rename the file "
                    f'to {PLUGIN_NAME} and use plugin "{PLUGIN_NAME}" {{ ... }}',
                )
            else:
                self._plugin_identity(path)

    def _plugin_identity(self, path: Path) -> None:
        """Is the file that Nomad would run this plugin? Judged from its bytes: doctor runs nothing."""
        what, version, problem = plugin_file_identity(path)
        if problem:
            self.add(
                "plugin file",
                FAIL,
                f"{path} is named like this plugin but {problem}",
                f"copy dist/{PLUGIN_NAME} there again (and compare it with {PLUGIN_NAME}.sha256); Nomad would run "
                "this file and get no plugin",
            )
        elif version and version != __version__:
            self.add(
                "plugin file",
                WARN,
                f"{path} is {what}, version {version}; this doctor is version {__version__}",
                "run the doctor of the version Nomad runs (the plugin file itself: "
                f"{path} doctor ...), or install this version's file",
            )
        else:
            shown = f"{what}, version {version}" if version else what
            self.add("plugin file", OK, f"{path} is {shown}, executable and matched by its plugin block")

    def _plugin_dir(self) -> tuple[Path, str] | None:
        """--plugin-dir, else the plugin dir the agent derives from the files of --plugin-config."""
        if self.plugin_dir:
            return Path(self.plugin_dir), "--plugin-dir"
        if not self.plugin_config or self._block_names() is None or self.blocks is None:
            why = (
                "the agent config could not be read (see the config finding)"
                if self.plugin_config
                else "no --plugin-config"
            )
            self.add("plugin dir", SKIP, f"{why}: give --plugin-dir to check the plugin file")
            return None
        try:
            directory, source = agent_plugin_dir(self.blocks)
        except LauncherConfigError as exc:
            self.add(
                "plugin dir", FAIL, f"{self.plugin_config}: {exc}", "set it to an absolute path in the agent config"
            )
            return None
        if not directory:
            self.add(
                "plugin dir",
                SKIP,
                f"{self.plugin_config} sets neither plugin_dir nor data_dir (the agent then takes them from "
                "-plugin-dir or -data-dir): give --plugin-dir to check the plugin file",
            )
            return None
        return Path(directory), f"{source} in {self.plugin_config}"

    def _block_names(self) -> set[str] | None:
        """Plugin block labels of the agent config; None when it cannot be read."""
        if not self.plugin_config:
            return {PLUGIN_NAME}
        if self.blocks is None:
            try:
                self.blocks = find_plugin_blocks(self.plugin_config)
            except LauncherConfigError:
                return None
        return set(self.blocks.names())

    def _check_nvidia_neighbour(self, directory: Path, blocks: set[str]) -> None:
        neighbours = [p.name for p in sorted(directory.iterdir()) if p.name.startswith(NVIDIA_PLUGIN)]
        if not neighbours:
            return
        theirs = sorted(b for b in blocks if "nvidia" in b)
        enabled = f"its plugin block {', '.join(theirs)}" if theirs else "no plugin block for it in this config"
        self.add(
            "nvidia plugin",
            WARN,
            f"{', '.join(neighbours)} sits in {directory} beside this plugin ({enabled})",
            "both would offer the same NVIDIA GPUs (nvidia/gpu): Nomad could give one card to two tasks. Keep one: "
            f"remove {neighbours[0]}, set enabled = false in its block, or list the cards this plugin serves in "
            "its ignored_gpu_ids (and ours in this plugin's ignored_gpu_ids); see docs/nvidia-dropin.md",
        )

    def check_runtime(self) -> None:
        containerd = self.host.root / CONTAINERD_CONFIG
        runtime = self.host.root / XPU_RUNTIME
        has_handler = containerd.is_file() and RUNTIME_HANDLER in containerd.read_text(errors="replace")
        if runtime.is_file() and has_handler:
            self.add("lj-runtime", OK, f"{runtime} present; {containerd} has the {RUNTIME_HANDLER} handler")
            return
        missing = [str(p) for p, ok in ((runtime, runtime.is_file()), (containerd, has_handler)) if not ok]
        self.add(
            "lj-runtime",
            WARN,
            f"lj-runtime not set up ({'; '.join(missing)} missing or without {RUNTIME_HANDLER})",
            "only needed for containers that rely on XDM's runtime shim (Kubernetes RuntimeClass lj-runtime or "
            "Docker's runtime option); docker/exec tasks get device nodes and env from the plugin without it",
        )

    def run(self, config_only: bool = False) -> list[Finding]:
        self._guard("config", self.check_config)
        if config_only:
            return self.findings
        if self.config is not None:
            self._guard("data dir", self.check_data_dir)
            config = self.config
            if self._guard("backend", lambda: choose_backend_name(config, self.host.nvml_usable)) == "nvml":
                self.add("sockets", SKIP, "the plugin would use the NVML backend: XDM sockets not used")
                self._guard("nvml", self.check_nvml)
            elif self._guard("sockets", self.check_sockets):
                self._guard("xdm", self.check_xdm)
            self._guard("nomad api", self.check_nomad)
            self._guard("node meta", self.check_node_meta)
            self._guard("grants", self.check_grants)
        self._guard("plugin dir", self.check_plugin_dir)
        self._guard("lj-runtime", self.check_runtime)
        return self.findings

    def _guard(self, check: str, step: Callable[[], Any]) -> Any:
        """Run one check; anything it did not foresee (a permission, a vanished file) becomes a finding."""
        try:
            return step()
        except PermissionError as exc:
            self.add(
                check, FAIL, f"permission denied: {exc.filename or exc}", "run doctor as root (sudo), as the agent runs"
            )
        except OSError as exc:
            self.add(check, FAIL, f"{exc.filename or 'a file'}: {exc.strerror or exc}", "check the path named here")
        except Exception as exc:  # the doctor must finish and say what it saw, never print a traceback
            self.add(check, FAIL, f"doctor could not finish this check: {type(exc).__name__}: {exc}", "report this")
        return None


def _executable_file(path: Path) -> bool:
    try:
        return path.is_file() and bool(os.stat(path).st_mode & 0o111)
    except OSError:
        return False


def journal_write_problem(path: Path) -> str:
    """Why the journal cannot live in ``path`` ("" if it can), tried for real and left as found."""
    created: list[Path] = []
    found: os.stat_result | None = None
    try:
        if path.exists() and not path.is_dir():
            return "exists but is not a directory"
        rule = datadir.problem(path)  # the plugin's own rules: owner, mode, system dirs
        if rule is not None:
            return rule
        found = path.stat() if path.exists() else None
        missing = [p for p in (path, *path.parents) if not p.exists()]
        for directory in reversed(missing):
            directory.mkdir(mode=0o700)
            created.append(directory)
        fd, probe = tempfile.mkstemp(prefix=".doctor-", dir=path)
        try:
            os.write(fd, b"probe")
            os.fsync(fd)
        finally:
            os.close(fd)
            os.unlink(probe)
    except OSError as exc:
        return f"cannot create or write it ({exc.strerror or exc})"
    finally:
        for directory in reversed(created):
            with contextlib.suppress(OSError):
                directory.rmdir()
        if found is not None:  # the probe file's coming and going changed the directory's times
            with contextlib.suppress(OSError):
                os.utime(path, ns=(found.st_atime_ns, found.st_mtime_ns))
    return ""


def _config_next_step(message: str) -> str:
    if message.startswith("cannot read "):
        return (
            "point --plugin-config at the agent config file or directory the Nomad client is started with "
            "(its -config), e.g. /etc/nomad.d"
        )
    if "doctor does not evaluate templates" in message:
        return "write the value itself: the agent evaluates the template (no variables), doctor does not"
    if "not valid HCL" in message or "not valid JSON" in message:  # "F is not valid ..." or "F:L:C: not valid ..."
        return "fix the syntax at the place shown: Nomad refuses to start with a config file it cannot parse"
    if "no *.hcl or *.json file" in message:
        return "point --plugin-config at the directory holding the agent's .hcl or .json files"
    if "no plugin" in message and "block" in message:
        return (
            f'add a plugin "{PLUGIN_NAME}" {{ config {{ }} }} block to the agent config (see plugin.hcl): Nomad >= 1.10 '
            "does not run a plugin file that no plugin block names, and older agents run it with defaults only; "
            "then restart the Nomad agent"
        )
    if "is defined" in message or "config blocks" in message:
        return f'keep one plugin "{PLUGIN_NAME}" block with one config block in it'
    return (
        "fix the option named above in the plugin's config block: Nomad refuses to start the agent with it (the "
        "block is decoded against the plugin's schema and checked by its SetConfig). plugin.hcl in the source "
        "tree and the README's configuration reference list every option with its default."
    )


def parser() -> argparse.ArgumentParser:
    p = command_parser("doctor", __doc__ or "")
    add_config_options(p)
    p.add_argument("--plugin-dir", help="the agent's plugin_dir (checks its file's name, mode and contents)")
    p.add_argument("--root", default="/", help=argparse.SUPPRESS)  # tests: where /etc and /usr/local live
    p.add_argument("--json", action="store_true", help="print one JSON document")
    p.add_argument("--verbose", action="store_true", help="also print XDM's field-by-field schema binding report")
    p.add_argument(
        "--config-only",
        action="store_true",
        help="check the plugin block alone: what the agent's parser and the plugin's SetConfig say (no node checks)",
    )
    return p


MARKS = {OK: ("[ OK ]", "green"), WARN: ("[WARN]", "yellow"), FAIL: ("[FAIL]", "red"), SKIP: ("[SKIP]", "dim")}


def summary_line(findings: list[Finding]) -> str:
    """One line that answers "can I restart the agent?"."""
    counts = {status: sum(1 for f in findings if f.status == status) for status in (OK, WARN, FAIL, SKIP)}
    tally = f"{counts[OK]} ok, {counts[WARN]} warning(s), {counts[FAIL]} failed, {counts[SKIP]} skipped"
    if counts[FAIL]:
        failed = list(dict.fromkeys(f.check for f in findings if f.status == FAIL))
        if counts[FAIL] == 1:
            return f"doctor: {tally}: fix the failure above ({failed[0]}), then run doctor again"
        return (
            f"doctor: {tally}: fix the {counts[FAIL]} failures above ({', '.join(failed)}), starting with "
            f"{failed[0]}, then run doctor again"
        )
    if counts[WARN]:
        return f"doctor: {tally}: this node can run the plugin; read the warnings above"
    return f"doctor: {tally}: this node can run the plugin"


def main(argv: list[str], host: Host | None = None) -> int:
    args = parser().parse_args(argv)
    doctor = Doctor(
        args.plugin_config, args.plugin_dir, args.set, host or Host(root=Path(args.root)), verbose=args.verbose
    )
    findings = doctor.run(config_only=args.config_only)
    failed = any(f.status == FAIL for f in findings)
    if args.json:
        doc = {"ok": not failed, "summary": summary_line(findings), "findings": [asdict(f) for f in findings]}
        sys.stdout.write(json.dumps(doc, indent=2) + "\n")
        return 1 if failed else 0
    style = Style(sys.stdout)
    for f in findings:
        mark, colour = MARKS[f.status]
        sys.stdout.write(f"{style(mark, colour, 'bold')} {f.check}: {f.summary}\n")
        if f.next_step and f.status in (FAIL, WARN):
            sys.stdout.write(f"       next step: {f.next_step}\n")
    sys.stdout.write(style(summary_line(findings), "bold") + "\n")
    return 1 if failed else 0
