"""The plugin under a real Nomad agent (`nomad agent -dev`), with the XDM simulator.

Runs only where a `nomad` binary (>= 1.9) is on PATH; skipped otherwise.
Everything goes through Nomad's documented CLI:

    nomad agent -dev -config agent.hcl -plugin-dir <dir>
    nomad node status -self -verbose / -json
    nomad job run -detach examples/jobs/raw-exec-env.nomad.hcl
    nomad job allocs -json raw-exec-env
    nomad alloc logs <alloc> print

The plugin_dir holds a wrapper script named nomad-device-lingjun that execs
the venv's console script (or dist/nomad-device-lingjun, the shipped
executable, when `make dist` has built it). The agent config carries plugin.hcl's block pointed at the
simulator's sockets, reconcile on against the dev agent itself, and a short
release grace period, so the test also sees the grant released after the
batch task completes. See docs/integration.md.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.e2e.agent_setup import GRACE_S, free_port, write_agent_files
from tests.integration.harness import Node, sim_node

REPO = Path(__file__).resolve().parents[2]
JOB_FILE = REPO / "examples" / "jobs" / "raw-exec-env.nomad.hcl"
JOB_NAME = "raw-exec-env"
TASK = "print"
MIN_VERSION = (1, 9)

pytestmark = [pytest.mark.nomad, pytest.mark.timeout(300)]


def _nomad_version(binary: str) -> tuple[int, int] | None:
    try:
        out = subprocess.run([binary, "version"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    match = re.search(r"Nomad v(\d+)\.(\d+)", out)
    return (int(match.group(1)), int(match.group(2))) if match else None


NOMAD = shutil.which("nomad")
if NOMAD is None:
    pytest.skip(
        "nomad binary not on PATH; install Nomad >= 1.9 to run the real-Nomad end-to-end test (docs/integration.md)",
        allow_module_level=True,
    )
VERSION = _nomad_version(NOMAD)
if VERSION is None or VERSION < MIN_VERSION:
    pytest.skip(f"nomad at {NOMAD} is version {VERSION}; this test needs Nomad >= 1.9", allow_module_level=True)


@dataclass
class Agent:
    node: Node
    address: str
    proc: subprocess.Popen[bytes]
    log: Path

    def cli(self, *args: str, timeout: float = 60, check: bool = True) -> str:
        env = {**os.environ, "NOMAD_ADDR": self.address}
        env.pop("NOMAD_TOKEN", None)
        done = subprocess.run([str(NOMAD), *args], capture_output=True, text=True, env=env, timeout=timeout)
        if check and done.returncode != 0:
            raise AssertionError(f"nomad {' '.join(args)} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
        return done.stdout

    def log_tail(self) -> str:
        return self.log.read_text(errors="replace")[-4000:] if self.log.exists() else ""


@pytest.fixture
def agent() -> Iterator[Agent]:
    with sim_node("h800-8") as node:
        http = free_port()
        config, plugin_dir = write_agent_files(node, http, free_port(), free_port())
        log = node.root / "agent.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [str(NOMAD), "agent", "-dev", "-config", str(config), "-plugin-dir", str(plugin_dir)],
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        running = Agent(node, f"http://127.0.0.1:{http}", proc, log)
        try:
            yield running
        finally:
            running.cli("job", "stop", "-purge", JOB_NAME, check=False, timeout=30)
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _wait(what: str, agent: Agent, probe, timeout: float):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    last: object = None
    while time.monotonic() < deadline:
        if agent.proc.poll() is not None:
            raise AssertionError(
                f"nomad agent exited ({agent.proc.returncode}) while waiting for {what}:\n{agent.log_tail()}"
            )
        try:
            last = probe()
        except (AssertionError, ValueError, subprocess.TimeoutExpired) as exc:
            last = exc
        else:
            if last:
                return last
        time.sleep(1)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}; last: {last!r}\n{agent.log_tail()}")


class GrantWatcher:
    """Every grant id the simulator held while the test ran (grants are short-lived here)."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self.seen: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            self.seen |= set(self.node.sim.grants())

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(2)


def test_nomad_schedules_a_task_on_a_simulated_card(agent: Agent) -> None:
    if not JOB_FILE.exists():
        pytest.fail(f"{JOB_FILE} is missing (it ships with the repository)")
    uuids = {c.uuid for c in agent.node.sim.cards}

    def devices_fingerprinted() -> dict[str, object] | None:
        node = json.loads(agent.cli("node", "status", "-self", "-json", timeout=20))
        for dev in (node.get("NodeResources") or {}).get("Devices") or []:
            if (dev["Vendor"], dev["Type"], dev["Name"]) == ("nvidia", "gpu", "NVIDIA H800"):
                return dev
        return None

    # Nomad batches the first device fingerprints for up to 50 s.
    group = _wait("the plugin's device group on the node", agent, devices_fingerprinted, timeout=120)
    instances = {i["ID"]: i for i in group["Instances"]}  # type: ignore[index]
    assert set(instances) == uuids
    assert all(i["Healthy"] for i in instances.values())
    verbose = agent.cli("node", "status", "-self", "-verbose")
    assert "nvidia/gpu/NVIDIA H800" in verbose, verbose

    watcher = GrantWatcher(agent.node)
    try:
        agent.cli("job", "run", "-detach", str(JOB_FILE))

        def finished_alloc() -> dict[str, object] | None:
            allocs = json.loads(agent.cli("job", "allocs", "-json", JOB_NAME, timeout=20))
            for alloc in allocs:
                if alloc["ClientStatus"] in ("complete", "failed", "lost"):
                    return alloc
            return None

        alloc = _wait("the batch allocation to finish", agent, finished_alloc, timeout=120)
        alloc_id = str(alloc["ID"])
        status = agent.cli("alloc", "status", alloc_id, check=False)
        assert alloc["ClientStatus"] == "complete", status + agent.log_tail()

        logs = agent.cli("alloc", "logs", alloc_id, TASK)
        env = dict(line.split("=", 1) for line in logs.splitlines() if "=" in line)
        grant_id = env.get("LINGJUN_GRANT_ID", "")
        assert re.fullmatch(r"[0-9a-f-]{36}", grant_id), logs
        assert env["LINGJUN_MODE"] == "whole"
        device_id = env["LINGJUN_DEVICE_IDS"]
        assert device_id in uuids
        assert env["NVIDIA_VISIBLE_DEVICES"] == device_id
        # The task's grant was a real XDM allocation on the simulator ...
        assert grant_id in watcher.seen or grant_id in agent.node.sim.grants()

        # ... and, the allocation being complete, the reconciler releases it.
        _wait(
            "the completed allocation's grant to be released",
            agent,
            lambda: grant_id not in agent.node.sim.grants(),
            timeout=GRACE_S + 30,
        )
    finally:
        watcher.stop()
