"""Chaos soak: the real plugin under the conformance host, against the simulator and a Nomad API double.

Run it as ``python -m tests.soak.soak --minutes N --seed S``. The soak plays
the Nomad scheduler and client: it hands out only device IDs that are healthy
in the latest fingerprint and held by no live allocation, records each
allocation in the Nomad API double (``pending`` -> ``running`` after a good
Reserve, ``failed`` after a refused one), ends allocations, and relaunches the
plugin after killing it, as the Nomad client does. Between steps it injects
XDM restarts and crashes, health flips, latency, Nomad API outages and
SIGKILLs, and after every step it checks the invariants listed in
``docs/reliability.md``. The summary is one JSON object on stdout (last line);
the exit status is 1 when any invariant was violated.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nomad_plugin.journal import EntryState, JournalEntry
from nomad_plugin.journal.store import FILE_NAME, JournalCorrupt, decode
from nomad_plugin.sim import Simulator
from tests.conformance.hostlib import REPO, Event, HostProcess, HostRun, built_host, real_plugin
from tests.doubles.nomad_api import NomadApiDouble

GRACE = 1.0
#: Time the plugin may take past the grace period to release an orphaned grant
#: (one reconciler round after the change, a backoff step, a Release retry).
RELEASE_SLACK = 20.0
RESERVE_TIMEOUT = 45.0
RSS_GROWTH_LIMIT_KIB = 60 * 1024
FD_GROWTH_LIMIT = 40


class SoakHost(HostProcess):
    """A conformance host in its own session, so one signal kills it and the plugin together."""

    def __init__(self, args: list[str], stderr_path: Path) -> None:
        self._stderr_file = stderr_path.open("a")
        env = dict(os.environ)
        env.pop("NOMAD_PLUGIN_MAGIC_COOKIE", None)
        self.proc = subprocess.Popen(
            [str(built_host()), "--stdin", *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr_file,
            text=True,
            env=env,
            cwd=REPO,
            start_new_session=True,
        )
        import queue

        self.events: list[Event] = []
        self._queue: queue.Queue[Event | None] = queue.Queue()
        self._stderr: list[str] = []
        threading.Thread(target=self._read_stdout, daemon=True).start()

    def drain(self) -> list[Event]:
        """Events that arrived since the last drain (non-blocking)."""
        import queue

        out: list[Event] = []
        while True:
            try:
                e = self._queue.get_nowait()
            except queue.Empty:
                return out
            if e is None:
                self._queue.put(None)  # keep the EOF marker for wait_for/finish
                return out
            self.events.append(e)
            out.append(e)

    def kill_group(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()

    def close(self) -> None:
        self._stderr_file.close()


@dataclass
class Alloc:
    id: str
    ids: tuple[str, ...]
    status: str = "pending"  # pending, running, complete, failed, removed
    grant_id: str = ""
    ended_at: float = 0.0

    @property
    def live(self) -> bool:
        return self.status in ("pending", "running")


@dataclass
class Plugin:
    """One relaunch of the plugin: its pid and resource samples."""

    pid: int
    started: float
    rss_base: int = 0
    fd_base: int = 0
    rss_max: int = 0
    fd_max: int = 0
    rss_last: int = 0
    last_sample: float = 0.0


@dataclass
class Stats:
    faults: Counter[str] = field(default_factory=Counter)
    checks: Counter[str] = field(default_factory=Counter)
    violations: list[dict[str, Any]] = field(default_factory=list)
    leaked: set[str] = field(default_factory=set)
    reserves: Counter[str] = field(default_factory=Counter)
    reserve_errors: Counter[str] = field(default_factory=Counter)
    plugins: list[Plugin] = field(default_factory=list)


class Soak:
    def __init__(
        self,
        minutes: float,
        seed: int,
        workdir: Path,
        *,
        warmup: float,
        verbose: bool,
        profile: str = "h800-8",
        kill_weight: float = 5,
    ) -> None:
        self.kill_weight = kill_weight
        self.deadline = time.monotonic() + minutes * 60
        self.minutes = minutes
        self.seed = seed
        self.rng = random.Random(seed)
        self.work = workdir
        self.warmup = warmup
        self.verbose = verbose
        self.stats = Stats()
        self.data_dir = workdir / "data"
        self.stderr_path = workdir / "host-stderr.log"
        self.sim = Simulator(workdir / "s", profile=profile, state_file=workdir / "xdm-state.json")
        self.api = NomadApiDouble()
        self.api._server.handle_error = lambda request, address: None  # type: ignore[method-assign]  # clients hanging up
        self.allocs: dict[str, Alloc] = {}
        self.host: SoakHost | None = None
        self.plugin: Plugin | None = None
        self.latest_fp: Event | None = None
        self.unhealthy: set[int] = set()
        self.n_alloc = 0
        now = time.monotonic()
        self.xdm_up_since = now
        self.api_up_since = now
        self.plugin_up_since = now
        self.orphan_since: dict[str, float] = {}
        self.steps = 0

    # -- plumbing -----------------------------------------------------------------
    def log(self, msg: str) -> None:
        if self.verbose:
            left = self.deadline - time.monotonic()
            print(f"[soak {left:7.1f}s left] {msg}", file=sys.stderr, flush=True)

    def violation(self, rule: str, detail: str) -> None:
        self.stats.violations.append({"rule": rule, "detail": detail, "step": self.steps})
        print(f"VIOLATION {rule}: {detail}", file=sys.stderr, flush=True)

    def host_args(self) -> list[str]:
        s = self.sim.socket_dir
        sets = {
            "backend": '"xdm"',
            "xdm_socket": json.dumps(str(s / "dp2mgr.sock")),
            "config_socket": json.dumps(str(s / "config-daemon.sock")),
            "data_dir": json.dumps(str(self.data_dir)),
            "nomad_address": json.dumps(self.api.address),
            "reconcile": "true",
            "release_grace_period": json.dumps(f"{GRACE:g}s"),
            "health_recovery_delay": '"1s"',
            "health_recovery_checks": "1",
            "default_mode": '"tdm"',
            "tdm_shares": "4",
            "nvml_enrich": "false",
            "card": json.dumps(
                [{"match": "0", "mode": "whole"}, {"match": "1", "mode": "whole"}, {"match": "2", "mode": "mig"}]
            ),
        }
        args = ["--plugin", str(real_plugin()), "--config", "plugin.hcl", "--phase", "run", "--duration", "0"]
        for key, value in sets.items():
            args += ["--set", f"{key}={value}"]
        return args

    def launch(self) -> None:
        """Start a host run (Nomad's launches 1 and 3) and wait for a fingerprint with devices."""
        self.host = SoakHost(self.host_args(), self.stderr_path)
        launch = self.host.wait_for(lambda e: e.get("event") == "launch" and e.get("launch") == 3, timeout=60)
        self.plugin = Plugin(pid=int(launch["pid"]), started=time.monotonic())
        self.stats.plugins.append(self.plugin)
        fp = self.host.wait_for(lambda e: e.get("event") == "fingerprint" and e.get("n_devices", 0) > 0, timeout=60)
        self.latest_fp = fp
        self.plugin_up_since = time.monotonic()
        self.log(f"plugin pid {self.plugin.pid} up")

    def end_host(self, killed: bool) -> None:
        """Collect the host's events; an intentional kill excuses the violations that follow it."""
        host, self.host = self.host, None
        if host is None:
            return
        if not killed:
            run = host.finish(timeout=30)
        else:
            host.kill_group()
            run = host.finish(timeout=5)
        host.close()
        self.scan_events(run, killed)

    def scan_events(self, run: HostRun, killed: bool) -> None:
        for e in run:
            if e.get("event") == "violation" and not e.get("_counted"):
                e["_counted"] = True
                if killed and e.get("rule", "").startswith(("fingerprint.stream", "stats.stream", "shutdown.")):
                    continue  # the plugin died on purpose
                self.violation("host." + str(e.get("rule")), json.dumps(e)[:300])

    def pump(self) -> None:
        """Read new host events: fingerprints, host violations, an unexpected host exit."""
        host = self.host
        if host is None:
            return
        for e in host.drain():
            kind = e.get("event")
            if kind == "fingerprint" and e.get("n_devices", 0) > 0:
                self.latest_fp = e
            elif kind == "violation":
                e["_counted"] = True
                self.violation("host." + str(e.get("rule")), json.dumps(e)[:300])
        if host.proc.poll() is not None:
            self.violation("host.exited", f"conformance host exited with {host.proc.returncode} while not stopped")
            self.end_host(killed=False)
            self.launch()

    # -- the scheduler's side ---------------------------------------------------------
    def free_choices(self) -> list[tuple[str, list[str]]]:
        """(group name, healthy IDs no live allocation holds) from the latest fingerprint."""
        held = {d for a in self.allocs.values() if a.live for d in a.ids}
        out = []
        for g in (self.latest_fp or {}).get("groups", []):
            free = [d["id"] for d in g["devices"] if d.get("healthy") and d["id"] not in held]
            if free:
                out.append((g["name"], free))
        return out

    def send_reserves(self, n: int) -> list[Alloc]:
        self.pump()  # place from the newest fingerprint, as the scheduler would
        assert self.host is not None
        sent: list[Alloc] = []
        for _ in range(n):
            choices = self.free_choices()
            if not choices:
                break
            _group, free = self.rng.choice(choices)
            count = min(len(free), self.rng.choice((1, 1, 1, 2, 2, 3)))
            ids = tuple(self.rng.sample(free, count))
            self.n_alloc += 1
            alloc = Alloc(id=f"alloc-{self.seed}-{self.n_alloc:05d}", ids=ids)
            self.allocs[alloc.id] = alloc
            self.api.add_alloc(alloc.id, ids, status="pending")
            self.host.send({"op": "reserve", "ids": list(ids), "expect": "any", "tag": alloc.id})
            sent.append(alloc)
        return sent

    def collect_reserves(self, sent: list[Alloc]) -> None:
        assert self.host is not None
        waiting = {a.id: a for a in sent}
        deadline = time.monotonic() + RESERVE_TIMEOUT
        while waiting:
            try:
                e = self.host.wait_for(
                    lambda ev: ev.get("event") == "reserve" and ev.get("tag") in waiting,
                    timeout=max(0.1, deadline - time.monotonic()),
                )
            except TimeoutError:
                self.violation("reserve.hung", f"no answer within {RESERVE_TIMEOUT}s for {sorted(waiting)}")
                for a in waiting.values():
                    self.finish_alloc(a, "failed")
                return
            except EOFError:  # the host died; pump() reports and relaunches
                for a in waiting.values():
                    self.finish_alloc(a, "failed")
                return
            alloc = waiting.pop(str(e["tag"]))
            if e.get("ok"):
                alloc.grant_id = str((e.get("envs") or {}).get("LINGJUN_GRANT_ID", ""))
                alloc.status = "running"
                self.api.set_status(alloc.id, "running")
                self.stats.reserves["ok"] += 1
                self.stats.reserves["ok:" + str((e.get("envs") or {}).get("LINGJUN_MODE", "?"))] += 1
                if not alloc.grant_id:
                    self.violation("reserve.no_grant_id", f"{alloc.id}: ok without LINGJUN_GRANT_ID")
            else:
                self.stats.reserves["error"] += 1
                self.stats.reserves["error:" + str(e.get("code", "?"))] += 1
                self.stats.reserve_errors[_shape(str(e.get("message", e.get("error", ""))))] += 1
                self.finish_alloc(alloc, "failed")

    def finish_alloc(self, alloc: Alloc, status: str) -> None:
        alloc.status = status
        alloc.ended_at = time.monotonic()
        if status == "removed":
            self.api.remove_alloc(alloc.id)
        else:
            self.api.set_status(alloc.id, status)

    # -- actions ------------------------------------------------------------------------
    def act_storm(self) -> None:
        sent = self.send_reserves(self.rng.randint(1, 5))
        self.stats.faults["reserve_storm"] += 1
        self.collect_reserves(sent)

    def act_end(self) -> None:
        running = [a for a in self.allocs.values() if a.status == "running"]
        for alloc in self.rng.sample(running, min(len(running), self.rng.randint(1, 3))):
            status = self.rng.choice(("complete", "complete", "failed", "removed"))
            self.finish_alloc(alloc, status)
            self.stats.faults["alloc_" + status] += 1

    def act_xdm_restart(self) -> None:
        self.stats.faults["xdm_restart"] += 1
        self.sim.restart(downtime=self.rng.uniform(0.1, 2.0))
        self.xdm_up_since = time.monotonic()

    def act_xdm_crash(self) -> None:
        self.stats.faults["xdm_crash"] += 1
        self.sim.crash()
        if self.rng.random() < 0.5:  # a Reserve storm while XDM is gone
            self.collect_reserves(self.send_reserves(self.rng.randint(1, 3)))
        else:
            time.sleep(self.rng.uniform(0.3, 3.0))
        self.sim.revive()
        self.xdm_up_since = time.monotonic()

    def act_health(self) -> None:
        self.stats.faults["health_flip"] += 1
        minor = self.rng.randrange(len(self.sim.cards))
        if minor in self.unhealthy:
            self.unhealthy.discard(minor)
            self.sim.set_health(minor, True)
        else:
            self.unhealthy.add(minor)
            self.sim.set_health(minor, False, "soak: XID 79")

    def act_latency(self) -> None:
        self.stats.faults["xdm_latency"] += 1
        rpc = self.rng.choice(("*", "Allocate", "Release", "ListGpuInfo"))
        self.sim.set_latency(rpc, self.rng.uniform(0.1, 2.0))
        try:
            self.collect_reserves(self.send_reserves(self.rng.randint(1, 3)))
            time.sleep(self.rng.uniform(0.2, 1.5))
        finally:
            self.sim.set_latency(rpc, 0)

    def act_nomad_down(self) -> None:
        self.stats.faults["nomad_api_down"] += 1
        self.api.set_down(True)
        time.sleep(self.rng.uniform(0.5, 3.0))
        self.api.set_down(False)
        self.api_up_since = time.monotonic()

    def act_kill(self) -> None:
        """SIGKILL the plugin (sometimes mid-Reserve) and relaunch it as Nomad would."""
        assert self.host is not None and self.plugin is not None
        mid_reserve = self.rng.random() < 0.5
        sent = self.send_reserves(self.rng.randint(1, 3)) if mid_reserve else []
        if sent:
            time.sleep(self.rng.uniform(0.0, 0.3))
        how = self.rng.choice(("plugin", "group"))
        self.stats.faults[f"sigkill_{how}" + ("_mid_reserve" if sent else "")] += 1
        if how == "plugin":
            try:
                os.kill(self.plugin.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            time.sleep(0.2)
        host = self.host
        self.end_host(killed=True)
        # Answers that made it out before the kill count: Nomad got them.
        answered = {str(e.get("tag")): e for e in host.events if e.get("event") == "reserve"}
        for alloc in sent:
            e = answered.get(alloc.id)
            if e is not None and e.get("ok"):
                # Nomad got the reservation before the plugin died: the task runs.
                alloc.grant_id = str((e.get("envs") or {}).get("LINGJUN_GRANT_ID", ""))
                alloc.status = "running"
                self.api.set_status(alloc.id, "running")
            else:
                self.finish_alloc(alloc, "failed")
        time.sleep(self.rng.uniform(0.0, 1.0))
        self.launch()

    ACTIONS = (
        ("act_storm", 30),
        ("act_end", 25),
        ("act_xdm_restart", 6),
        ("act_xdm_crash", 6),
        ("act_health", 8),
        ("act_latency", 6),
        ("act_nomad_down", 4),
        ("act_kill", 5),
    )

    # -- invariants -------------------------------------------------------------------------
    def journal_entries(self) -> dict[str, JournalEntry] | None:
        path = self.data_dir / FILE_NAME
        try:
            entries = decode(path.read_bytes())
        except FileNotFoundError:
            return {}
        except JournalCorrupt as exc:
            self.violation("journal.corrupt", str(exc))
            return None
        return {e.grant_id: e for e in entries}

    def check(self) -> None:
        now = time.monotonic()
        grants = self.sim.grants()
        # 1. No card oversubscribed at XDM.
        self.stats.checks["xdm_oversubscription"] += 1
        per_card: dict[int, list[Any]] = {}
        for rec in grants.values():
            for minor in rec.minors:
                per_card.setdefault(minor, []).append(rec)
        for card in self.sim.cards:
            recs = per_card.get(card.minor, [])
            whole = [r for r in recs if r.kind == "whole"]
            if whole and len(recs) > 1:
                self.violation("xdm.whole_shared", f"card {card.minor}: whole grant {whole[0].id} plus {len(recs) - 1}")
            if sum(r.core for r in recs) > 100:
                self.violation("xdm.core_over_100", f"card {card.minor}: {[r.core for r in recs]}")
            if sum(r.memory for r in recs) > card.memory_gib:
                self.violation("xdm.memory_over", f"card {card.minor}: {[r.memory for r in recs]}")
            if sum(r.slice for r in recs) > 7:
                self.violation("xdm.slices_over", f"card {card.minor}")
        # 2. No instance in two live grants; every live allocation holds its grant.
        self.stats.checks["live_alloc_has_grant"] += 1
        seen: dict[str, str] = {}
        live_by_grant: dict[str, Alloc] = {}
        for alloc in self.allocs.values():
            if alloc.status != "running":
                continue
            live_by_grant[alloc.grant_id] = alloc
            rec = grants.get(alloc.grant_id)
            if rec is None:
                self.violation(
                    "alloc.grant_missing", f"{alloc.id} runs with {alloc.ids} but grant {alloc.grant_id} is gone"
                )
            else:
                # The grant covers the cards the allocation's IDs live on.
                cards = {d.split("-share-")[0].split("-mig-")[0] for d in alloc.ids}
                granted = {slot.uuid for slot in rec.devices}
                if granted and not cards <= granted:
                    self.violation(
                        "alloc.grant_wrong_cards", f"{alloc.id}: IDs on {sorted(cards)}, grant on {sorted(granted)}"
                    )
            for d in alloc.ids:
                if d in seen:
                    self.violation("alloc.double_grant", f"{d} held by {seen[d]} and {alloc.id}")
                seen[d] = alloc.id
        journal = self.journal_entries()
        if journal is not None:
            # A grant whose release failed (XDM down) stays journalled as "releasing"
            # while Nomad hands its IDs on; only held grants must not share an ID.
            self.stats.checks["journal_no_double_grant"] += 1
            owner: dict[str, str] = {}
            for alloc in live_by_grant.values():
                entry = journal.get(alloc.grant_id)
                if entry is not None and set(entry.device_ids) != set(alloc.ids):
                    self.violation("journal.wrong_ids", f"{alloc.id}: journal {entry.device_ids} vs {alloc.ids}")
            for gid, entry in journal.items():
                if entry.state is EntryState.RELEASING:
                    continue
                for d in entry.device_ids:
                    if d in owner:
                        self.violation("journal.double_grant", f"{d} in {owner[d]} and {gid}")
                    owner[d] = gid
        # 3. No grant without a live allocation after grace + slack (counted from when
        #    the plugin, XDM and the Nomad API could all act).
        self.stats.checks["no_orphan_grant"] += 1
        able_since = max(self.xdm_up_since, self.api_up_since, self.plugin_up_since)
        for gid in grants:
            if gid in live_by_grant:
                self.orphan_since.pop(gid, None)
                continue
            since = max(self.orphan_since.setdefault(gid, now), able_since)
            if now - since > GRACE + RELEASE_SLACK and gid not in self.stats.leaked:
                self.stats.leaked.add(gid)
                self.violation("grant.leaked", f"grant {gid} has had no live allocation for {now - since:.1f}s")
        for gid in list(self.orphan_since):
            if gid not in grants:
                del self.orphan_since[gid]
        # 4. Memory and descriptors flat after warm-up.
        self.sample_resources(now)

    def sample_resources(self, now: float) -> None:
        p = self.plugin
        if p is None:
            return
        try:
            rss = _rss_kib(p.pid)
            fds = len(os.listdir(f"/proc/{p.pid}/fd"))
        except (FileNotFoundError, ProcessLookupError):
            return
        self.stats.checks["resources"] += 1
        if now - p.started < self.warmup:
            return
        if not p.rss_base:
            p.rss_base, p.fd_base = rss, fds
        p.rss_max, p.fd_max = max(p.rss_max, rss), max(p.fd_max, fds)
        p.rss_last, p.last_sample = rss, now
        if rss - p.rss_base > RSS_GROWTH_LIMIT_KIB:
            self.violation("plugin.rss_growth", f"pid {p.pid}: {p.rss_base} KiB -> {rss} KiB")
            p.rss_base = rss  # report each 60 MiB step once
        if fds - p.fd_base > FD_GROWTH_LIMIT:
            self.violation("plugin.fd_growth", f"pid {p.pid}: {p.fd_base} -> {fds} descriptors")
            p.fd_base = fds

    def settle_check(self) -> None:
        """With nothing in flight and everything up: the journal and XDM agree (within 15 s)."""
        self.stats.checks["journal_matches_xdm"] += 1
        deadline = time.monotonic() + 15
        while True:
            self.pump()
            journal = self.journal_entries()
            grants = set(self.sim.grants())
            if journal is not None:
                # An Allocate that timed out stays journalled (releasing) until XDM
                # can no longer commit it late; it may have no grant at XDM meanwhile.
                settling = {g for g, e in journal.items() if e.settle_until > time.time() and g not in grants}
                journal = {g: e for g, e in journal.items() if g not in settling}
            if journal is not None and set(journal) == grants:
                return
            if time.monotonic() > deadline:
                j = set(journal or {})
                self.violation(
                    "journal.mismatch",
                    f"journal-only {sorted(j - grants)[:5]}, xdm-only {sorted(grants - j)[:5]}",
                )
                return
            time.sleep(0.5)

    # -- main loop ------------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        self.sim.start()
        self.api.start()
        started = time.monotonic()
        try:
            self.launch()
            names = [a for a, _ in self.ACTIONS]
            weights = [self.kill_weight if a == "act_kill" else w for a, w in self.ACTIONS]
            while time.monotonic() < self.deadline:
                self.steps += 1
                action = self.rng.choices(names, weights)[0]
                self.log(f"step {self.steps}: {action}")
                getattr(self, action)()
                self.pump()
                self.check()
                if self.steps % 10 == 0:
                    self.settle_check()
                time.sleep(self.rng.uniform(0.05, 0.4))
            self.wind_down()
        finally:
            if self.host is not None:
                self.end_host(killed=False)
            self.api.stop()
            self.sim.stop()
        return self.summary(time.monotonic() - started)

    def wind_down(self) -> None:
        """End every allocation, heal XDM; after grace + slack no grant may remain."""
        for minor in list(self.unhealthy):
            self.sim.set_health(minor, True)
        self.unhealthy.clear()
        for alloc in self.allocs.values():
            if alloc.live:
                self.finish_alloc(alloc, "complete")
        deadline = time.monotonic() + GRACE + RELEASE_SLACK
        while self.sim.grants() and time.monotonic() < deadline:
            self.pump()
            time.sleep(0.5)
        self.pump()
        self.check()
        left = self.sim.grants()
        if left:
            self.stats.leaked.update(left)
            self.violation("grant.leaked_at_end", f"{len(left)} grant(s) left after every allocation ended")
        self.settle_check()

    def summary(self, elapsed: float) -> dict[str, Any]:
        s = self.stats
        errors = Counter()
        if self.stderr_path.exists():
            for line in self.stderr_path.read_text(errors="replace").splitlines():
                if "[ERROR]" in line and "nomad-device-lingjun" in line:
                    msg = line.split(": ", 1)[-1][:100]
                    errors[msg] += 1
        return {
            "seed": self.seed,
            "profile": self.sim.profile,
            "minutes_planned": self.minutes,
            "elapsed_seconds": round(elapsed, 1),
            "steps": self.steps,
            "faults": dict(sorted(s.faults.items())),
            "faults_total": sum(s.faults.values()),
            "invariant_checks": dict(sorted(s.checks.items())),
            "invariant_checks_total": sum(s.checks.values()),
            "reserves": dict(sorted(s.reserves.items())),
            "reserve_errors": dict(s.reserve_errors.most_common(8)),
            "allocations": len(self.allocs),
            "plugin_processes": len(s.plugins),
            "rss_kib_growth_max": max((p.rss_max - p.rss_base for p in s.plugins if p.rss_base), default=0),
            "fd_growth_max": max((p.fd_max - p.fd_base for p in s.plugins if p.fd_base), default=0),
            "longest_plugin": _longest(s.plugins),
            "violations": len(s.violations),
            "violation_rules": dict(Counter(v["rule"] for v in s.violations)),
            "violation_samples": s.violations[:10],
            "leaked_grants": len(s.leaked),
            "plugin_error_logs": dict(errors.most_common(8)),
        }


def _longest(plugins: list[Plugin]) -> dict[str, Any]:
    """Resource figures of the longest-lived plugin process (the flatness evidence)."""
    measured = [p for p in plugins if p.rss_base]
    if not measured:
        return {}
    p = max(measured, key=lambda q: q.last_sample - q.started)
    return {
        "pid": p.pid,
        "lived_seconds": round(p.last_sample - p.started, 1),
        "rss_kib_after_warmup": p.rss_base,
        "rss_kib_max": p.rss_max,
        "rss_kib_last": p.rss_last,
        "fds_after_warmup": p.fd_base,
        "fds_max": p.fd_max,
    }


def _shape(message: str) -> str:
    """An error message with IDs and numbers blanked, so equal causes count together."""
    import re

    text = re.sub(r"GPU-[0-9a-f-]+|[0-9a-f]{8}-[0-9a-f-]{27,}", "<id>", message)
    return re.sub(r"\d+(\.\d+)?", "N", text)[:110]


def _rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.soak.soak", description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=2.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--profile", default="h800-8", help="simulator profile (cards 0-1 whole, 2 mig where the model can, rest tdm)"
    )
    parser.add_argument("--warmup", type=float, default=None, help="seconds before RSS/fd baselines (default: scaled)")
    parser.add_argument(
        "--kill-weight", type=float, default=5, help="weight of SIGKILL+relaunch among ~90 (0 = one long-lived plugin)"
    )
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args(argv)
    warmup = args.warmup if args.warmup is not None else min(60.0, max(10.0, args.minutes * 6))
    work = Path(tempfile.mkdtemp(prefix="soak-", dir="/tmp"))
    soak = Soak(
        args.minutes,
        args.seed,
        work,
        warmup=warmup,
        verbose=args.verbose,
        profile=args.profile,
        kill_weight=args.kill_weight,
    )
    summary = soak.run()
    summary["workdir"] = str(work) if args.keep else ""
    _print_human(summary)
    print(json.dumps(summary, sort_keys=True), flush=True)
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 1 if summary["violations"] else 0


def _print_human(s: Mapping[str, Any]) -> None:
    print(f"soak: seed {s['seed']}, {s['elapsed_seconds']} s, {s['steps']} steps", file=sys.stderr)
    print(f"  faults injected ({s['faults_total']}): {s['faults']}", file=sys.stderr)
    print(f"  invariant checks ({s['invariant_checks_total']}): {s['invariant_checks']}", file=sys.stderr)
    print(
        f"  reserves: {s['reserves']}; allocations {s['allocations']}; plugin processes {s['plugin_processes']}",
        file=sys.stderr,
    )
    print(f"  growth after warm-up: RSS {s['rss_kib_growth_max']} KiB, fds {s['fd_growth_max']}", file=sys.stderr)
    print(f"  longest-lived plugin: {s['longest_plugin']}", file=sys.stderr)
    print(
        f"  violations: {s['violations']} {s['violation_rules']}; leaked grants: {s['leaked_grants']}", file=sys.stderr
    )


if __name__ == "__main__":
    sys.exit(main())
