"""Python side of the Go conformance host: find it built (``make go-tools``), run it, read its events.

Reusable from tests, soak scripts and benchmarks::

    from tests.conformance.hostlib import built_host, run_host, start_host, real_plugin

    events = run_host(["--plugin", str(real_plugin()), "--phase", "all", "--duration", "2"])
    assert events.returncode == 0, events.rules

``run_host`` returns a ``HostRun``: the list of events (dicts) plus
``returncode``, ``stderr`` (the plugin's forwarded log lines and go-plugin's
own) and helpers. ``start_host`` keeps the host running for interactive use
(``--stdin`` commands) while its streams stay open.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import queue
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
FIXTURES = HERE / "fixtures"
FAKE_PLUGIN = FIXTURES / "fake_plugin.py"
FAKE_PLUGIN_HCL = FIXTURES / "fake_plugin.hcl"
PLUGIN_NAME = "nomad-device-lingjun"

Event = dict[str, Any]


class HostNotBuilt(RuntimeError):
    """The built host is missing or stale; the message names the make target that builds it."""


@functools.cache
def build_module() -> Any:
    """tests/conformance/build.py, loaded by path (scripts run it without the tests package)."""
    spec = importlib.util.spec_from_file_location("conformance_build", HERE / "build.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def build_host() -> Path:
    """Build (or reuse) tests/conformance/bin/conformance-host: for scripts, never under a test's timeout."""
    path: Path = build_module().build()
    return path


@functools.cache
def built_host() -> Path:
    """The host ``make go-tools`` built, current with its sources; ``HostNotBuilt`` says why not.
    Tests use this: a cold Go build takes minutes on a loaded box, far past a test's timeout."""
    why: str = build_module().problem()
    if why:
        raise HostNotBuilt(why)
    return host_binary()


def host_binary() -> Path:
    return HERE / "bin" / "conformance-host"


def real_plugin() -> Path:
    """The product executable installed in the running interpreter's venv."""
    candidate = Path(sys.executable).parent / PLUGIN_NAME
    if candidate.exists():
        return candidate
    found = shutil.which(PLUGIN_NAME)
    if found is None:
        raise FileNotFoundError(f"{PLUGIN_NAME} is neither next to {sys.executable} nor on PATH (pip install -e .)")
    return Path(found)


def fake_plugin_args(mode: str = "good") -> tuple[list[str], dict[str, str]]:
    """Host arguments and environment that load the fixture plugin in `mode`."""
    args = ["--plugin", sys.executable, "--plugin-arg", str(FAKE_PLUGIN)]
    return args, {"FAKE_PLUGIN_MODE": mode}


class HostRun(list[Event]):
    """Events of one finished host run, in order."""

    def __init__(self, events: Iterable[Event], returncode: int, stderr: str) -> None:
        super().__init__(events)
        self.returncode = returncode
        self.stderr = stderr

    def of(self, kind: str) -> list[Event]:
        return [e for e in self if e.get("event") == kind]

    @property
    def violations(self) -> list[Event]:
        return self.of("violation")

    @property
    def rules(self) -> set[str]:
        return {str(e["rule"]) for e in self.violations}

    @property
    def summary(self) -> Event:
        found = self.of("summary")
        if not found:
            raise AssertionError(f"host printed no summary (rc={self.returncode}); stderr tail:\n{self.stderr[-3000:]}")
        return found[-1]

    def describe(self) -> str:
        """Short text for assertion messages."""
        lines = [f"rc={self.returncode} rules={sorted(self.rules)}"]
        lines += [json.dumps(e)[:400] for e in self.violations]
        lines.append("stderr tail:\n" + self.stderr[-2000:])
        return "\n".join(lines)


def _env(extra: Mapping[str, str] | None) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("NOMAD_PLUGIN_MAGIC_COOKIE", None)
    if extra:
        env.update(extra)
    return env


def _parse(stdout: str) -> list[Event]:
    events = []
    for line in stdout.splitlines():
        line = line.strip()
        if line:
            events.append(json.loads(line))
    return events


def run_host(
    args: list[str],
    *,
    env: Mapping[str, str] | None = None,
    timeout: float = 60,
    binary: Path | None = None,
    cwd: Path | None = None,
) -> HostRun:
    """Run the host to completion and return its events."""
    proc = subprocess.run(
        [str(binary or host_binary()), *args],
        capture_output=True,
        text=True,
        env=_env(env),
        timeout=timeout,
        stdin=subprocess.DEVNULL,
        cwd=cwd or REPO,
    )
    return HostRun(_parse(proc.stdout), proc.returncode, proc.stderr)


class HostProcess:
    """A running host (started with --stdin) driven by JSON-line commands."""

    def __init__(self, args: list[str], env: Mapping[str, str] | None, binary: Path | None, cwd: Path | None) -> None:
        self.proc = subprocess.Popen(
            [str(binary or host_binary()), "--stdin", *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=_env(env),
            cwd=cwd or REPO,
        )
        self.events: list[Event] = []
        self._queue: queue.Queue[Event | None] = queue.Queue()
        self._stderr: list[str] = []
        threading.Thread(target=self._read_stdout, daemon=True).start()
        threading.Thread(target=self._read_stderr, daemon=True).start()

    def _read_stdout(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.strip():
                self._queue.put(json.loads(line))
        self._queue.put(None)

    def _read_stderr(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self._stderr.append(line)

    def stderr_text(self) -> str:
        """What the host wrote to stderr so far (the plugin's forwarded log lines)."""
        return "".join(list(self._stderr))

    def send(self, command: Mapping[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(command) + "\n")
        self.proc.stdin.flush()

    def wait_for(self, predicate: Callable[[Event], bool], timeout: float = 30) -> Event:
        """Return the first not-yet-consumed event matching predicate."""
        for e in self.events:
            if predicate(e) and not e.get("_seen"):
                e["_seen"] = True
                return e
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no matching event within {timeout} s; last events: {self.events[-5:]}")
            try:
                e = self._queue.get(timeout=left)
            except queue.Empty:
                continue
            if e is None:
                raise EOFError(f"host exited before a matching event; stderr tail:\n{''.join(self._stderr)[-2000:]}")
            self.events.append(e)
            if predicate(e):
                e["_seen"] = True
                return e

    def finish(self, timeout: float = 30) -> HostRun:
        """Send stop (if still running), wait, return every event."""
        if self.proc.poll() is None:
            try:
                self.send({"op": "stop"})
            except (BrokenPipeError, OSError):
                pass
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        while True:
            try:
                e = self._queue.get(timeout=5)
            except queue.Empty:
                break
            if e is None:
                break
            self.events.append(e)
        return HostRun(self.events, self.proc.returncode, "".join(self._stderr))


def start_host(
    args: list[str],
    *,
    env: Mapping[str, str] | None = None,
    binary: Path | None = None,
    cwd: Path | None = None,
) -> HostProcess:
    """Start the host with --stdin; drive it with send()/wait_for(), end with finish()."""
    return HostProcess(args, env, binary, cwd)
