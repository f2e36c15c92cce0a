"""Publish XDM's topology as Nomad dynamic node metadata (``node_meta = true``).

One thread: the keys from the inventory (``model/card.py``) against the
agent's metadata (``GET /v1/client/metadata``); only what differs is written
(``POST``, ``node:write``), keys under the prefix no longer wanted as null
(Nomad unsets them), keys outside it never. It looks ``SETTLE_S`` after an
inventory change and every ``refresh_period``, and writes at most every
``MIN_INTERVAL_S`` (Nomad batches node updates anyway: ``client/client.go``
``watchNodeUpdates``). A 403 is logged once and retried every
``FORBIDDEN_RETRY_S``. Nothing is published before the backend's first
answer, and level keys are not unset while no card carries topology, so a
restart while XDM is down unsets nothing.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from nomad_plugin.config.model import PluginConfig
from nomad_plugin.journal.datadir import write_state
from nomad_plugin.model.card import Inventory, meta_changes, node_meta
from nomad_plugin.reconcile.nomad_api import META_PATH, NomadApiError, NomadClient, parse_rules
from nomad_plugin.util.threads import Backoff

log = logging.getLogger(__name__)

SETTLE_S = 1.0
MIN_INTERVAL_S = 5.0
FORBIDDEN_RETRY_S = 300.0
STATE_FILE = "node-meta-state.json"
WRITE_POLICY = 'node { policy = "write" }'


def forbidden_hint(error: NomadApiError) -> str:
    need = "node:write" if "node:write" in str(error) else "node:read"
    return (
        f"the Nomad token lacks {need}, so the plugin cannot publish its topology as node metadata "
        f"({META_PATH}); the plugin keeps serving. Give the token a policy with {WRITE_POLICY}, or set "
        "node_meta = false and put the output of `nomad-device-lingjun node-meta` in the agent's client { meta { } }"
    )


@dataclass
class PublisherState:
    """What the publisher last did, for ``doctor``."""

    updated_at: float = 0.0
    wanted: dict[str, str] = field(default_factory=dict)
    in_sync: bool = False
    writes: int = 0
    last_error: str = ""
    hint: str = ""
    pid: int = field(default_factory=os.getpid)

    def to_json(self) -> dict[str, Any]:
        return {"version": 1, **asdict(self)}


def state_path(data_dir: str | os.PathLike[str]) -> Path:
    return Path(data_dir) / STATE_FILE


def load_publisher_state(path: Path) -> PublisherState | None:
    try:
        raw = json.loads(path.read_bytes())
        if not isinstance(raw, dict) or raw.get("version") != 1:
            return None
        kinds = {"updated_at": float, "in_sync": bool, "writes": int, "last_error": str, "hint": str, "pid": int}
        values = {name: kind(raw[name]) for name, kind in kinds.items()}
        return PublisherState(wanted={str(k): str(v) for k, v in dict(raw["wanted"]).items()}, **values)
    except (OSError, ValueError, KeyError, TypeError):
        return None


def node_write(client: NomadClient) -> tuple[bool, str]:
    """Whether the token may write node metadata, and why.

    The token's policies, directly and through its roles, must give the node rule ``policy =
    "write"`` and none ``"deny"`` (acl/acl.go ``AllowNodeWrite``: the strongest wins, deny above all).
    """
    token = client.token_self()
    if token is None:
        return True, "ACLs are disabled on this cluster"
    if token.get("Type") == "management":
        return True, "the token is a management token"
    names = [p for p in token.get("Policies") or [] if isinstance(p, str)]
    for role in token.get("Roles") or []:
        if isinstance(role, dict) and isinstance(role.get("ID"), str):
            names.extend(client.acl_role_policies(role["ID"]))
    levels: set[str] = set()
    for name in dict.fromkeys(names):
        levels |= node_policies(client.acl_policy_rules(name))
    if "deny" in levels:
        return False, 'a policy of the token denies the node rules (node { policy = "deny" })'
    if "write" in levels:
        return True, 'a policy of the token has node { policy = "write" }'
    return False, f"the token's node rules grant {', '.join(sorted(levels)) or 'none'}, not write"


def node_policies(rules: str) -> set[str]:
    """The ``node { policy = ... }`` values of one policy's rules (HCL or JSON)."""
    try:
        doc = parse_rules(rules)
    except Exception:  # unreadable rules grant nothing the check can vouch for
        return set()
    blocks = doc.get("node") if isinstance(doc, dict) else None
    if isinstance(blocks, dict):
        blocks = [blocks]
    return {str(block.get("policy", "")).strip('"') for block in blocks or [] if isinstance(block, dict)} - {""}


def ready(inventory: Inventory) -> bool:
    """Whether the backend has answered at least once."""
    return inventory.reachable or bool(inventory.cards)


class NodeMetaPublisher:
    def __init__(
        self,
        client: NomadClient,
        inventory: Callable[[], Inventory],
        config: PluginConfig,
        *,
        refresh_period: float,
        state_file: Path | None = None,
        settle: float = SETTLE_S,
        min_interval: float = MIN_INTERVAL_S,
        forbidden_retry: float = FORBIDDEN_RETRY_S,
        backoff: Backoff | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.client = client
        self.inventory = inventory
        self.config = config
        self.prefix = config.node_meta_prefix
        self.refresh_period = max(0.05, refresh_period)
        self.state_file = state_file
        self.settle = settle
        self.min_interval = min_interval
        self.forbidden_retry = forbidden_retry
        self.backoff = backoff or Backoff()
        self.clock = clock
        self.state = PublisherState()
        self.rounds = 0
        self._last_write = float("-inf")
        self._reported: set[str] = set()  # problems and 403s already logged
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="node-meta", daemon=True)
            self._thread.start()

    def stop(self, timeout: float | None = None) -> None:
        self._stop.set()
        self._wake.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout if timeout is not None else 10.0)
        self.client.close()

    def notify(self, _inventory: object = None) -> None:
        """An inventory listener: look soon."""
        self._wake.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.sync()
            except NomadApiError as exc:
                if self._stop.wait(self._failed(exc)):
                    return
                continue
            except Exception:  # a bug must not end the thread, nor reach Nomad's calls
                log.exception("node metadata: publishing failed")
                if self._stop.wait(self.backoff.next_delay()):
                    return
                continue
            if self._wake.wait(self.refresh_period):
                self._stop.wait(self.settle)  # let a burst of changes become one write

    def sync(self) -> bool:
        """One round; True when a write was made."""
        self._wake.clear()
        self.rounds += 1
        inventory = self.inventory()
        if not ready(inventory):
            return False
        wanted = node_meta(inventory, self.config)
        for problem in wanted.problems:
            if problem not in self._reported:
                self._reported.add(problem)
                log.warning("node metadata: %s", problem)
        current = self.client.node_meta()
        changes = meta_changes(wanted.keys, current.meta, self.prefix, topology_known=wanted.topology_known)
        if changes:
            wait = self._last_write + self.min_interval - self.clock()
            if wait > 0 and self._stop.wait(wait):
                return False
            self._last_write = self.clock()
            self.client.apply_node_meta(changes)
            self.state.writes += 1
            log.info("node metadata: %s", _describe_changes(changes))
        self._succeeded(dict(wanted.keys))
        return bool(changes)

    def _succeeded(self, wanted: dict[str, str]) -> None:
        self.backoff.reset()
        if self.state.last_error:
            log.info("node metadata: publishing again (%d keys under %r)", len(wanted), self.prefix)
        self._reported = {r for r in self._reported if not r.startswith("403:")}
        self.state.wanted, self.state.in_sync, self.state.last_error, self.state.hint = wanted, True, "", ""
        self._save()

    def _failed(self, exc: NomadApiError) -> float:
        """Log (a 403 once per message), record, and say how long to wait."""
        self.state.in_sync = False
        self.state.last_error = str(exc)
        if exc.kind == "forbidden":
            self.state.hint = forbidden_hint(exc)
            key = f"403:{exc}"
            if key not in self._reported:
                self._reported.add(key)
                log.error("node metadata: %s: %s", exc, self.state.hint)
            self._save()
            return self.forbidden_retry
        self.state.hint = ""
        delay = self.backoff.next_delay()
        log.warning("node metadata: %s; retrying in %.1fs", exc, delay)
        self._save()
        return delay

    def _save(self) -> None:
        if self.state_file is None:
            return
        self.state.updated_at = time.time()
        try:
            write_state(self.state_file, self.state.to_json())
        except OSError as exc:
            log.debug("node metadata: could not write %s: %s", self.state_file, exc)


def _describe_changes(changes: Mapping[str, str | None]) -> str:
    sets = ", ".join(f"{k}={v}" for k, v in changes.items() if v is not None)
    unsets = ", ".join(k for k, v in changes.items() if v is None)
    return "; ".join(part for part in (sets and f"set {sets}", unsets and f"unset {unsets}") if part)
