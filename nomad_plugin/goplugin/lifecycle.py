"""One stop signal for the process and a cancel Event per open stream.

Fingerprint, Stats, StreamStdio and StartStream are long-lived: each holds a
worker thread until its call is cancelled. Shutdown (RPC or SIGTERM) must end
them all at once so the server can stop within go-plugin's 2 s budget; every
stream therefore registers an Event that fires on either the call's
cancellation or the process stop.
"""

from __future__ import annotations

import logging
import os
import select
import sys
import threading
from collections.abc import Callable

import grpc

log = logging.getLogger(__name__)


class Lifecycle:
    def __init__(self) -> None:
        self.stopping = threading.Event()
        self.stop_reason = ""
        self._streams: set[threading.Event] = set()
        self._lock = threading.Lock()

    def open_stream(self, context: grpc.ServicerContext) -> threading.Event:
        """An Event set when this call is cancelled/ends or the process stops.

        A ``CancelEvent``: an engine waiting for something else (the fingerprint
        engine waits for a new fingerprint) is woken by its callback instead of
        polling the event (issue 14).
        """
        from nomad_plugin.util.threads import CancelEvent  # after the handshake: not on the launch path

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


# End the plugin when the process that launched it (the Nomad agent) dies.
#
# go-plugin gives a plugin no sign when its host dies by SIGKILL: no Shutdown
# call, no signal. A plugin left running holds ``plugin.lock`` and its grants,
# and a relaunched agent's new plugin would find the lock held. So the plugin
# watches its launcher and stops (as on SIGTERM) when it is gone; if the stop
# does not end the process within ``HARD_EXIT_S``, it exits anyway.
#
# How it watches: a pidfd of the launcher (``pidfd_open``, Linux 5.3+), which
# becomes readable when the process exits, waited on by one thread that
# otherwise sleeps; where pidfds are missing, a poll every ``POLL_S`` of the
# parent pid (a dead parent's children are re-parented) or of the launcher's
# ``/proc`` start time. ``PR_SET_PDEATHSIG`` is not used: the kernel sends it
# when the *thread* that forked the plugin exits, and a Go program such as
# Nomad may end one of its threads while it lives on (golang/go#27505), which
# would stop a healthy plugin; nor does it see past an intermediate parent.
#
# The launcher is the parent, unless the plugin is a frozen executable whose
# parent is the same executable (a PyInstaller one-file bootloader, which
# forks the interpreter and waits for it): then the bootloader's parent. The shipped executable (a POSIX ``sh``
# header that ``exec``s the unpacked bundle, ``tools/build_dist.py``) runs the
# interpreter in the process Nomad started, so there the parent is the agent.
#

POLL_S = 1.0
HARD_EXIT_S = 5.0


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
    """The process that launched the plugin: the parent, or its parent behind a one-file bootloader."""
    parent = os.getppid() if parent is None else parent
    if not getattr(sys, "frozen", False):
        return parent  # an interpreter that started another one (a test harness, a launcher) is the launcher
    try:
        if os.path.samefile(f"/proc/{parent}/exe", "/proc/self/exe"):
            fields = _stat_fields(parent)
            if fields is not None and len(fields) > 1 and fields[1].isdigit():
                return int(fields[1])
    except OSError:
        pass
    return parent


class ParentWatch:
    """Calls ``on_gone(reason)`` once, from its own thread, when the launcher has died."""

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
        self._stop = threading.Event()
        self._wake_r, self._wake_w = os.pipe()
        self._thread: threading.Thread | None = None
        self.mode = ""  # "pidfd" or "poll", once started

    def start(self) -> None:
        pidfd = -1
        try:
            pidfd = os.pidfd_open(self.pid)
            self.mode = "pidfd"
        except (AttributeError, OSError):
            self.mode = "poll"
        self._thread = threading.Thread(target=self._run, args=(pidfd,), name="parent-watch", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop watching (the plugin is stopping for another reason)."""
        self._stop.set()
        try:
            os.write(self._wake_w, b"x")
        except OSError:
            pass

    def gone(self) -> bool:
        """The launcher has exited (checked now, without waiting)."""
        if self.pid == self._parent and os.getppid() != self._parent:
            return True  # re-parented: the parent died
        return self._identity is None or _identity(self.pid) != self._identity

    def _run(self, pidfd: int) -> None:
        try:
            if pidfd >= 0:
                readable, _, _ = select.select([pidfd, self._wake_r], [], [])
                dead = pidfd in readable
            else:
                dead = False
                while not self._stop.wait(self._poll):
                    if self.gone():
                        dead = True
                        break
        finally:
            if pidfd >= 0:
                os.close(pidfd)
        if not dead or self._stop.is_set():
            return
        reason = f"the process that launched the plugin (pid {self.pid}, the Nomad agent) exited"
        log.warning("%s; stopping", reason)
        self._on_gone(reason)
        # The stop ends the process within go-plugin's 2 s budget; if anything holds it up, the
        # plugin must still go, or it would keep plugin.lock from the agent's next plugin.
        if not self._stop.wait(self._hard_exit):
            log.error("still running %.0fs after the launcher exited; exiting now", self._hard_exit)
            self._exit(1)
