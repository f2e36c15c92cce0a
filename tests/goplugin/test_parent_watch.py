"""The plugin stops when the process that launched it dies (goplugin/serve.py), in both watch modes.

A launcher process starts a watcher process and is SIGKILLed; the watcher,
a ParentWatch on its real parent, must report it. The end-to-end case (the
real plugin under a killed stand-in agent, its lock then free) is
tests/hardening/test_adversary.py::test_two_plugins_on_one_data_dir_and_an_agent_killed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from nomad_plugin.goplugin.serve import ParentWatch, launcher_pid
from tests.waiting import wait_until

REPO = Path(__file__).resolve().parents[2]

WATCHER = textwrap.dedent(
    """
    import os, sys, time
    from nomad_plugin.goplugin import serve as parent
    out = sys.argv[1]
    if sys.argv[2] == "poll":
        del os.pidfd_open  # a kernel without pidfds
    exits = []
    watch = parent.ParentWatch(
        lambda reason: open(out, "a").write("gone: " + reason + "\\n"),
        poll=0.1, hard_exit=0.5, exit_process=lambda code: (open(out, "a").write("hard exit\\n"), os._exit(code)),
    )
    watch.start()
    open(out, "a").write(f"watching {watch.pid} by {watch.mode}\\n")
    time.sleep(60)
    """
)
LAUNCHER = textwrap.dedent(
    """
    import subprocess, sys, time
    child = subprocess.Popen([sys.executable, "-c", sys.argv[1], sys.argv[2], sys.argv[3]])
    print(child.pid, flush=True)
    time.sleep(60)
    """
)


def _wait_for(path: Path, text: str, timeout: float = 30.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        content = path.read_text() if path.exists() else ""
        if text in content:
            return content
        time.sleep(0.05)
    raise AssertionError(f"{text!r} never appeared in {path}: {path.read_text() if path.exists() else ''}")


@pytest.mark.timeout(90)
@pytest.mark.parametrize("mode", ["pidfd", "poll"])
def test_the_watch_reports_a_killed_launcher_and_then_exits_anyway(tmp_path: Path, mode: str) -> None:
    out = tmp_path / "watch.log"
    env = dict(os.environ, PYTHONPATH=str(REPO))
    launcher = subprocess.Popen(
        [sys.executable, "-c", LAUNCHER, WATCHER, str(out), mode], stdout=subprocess.PIPE, text=True, env=env
    )
    assert launcher.stdout is not None
    watcher_pid = int(launcher.stdout.readline())
    content = _wait_for(out, "watching")
    assert f"watching {launcher.pid} by {mode}" in content, content
    launcher.send_signal(signal.SIGKILL)
    launcher.wait(timeout=10)
    content = _wait_for(out, "hard exit")  # the stop it asked for did not come: it exits by itself
    assert f"gone: the process that launched the plugin (pid {launcher.pid}" in content, content
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and Path(f"/proc/{watcher_pid}").exists():
        state = Path(f"/proc/{watcher_pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        if state == "Z":
            break
        time.sleep(0.05)
    else:
        assert not Path(f"/proc/{watcher_pid}").exists(), "the watcher is still running"


@pytest.mark.parametrize("mode", ["pidfd", "poll"])
def test_a_watch_reports_nothing_while_its_launcher_lives_and_fires_once_it_dies(
    mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The watched launcher is a child of this test, so the test can end it: the watch's thread then
    finishes (it would otherwise poll for the rest of the test session)."""
    if mode == "poll":
        monkeypatch.delattr(os, "pidfd_open")
    launcher = subprocess.Popen(["sleep", "120"])
    fired: list[str] = []
    try:
        watch = ParentWatch(
            fired.append,
            pid=launcher.pid,
            poll=0.05,
            hard_exit=0.05,
            exit_process=lambda code: fired.append(f"exit {code}"),
        )
        before = set(threading.enumerate())
        watch.start()
        (thread,) = {t for t in set(threading.enumerate()) - before if t.name == "parent-watch"}
        assert watch.mode == mode
        time.sleep(0.3)  # several polls: none may fire while the launcher lives
        assert fired == [] and not watch.gone()
    finally:
        launcher.kill()
        launcher.wait(timeout=10)
    wait_until(lambda: len(fired) == 2, "the watch to report the launcher's end, then to exit")
    assert fired[0].startswith(f"the process that launched the plugin (pid {launcher.pid}") and fired[1] == "exit 1"
    wait_until(lambda: not thread.is_alive(), "the watch's thread to end")


def test_the_launcher_of_an_interpreter_is_its_parent() -> None:
    """Only a frozen executable started by itself (a one-file bootloader) looks one process further up."""
    assert launcher_pid() == os.getppid()
    assert launcher_pid(os.getpid()) == os.getpid(), "an interpreter whose parent runs the same binary"
