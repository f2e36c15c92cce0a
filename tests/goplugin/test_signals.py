"""SIGTERM reaches the serving plugin's main thread without its handler taking any lock.

A Python signal handler runs on the main thread between two bytecodes, wherever that thread is: if
it took a lock (an Event's, the Lifecycle's) at a moment the main thread held it, the plugin would
hang until Nomad's SIGKILL. Here the main thread holds both of Lifecycle's locks while SIGTERM is
delivered to it, which a locking handler would turn into a hang (pytest's timeout), and then the
stop must still follow from the signal alone.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator

import pytest

from nomad_plugin.goplugin.serve import PluginServer


@pytest.fixture
def server() -> Iterator[PluginServer]:
    """A server whose signal handling is installed in this process; the test runner's is put back after."""
    handlers = {number: signal.getsignal(number) for number in (signal.SIGINT, signal.SIGTERM)}
    old_fd = signal.set_wakeup_fd(-1)
    served = PluginServer(1, lambda: pytest.fail("no plugin is made here"))
    served._take_signals()
    try:
        yield served
    finally:
        signal.set_wakeup_fd(old_fd)
        for number, handler in handlers.items():
            signal.signal(number, handler)


@pytest.mark.timeout(20)
def test_sigterm_while_the_main_thread_holds_the_lifecycles_locks(server: PluginServer) -> None:
    lifecycle = server.lifecycle
    with lifecycle._lock, lifecycle.stopping._cond:  # the locks a handler must not take
        signal.raise_signal(signal.SIGTERM)  # its handler runs here, on this thread
        assert not lifecycle.stopping.is_set()
    server._wait_for_stop()
    assert (lifecycle.stopping.is_set(), lifecycle.stop_reason) == (True, "SIGTERM")


@pytest.mark.timeout(20)
def test_sigint_is_counted_and_a_stop_from_another_thread_ends_the_wait(server: PluginServer) -> None:
    import threading

    signal.raise_signal(signal.SIGINT)
    threading.Timer(0.2, server.lifecycle.request_stop, args=("GRPCController.Shutdown",)).start()
    server._wait_for_stop()
    assert server.lifecycle.stop_reason == "GRPCController.Shutdown"
    assert server._sigints == 1
