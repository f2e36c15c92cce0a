"""The plugin's idle streams do not wake it up.

A consumer that owns a ``CancelEvent`` lets the exporter stream register its ``cancel``, so no
thread polls for the consumer's stop; and the backend widens grpcio's wait slice, so a blocked
stream reader is not woken ten times a second. Here: ``CancelEvent`` semantics, and the real
``XdmBackend`` and ``MetricsFeed`` against the simulator (no watcher thread, and ``stop`` still
ends the stream).
"""

from __future__ import annotations

import shutil
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc import _common as grpc_common

from nomad_plugin import sim as sim_module
from nomad_plugin.config.model import PluginConfig
from nomad_plugin.stats.feed import MetricsFeed
from nomad_plugin.util.threads import Backoff, CancelEvent
from nomad_plugin.xdm import backend as backend_module
from nomad_plugin.xdm.client import STREAM_WAIT_SLICE_S, relax_stream_waits
from tests.doubles.stats_fakes import count_updates
from tests.waiting import wait_until


def test_callbacks_run_once_when_set_and_at_once_when_already_set() -> None:
    event = CancelEvent()
    calls: list[str] = []
    event.on_set(lambda: calls.append("first"))
    forget = event.on_set(lambda: calls.append("forgotten"))
    forget()
    assert calls == []
    event.set()
    event.set()
    assert calls == ["first"]
    event.on_set(lambda: calls.append("late"))
    assert calls == ["first", "late"]
    assert isinstance(event, threading.Event) and event.wait(0)


def test_grpc_still_has_the_wait_slice_we_widen() -> None:
    # When this fails, grpcio renamed or dropped the constant: relax_stream_waits now does nothing
    # and the plugin's idle streams wake ten times a second again; find grpcio's new knob.
    assert isinstance(grpc_common.MAXIMUM_WAIT_TIMEOUT, float), grpc.__version__


def test_relax_never_narrows(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(grpc_common, "MAXIMUM_WAIT_TIMEOUT", 0.1)
    assert relax_stream_waits()
    assert grpc_common.MAXIMUM_WAIT_TIMEOUT == STREAM_WAIT_SLICE_S
    wider = STREAM_WAIT_SLICE_S * 3
    monkeypatch.setattr(grpc_common, "MAXIMUM_WAIT_TIMEOUT", wider)
    assert relax_stream_waits()
    assert grpc_common.MAXIMUM_WAIT_TIMEOUT == wider


@pytest.fixture
def sim() -> Iterator[sim_module.Simulator]:
    folder = Path(tempfile.mkdtemp(prefix="sw", dir="/tmp"))
    simulator = sim_module.Simulator(folder, "h800-8", collect_interval_ms=50)
    simulator.start()
    yield simulator
    simulator.stop()
    shutil.rmtree(folder, ignore_errors=True)


def test_feed_over_the_backend_needs_no_watcher_thread(
    sim: sim_module.Simulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(grpc_common, "MAXIMUM_WAIT_TIMEOUT", 0.1)
    backend = backend_module.XdmBackend(
        PluginConfig(xdm_socket=str(sim.dp2mgr_path), config_socket=str(sim.config_path))
    )
    backend.start()
    feed = MetricsFeed(backend, 0.05, backoff=Backoff(initial=0.1, cap=0.5, jitter=0.0))
    update_count = count_updates(feed.cache)
    feed.start()
    try:
        assert grpc_common.MAXIMUM_WAIT_TIMEOUT == STREAM_WAIT_SLICE_S, "the backend widens grpcio's wait slice"
        wait_until(lambda: feed.source == "stream" and update_count() >= 3, "the exporter stream feeding")
        names = [t.name for t in threading.enumerate()]
        assert "xdm-metrics-cancel" not in names, names
        feed.stop()
        wait_until(lambda: not feed.running, "the feed thread to end once its stream is cancelled")
    finally:
        feed.stop()
        backend.stop()
