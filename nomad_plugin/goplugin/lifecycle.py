"""How the plugin process ends: one stop for every stream, and a watch on the agent that launched it.

Fingerprint, Stats, StreamStdio and StartStream each hold a worker thread until their call ends; a
stop (Shutdown, SIGTERM, the launcher's death) sets every stream's event at once, so that the server
stops within the 2 s go-plugin allows (go-plugin ``client.go`` ``Kill``).

go-plugin gives a plugin no sign when its host dies by SIGKILL. A plugin left running would keep
``plugin.lock`` and its grants from the relaunched agent's plugin, so it watches its launcher: a
pidfd, readable once the process has exited, or where pidfds are missing a poll of the parent pid
(a dead parent's children are re-parented) and of the launcher's start time. Not
``PR_SET_PDEATHSIG``: the kernel sends it when the *thread* that forked the plugin exits, and a Go
program such as Nomad ends threads while it lives on (golang/go#27505).
"""

from __future__ import annotations

import logging
import os
import select
import sys
import threading
import time
from collections.abc import Callable

import grpc

log = logging.getLogger(__name__)

POLL_S = 1.0
HARD_EXIT_S = 5.0


class Lifecycle:
    def __init__(self) -> None:
        self.stopping = threading.Event()
        self.stop_reason = ""
        self._streams: set[threading.Event] = set()
        self._lock = threading.Lock()

    def open_stream(self, context: grpc.ServicerContext) -> threading.Event:
        """An event set when this call ends or the process stops.

        A ``CancelEvent``: an engine waiting on something else (the fingerprint engine waits for a
        new fingerprint) registers a callback on it instead of polling it.
        """
        from nomad_plugin.util.threads import CancelEvent  # after the handshake: random is not on the launch path

        cancel = CancelEvent()
        if not context.add_callback(cancel.set):
            cancel.set()  # the call already ended
        with self._lock:
            if self.stopping.is_set():
                cancel.set()
            self._streams.add(cancel)
        return cancel

    def close_stream(self, cancel: threading.Event) -> None:
        with self._lock:
            self._streams.discard(cancel)

    def open_count(self) -> int:
        with self._lock:
            return len(self._streams)

    def request_stop(self, reason: str) -> None:
        """Idempotent: the first reason wins; every open stream is released."""
        with self._lock:
            if not self.stopping.is_set():
                self.stop_reason = reason
                self.stopping.set()
            streams = list(self._streams)
        for cancel in streams:
            cancel.set()


def _stat_fields(pid: int) -> list[str] | None:
    """``/proc/<pid>/stat`` after the command name: [state, ppid, ...] (None when gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read().decode("ascii", "replace")
    except OSError:
        return None
    return data[data.rfind(")") + 2 :].split()


def _identity(pid: int) -> str | None:
    """The process's start time (clock ticks since boot), telling it apart from a later one with its pid."""
    fields = _stat_fields(pid)
    if fields is None or len(fields) < 20 or fields[0] in ("Z", "X"):
        return None
    return fields[19]


def launcher_pid(parent: int | None = None) -> int:
    """The parent, or the parent of a PyInstaller one-file bootloader (a frozen parent running this
    same executable). The shipped file ``exec``s its bundle (tools/build_dist.py): its parent is the agent."""
    parent = os.getppid() if parent is None else parent
    if not getattr(sys, "frozen", False):
        return parent
    try:
        if os.path.samefile(f"/proc/{parent}/exe", "/proc/self/exe"):
            fields = _stat_fields(parent)
            if fields is not None and len(fields) > 1 and fields[1].isdigit():
                return int(fields[1])
    except OSError:
        pass
    return parent


class ParentWatch:
    """Calls ``on_gone(reason)`` once, from its own thread, when the launcher has died; then exits the
    process if it still runs ``hard_exit`` seconds later."""

    def __init__(
        self,
        on_gone: Callable[[str], None],
        *,
        pid: int | None = None,
        poll: float = POLL_S,
        hard_exit: float = HARD_EXIT_S,
        exit_process: Callable[[int], None] = os._exit,
    ) -> None:
        self._on_gone = on_gone
        self._parent = os.getppid()
        self.pid = launcher_pid(self._parent) if pid is None else pid
        self._identity = _identity(self.pid)
        self._poll = poll
        self._hard_exit = hard_exit
        self._exit = exit_process
        self.mode = ""  # "pidfd" or "poll", once started

    def start(self) -> None:
        try:
            pidfd = os.pidfd_open(self.pid)
            self.mode = "pidfd"
        except (AttributeError, OSError):
            pidfd = -1
            self.mode = "poll"
        threading.Thread(target=self._run, args=(pidfd,), name="parent-watch", daemon=True).start()

    def gone(self) -> bool:
        """The launcher has exited (checked now, without waiting)."""
        if self.pid == self._parent and os.getppid() != self._parent:
            return True  # re-parented: the parent died
        return self._identity is None or _identity(self.pid) != self._identity

    def _run(self, pidfd: int) -> None:
        if pidfd >= 0:
            select.select([pidfd], [], [])
            os.close(pidfd)
        else:
            while not self.gone():
                time.sleep(self._poll)
        reason = f"the process that launched the plugin (pid {self.pid}, the Nomad agent) exited"
        log.warning("%s; stopping", reason)
        self._on_gone(reason)
        time.sleep(self._hard_exit)  # the stop ends the process well before this, unless something holds it up
        log.error("still running %.0fs after the launcher exited; exiting now", self._hard_exit)
        self._exit(1)
