"""``nomad-device-lingjun grants``: every grant the plugin holds, and why; ``grants release`` by hand.

The journal is joined with Nomad's allocations on this node and the running reconciler's state
(``reconciler-state.json``); XDM has no RPC that lists grants. A release is refused while a live
allocation may hold the grant (``--force`` overrides) and is journalled like any other: by the
running plugin (a request file it answers) or, with none running, here under the owner lock.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Mapping
from contextlib import closing
from dataclasses import dataclass, field
from typing import Any

from nomad_plugin.backend_select import select_backend
from nomad_plugin.cli.common import add_config_options, command_parser, fail, plugin_config
from nomad_plugin.config.model import ConfigError, PluginConfig
from nomad_plugin.journal import EntryState, Journal, JournalCorrupt, JournalEntry, OwnerLock, plugin_running
from nomad_plugin.launcher.config import LauncherConfigError
from nomad_plugin.model.errors import PluginError
from nomad_plugin.model.instances import Catalog
from nomad_plugin.nomad.reserve import Reserver, describe_limits
from nomad_plugin.nomad_view.types import table
from nomad_plugin.reconcile.nomad_api import (
    RECOMMENDED_POLICY,
    AllocView,
    NomadApiError,
    NomadApiSettings,
    NomadClient,
    Visibility,
    check_visibility,
)
from nomad_plugin.reconcile.reconciler import Claim, ReconcilerState, reconciler_state_path
from nomad_plugin.reconcile.requests import MANUAL_REASON, check_grant_id, submit_release, wait_result, withdraw

LIVE, ORPHANED, PENDING, UNVERIFIABLE, LEAKED = "live", "orphaned", "pending release", "unverifiable", "leaked"


class GrantsError(Exception):
    """A problem the operator must fix (bad config, unreadable journal); exit status 2."""


@dataclass
class NomadView:
    allocs: list[AllocView] = field(default_factory=list)
    visibility: Visibility | None = None
    error: str = ""  # why Nomad's view is missing

    @property
    def complete(self) -> bool:
        return not self.error and self.visibility is not None and self.visibility.complete

    def live_holder(self, entry: JournalEntry) -> AllocView | None:
        ids = set(entry.device_ids)
        return next((a for a in self.allocs if a.live and a.device_ids & ids), None)


def read_journal(config: PluginConfig) -> list[JournalEntry]:
    try:
        return Journal.snapshot(config.data_dir)
    except JournalCorrupt as exc:
        raise GrantsError(f"grant journal in {config.data_dir} cannot be read: {exc}") from None
    except PermissionError as exc:
        raise GrantsError(f"{exc.filename}: {exc.strerror}: run as the Nomad client's user (root)") from None


def nomad_view(config: PluginConfig, environ: Mapping[str, str] | None = None) -> NomadView:
    if not config.reconcile:
        return NomadView(error="reconcile = false: the plugin does not consult Nomad")
    with closing(NomadClient(NomadApiSettings.from_config(config, environ))) as client:
        try:
            page = client.node_allocations(config.nomad_node_id or client.node_id())
            visibility = check_visibility(client)
        except NomadApiError as exc:
            said = str(exc)  # most errors name the request ("Nomad API /v1/...") already
            return NomadView(error=said if said.startswith("Nomad API") else f"Nomad API: {said}")
    return NomadView(allocs=list(page.allocs), visibility=visibility)


def grant_rows(
    entries: list[JournalEntry], view: NomadView, state: ReconcilerState | None, running: bool, now: float
) -> list[dict[str, Any]]:
    rows = []
    by_id = {a.id: a for a in view.allocs}
    for entry in sorted(entries, key=lambda e: e.created_at):
        holder = view.live_holder(entry)
        claim: Claim | None = state.claims.get(entry.grant_id) if state else None
        alloc = holder or (by_id.get(claim.alloc_id) if claim else None)
        row: dict[str, Any] = {
            "grant_id": entry.grant_id,
            "journal_state": entry.state.value,
            "device_ids": list(entry.device_ids),
            "cards": list(entry.cards),
            "mode": entry.kind,
            "limits": describe_limits(entry.kind, entry.asks),
            "created_at": entry.created_at,
            "alloc_id": alloc.id if alloc else (claim.alloc_id if claim else ""),
            "job": alloc.job if alloc else (claim.job if claim else ""),
            "namespace": alloc.namespace if alloc else (claim.namespace if claim else ""),
            "client_status": alloc.client_status if alloc else ("garbage-collected" if claim and view.allocs else ""),
            "since": alloc.modify_time if alloc else None,
            "release_in_s": None,
        }
        if entry.state is EntryState.RELEASING:
            row["status"], row["why"] = PENDING, "a release is in progress or failed and is retried"
        elif entry.state is EntryState.INTENT:
            row["status"], row["why"] = PENDING, "left mid-Reserve; the plugin releases it at start"
        elif holder is not None:
            row["status"], row["why"] = LIVE, f"held by {holder.client_status} allocation {holder.id}"
        elif view.error:
            row["status"], row["why"] = UNVERIFIABLE, view.error
        elif claim is not None or view.complete:
            row["status"] = ORPHANED
            release_at = state.release_at.get(entry.grant_id) if state and running else None
            if release_at is not None:
                row["release_in_s"] = round(max(0.0, release_at - now), 1)
                row["why"] = "the plugin releases it when the grace period ends"
            else:
                row["why"] = "released by the plugin after its grace period once it runs and sees this"
        else:
            row["status"] = UNVERIFIABLE
            reason = view.visibility.reason if view.visibility else "view unknown"
            row["why"] = f"no visible allocation claims it and the view is incomplete ({reason})"
        rows.append(row)
    return rows


def leaked_rows(state: ReconcilerState | None, running: bool) -> list[dict[str, Any]]:
    if state is None or not running:
        return []
    by_id = {a.id: a for a in state.allocs}
    out = []
    for alloc_id in state.leaked:
        alloc = by_id.get(alloc_id)
        out.append(
            {
                "status": LEAKED,
                "alloc_id": alloc_id,
                "job": alloc.job if alloc else "",
                "namespace": alloc.namespace if alloc else "",
                "client_status": alloc.client_status if alloc else "",
                "device_ids": sorted(alloc.device_ids) if alloc else [],
                "why": "a live allocation uses this plugin's devices but the journal has no grant for them",
            }
        )
    return out


def report(config: PluginConfig, environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    entries = read_journal(config)
    running = plugin_running(config.data_dir)
    state = ReconcilerState.load(reconciler_state_path(config.data_dir))
    view = nomad_view(config, environ)
    now = time.time()
    return {
        "data_dir": config.data_dir,
        "plugin_running": running,
        "nomad": {
            "error": view.error,
            "view_complete": view.complete,
            "view_reason": view.visibility.reason if view.visibility else view.error,
            "policy_to_add": "" if view.complete or view.error else " ".join(RECOMMENDED_POLICY.split()),
        },
        "xdm": "XDM has no RPC that lists grants: its view cannot be joined",
        "grants": grant_rows(entries, view, state, running, now),
        "leaked": leaked_rows(state, running),
    }


def print_report(doc: dict[str, Any]) -> None:
    out = sys.stdout
    out.write(f"plugin: {'running' if doc['plugin_running'] else 'not running'} (data_dir {doc['data_dir']})\n")
    nomad = doc["nomad"]
    if nomad["error"]:
        out.write(f"nomad: no view ({nomad['error']})\n")
    elif nomad["view_complete"]:
        out.write(f"nomad: complete view ({nomad['view_reason']})\n")
    else:
        out.write(
            f"nomad: INCOMPLETE view ({nomad['view_reason']})\n       add to the token: {nomad['policy_to_add']}\n"
        )
    rows = doc["grants"] + doc["leaked"]
    if not rows:
        out.write("no grants\n")
        return
    table_rows = [["GRANT", "STATUS", "ALLOC", "NAMESPACE/JOB", "CLIENT", "SINCE", "MODE", "DEVICES", "NOTE"]]
    for r in rows:
        note = f"released in {r['release_in_s']:.0f}s" if r.get("release_in_s") is not None else r["why"]
        table_rows.append(
            [
                r.get("grant_id", "-"),
                r["status"],
                r.get("alloc_id", "")[:8],
                f"{r['namespace']}/{r['job']}" if r.get("job") else "",
                r.get("client_status", ""),
                time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(r["since"])) if r.get("since") else "",
                r.get("mode", ""),
                str(len(r["device_ids"])),
                note,
            ]
        )
    out.write("".join(line + "\n" for line in table(table_rows)))


def release(
    config: PluginConfig, grant_id: str, force: bool, timeout: float, environ: Mapping[str, str] | None = None
) -> tuple[bool, str]:
    """Release one grant by hand; (ok, message)."""
    check_grant_id(grant_id)
    entry = next((e for e in read_journal(config) if e.grant_id == grant_id), None)
    if entry is None:
        return False, f"no grant {grant_id} in the journal in {config.data_dir}"
    if not force:
        view = nomad_view(config, environ)
        holder = view.live_holder(entry)
        if holder is not None:
            return False, (
                f"refused: allocation {holder.id} of job {holder.namespace}/{holder.job} is {holder.client_status} "
                "and holds this grant's devices (use --force to release anyway)"
            )
        if view.error:
            return False, f"refused: cannot check Nomad ({view.error}); use --force once you know the job has ended"
        if not view.complete:
            reason = view.visibility.reason if view.visibility else "unknown"
            return False, (
                f"refused: the token cannot see every namespace ({reason}), so an allocation holding these devices "
                "cannot be ruled out; check with `nomad alloc status`, then use --force"
            )
    if plugin_running(config.data_dir):
        submit_release(config.data_dir, grant_id, force)
        result = wait_result(config.data_dir, grant_id, timeout)
        if result is None:
            withdraw(config.data_dir, grant_id)
            return False, f"the running plugin did not answer within {timeout:.0f}s; nothing was released"
        return result.ok, result.message
    return _release_here(config, grant_id, force)


def _release_here(config: PluginConfig, grant_id: str, force: bool) -> tuple[bool, str]:
    """No plugin runs: release under the owner lock, so none writes the journal meanwhile."""
    with OwnerLock(config.data_dir) as lock:
        if not lock.acquire(timeout=5.0):
            return False, "a plugin started meanwhile; run the command again"
        journal = Journal(config.data_dir)
        backend = select_backend(config)
        try:
            reserver = Reserver(backend, Catalog, journal, config)
            reason = MANUAL_REASON + (" (--force)" if force else "")
            if reserver.release_grant(grant_id, reason):
                return True, f"grant {grant_id} released ({reason})"
            return False, (
                f"XDM did not confirm the release of grant {grant_id}; it is journalled as releasing and the plugin "
                "retries it when it runs"
            )
        finally:
            backend.stop()  # safe on a backend that was never started: it closes the client


def main(argv: list[str], environ: Mapping[str, str] | None = None) -> int:
    args = list(argv)
    releasing = bool(args) and args[0] == "release"
    if releasing:
        p = command_parser(
            "grants release",
            "Release one grant by hand (journalled like any release); refused while a live allocation may hold it.",
        )
        args = args[1:]
        p.add_argument("grant_id", help="the grant id (LINGJUN_GRANT_ID of the task)")
        p.add_argument("--force", action="store_true", help="release even if a live allocation may hold it")
        p.add_argument("--timeout", type=float, default=30.0, help="seconds to wait for a running plugin's answer")
    else:
        p = command_parser(
            "grants",
            "List every grant the plugin holds, joined with Nomad's view: live, orphaned, pending release, "
            "unverifiable, leaked.",
            epilog="Release one by hand: nomad-device-lingjun grants release <grant-id> [--force]",
        )
        p.add_argument("--json", action="store_true", help="print one JSON document")
    add_config_options(p)
    opts = p.parse_args(args)
    try:
        config = plugin_config(opts.plugin_config, opts.set, validate=True)
    except (LauncherConfigError, ConfigError, PluginError) as exc:
        return fail("grants", f"{opts.plugin_config or '(defaults)'}: {exc}")
    try:
        if releasing:
            ok, message = release(config, opts.grant_id, opts.force, opts.timeout, environ)
            (sys.stdout if ok else sys.stderr).write(message + "\n")
            return 0 if ok else 1
        doc = report(config, environ)
    except (GrantsError, ValueError) as exc:
        return fail("grants", str(exc))
    except OSError as exc:
        where = f"{exc.filename or 'the data_dir'}: {exc.strerror or exc}"
        return fail("grants", f"{where} (data_dir must be the plugin's directory; run as root)")
    if opts.json:
        sys.stdout.write(json.dumps(doc, indent=2) + "\n")
    else:
        print_report(doc)
    return 0
