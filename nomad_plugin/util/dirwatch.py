"""Wait for files to land in a directory without waking up to look: inotify, polling as a fallback.

Why: the plugin waits for operator requests (``grants release``) for its
whole life, and looking twice a second would cost more CPU than anything else
the idle plugin does outside Nomad's streams. With inotify the thread sleeps
until a file is renamed or written into the directory. Where inotify is
unavailable (the per-user watch limit reached, a file system without it), the
watch says so once and polls. Either way a slow safety poll remains, so a lost
event costs latency, never a request.
"""

from __future__ import annotations

import logging
import os
import select
import threading
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

#: Even with inotify, look this often (seconds): an event can be lost (queue overflow).
SAFETY_PERIOD_S = 30.0


class DirWatch:
    """``wait()`` returns when a file ending in ``suffix`` may have landed, or False once stopped.

    Not shared between threads: one thread waits; any thread may call ``wake``.
    The waiting thread closes the watch (``close``) when it is done.
    """

    def __init__(
        self,
        directory: Path,
        suffix: str,
        stop: threading.Event,
        poll_period: float,
        safety_period: float = SAFETY_PERIOD_S,
    ) -> None:
        self.directory = directory
        self.suffix = suffix
        self.poll_period = poll_period
        self.safety_period = safety_period
        self._stop = stop
        self._inotify: Any = None  # inotify_simple.INotify (untyped)
        self._fds = threading.Lock()  # wake() never writes to a closed (maybe reused) descriptor
        self._wake_r, self._wake_w = -1, -1
        self.mode = "polling"
        try:
            from inotify_simple import INotify, flags

            notify = INotify(nonblocking=True)
            try:
                notify.add_watch(str(directory), flags.CLOSE_WRITE | flags.MOVED_TO | flags.ONLYDIR)
            except BaseException:
                notify.close()
                raise
        except (ImportError, OSError) as exc:
            log.warning(
                "cannot watch %s with inotify (%s); looking for files every %g s instead", directory, exc, poll_period
            )
            return
        self._inotify = notify
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self.mode = "inotify"

    def wait(self) -> bool:
        """Block until a matching file may have landed (True), or ``stop`` is set (False)."""
        if self._stop.is_set():
            return False
        notify = self._inotify
        if notify is None:
            return not self._stop.wait(self.poll_period)
        while not self._stop.is_set():
            ready, _, _ = select.select([notify, self._wake_r], [], [], self.safety_period)
            if self._stop.is_set():
                return False
            if not ready:
                return True  # the safety poll
            if notify in ready and self._matching(notify):
                return True
            if self._inotify is None:  # the watch ended with its directory
                return not self._stop.wait(self.poll_period)
            if self._wake_r in ready:
                _drain(self._wake_r)
        return False

    def _matching(self, notify: Any) -> bool:
        """Drain the events; True if one names a file with our suffix (or events were lost)."""
        from inotify_simple import flags

        found = False
        for event in notify.read(timeout=0):
            if event.mask & flags.Q_OVERFLOW or event.name.endswith(self.suffix):
                found = True
            if event.mask & flags.IGNORED:  # the directory was removed or moved: this watch is over
                log.warning(
                    "stopped watching %s (removed or moved); looking every %g s", self.directory, self.poll_period
                )
                self.close_inotify()
                found = True
        return found

    def wake(self) -> None:
        """Make a blocked ``wait`` look at ``stop`` now (call after setting it)."""
        with self._fds:
            if self._wake_w >= 0:
                try:
                    os.write(self._wake_w, b"x")
                except OSError:
                    pass  # a full pipe already wakes the waiter

    def close_inotify(self) -> None:
        notify, self._inotify = self._inotify, None
        self.mode = "polling"
        if notify is not None:
            notify.close()

    def close(self) -> None:
        with self._fds:
            self.close_inotify()
            for fd in (self._wake_r, self._wake_w):
                if fd >= 0:
                    os.close(fd)
            self._wake_r, self._wake_w = -1, -1


def _drain(fd: int) -> None:
    try:
        while os.read(fd, 64):
            pass
    except OSError:  # BlockingIOError: drained
        pass
