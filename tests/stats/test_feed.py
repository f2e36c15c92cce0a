"""MetricsFeed: stream first, poll while the stream is down, NVML without an exporter, else nothing."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence

import pytest

from nomad_plugin.model.metrics import MetricSample
from nomad_plugin.stats.feed import MetricsCache, MetricsFeed
from nomad_plugin.util.threads import Backoff
from tests.doubles.stats_fakes import FakeBackend, sample


def wait_until(cond: Callable[[], bool], timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.005)
    return cond()


def fast_backoff() -> Backoff:
    return Backoff(initial=0.05, factor=2.0, cap=0.2, jitter=0.0)


@pytest.fixture
def backend() -> FakeBackend:
    return FakeBackend()


def make_feed(backend: FakeBackend, **kw: object) -> MetricsFeed:
    return MetricsFeed(backend, 0.02, time.time, backoff=fast_backoff(), **kw)  # type: ignore[arg-type]


def util(feed: MetricsFeed, device: str) -> float | None:
    reading = feed.cache.card(device, "core_util_percent")
    return reading.value if reading else None


def test_stream_fills_cache(backend: FakeBackend) -> None:
    feed = make_feed(backend)
    feed.start()
    try:
        assert wait_until(lambda: util(feed, "GPU-0") == 10.0 and feed.source == "stream")
        assert backend.snapshot_calls == 0  # no polling while the stream is healthy
    finally:
        feed.stop()
    assert not feed.running
    assert backend.streams_open == 0  # the stream saw the cancel


def test_stream_breaks_then_poll_then_stream_again(backend: FakeBackend) -> None:
    feed = make_feed(backend)
    feed.start()
    try:
        assert wait_until(lambda: feed.source == "stream")
        backend.stream_mode = "down"  # the running stream breaks, resubscribes are refused
        assert wait_until(lambda: feed.source == "poll")
        assert wait_until(lambda: util(feed, "0") == 20.0)
        polls = backend.snapshot_calls
        assert wait_until(lambda: backend.snapshot_calls >= polls + 3)  # keeps polling at the interval
        assert feed.cache.source == "poll"
        backend.stream_value = 11.0
        backend.stream_mode = "ok"
        assert wait_until(lambda: feed.source == "stream" and util(feed, "GPU-0") == 11.0)
        polls = backend.snapshot_calls
        time.sleep(0.1)
        assert backend.snapshot_calls == polls  # polling stopped once the stream came back
    finally:
        feed.stop()


def test_restart_of_exporter_resubscribes(backend: FakeBackend) -> None:
    feed = make_feed(backend)
    feed.start()
    try:
        assert wait_until(lambda: backend.stream_calls == 1 and feed.source == "stream")
        backend.break_stream.set()
        assert wait_until(lambda: backend.stream_calls >= 2 and feed.source == "stream")
        assert feed.stream_subscriptions >= 2
    finally:
        feed.stop()


def test_nvml_when_no_exporter(backend: FakeBackend) -> None:
    backend.stream_mode = backend.snapshot_mode = "unimplemented"
    reads: list[float] = []

    def nvml() -> Sequence[MetricSample]:
        reads.append(time.monotonic())
        return [sample("GPU-7", "temperature_c", 55.0)]

    feed = make_feed(backend, nvml_source=nvml)
    feed.start()
    try:
        assert wait_until(lambda: feed.source == "nvml")
        assert feed.cache.card("GPU-7", "temperature_c") is not None
        assert wait_until(lambda: len(reads) >= 3)
    finally:
        feed.stop()


def test_nvml_not_used_when_exporter_is_only_down(backend: FakeBackend) -> None:
    backend.stream_mode = backend.snapshot_mode = "down"
    called: list[int] = []
    feed = make_feed(backend, nvml_source=lambda: called.append(1) or [])
    feed.start()
    try:
        assert wait_until(lambda: backend.snapshot_calls >= 3)
        assert called == []
        assert feed.source == "none"
    finally:
        feed.stop()


def test_nothing_without_exporter_or_nvml_and_no_busy_loop(backend: FakeBackend) -> None:
    backend.stream_mode = backend.snapshot_mode = "unimplemented"
    feed = make_feed(backend)
    started = time.monotonic()
    feed.start()
    try:
        # Wait for the 4th probe (a condition), then check how soon it came: never
        # sooner than the backoff allows (0.05 + 0.1 + 0.2 s, no jitter). A busy
        # loop would reach it at once; a slow box only makes it later.
        reached = wait_until(lambda: backend.stream_calls >= 4, timeout=30)
        assert reached, f"the feed never re-probed the stream 3 times (calls: {backend.stream_calls})"
        elapsed = time.monotonic() - started
        assert elapsed >= 0.35, f"4 stream probes within {elapsed:.3f} s: the backoff is not applied"
        assert len(feed.cache) == 0
        assert feed.source == "none"
    finally:
        feed.stop()
    assert backend.snapshot_calls <= backend.stream_calls  # an unimplemented snapshot is not retried per tick


def test_stream_that_raises_anything_is_survived() -> None:
    class Broken(FakeBackend):
        def metrics_stream(self, cancel: threading.Event) -> Iterator[Sequence[MetricSample]]:
            self.stream_calls += 1
            raise RuntimeError("schema drift")

    backend = Broken()
    feed = make_feed(backend)
    feed.start()
    try:
        assert wait_until(lambda: backend.stream_calls >= 2 and feed.source == "poll")
        assert feed.running
    finally:
        feed.stop()


def test_stop_is_prompt_during_long_backoff(backend: FakeBackend) -> None:
    backend.stream_mode = "down"
    feed = MetricsFeed(backend, 5.0, backoff=Backoff(initial=30.0, jitter=0.0))
    feed.start()
    assert wait_until(lambda: backend.snapshot_calls >= 1)
    started = time.monotonic()
    feed.stop()
    assert time.monotonic() - started < 10.0  # far below the 30 s backoff it was sleeping in
    assert not feed.running


def test_feed_uses_given_cache_and_clock(backend: FakeBackend) -> None:
    cache = MetricsCache(clock=lambda: 1234.0)
    feed = MetricsFeed(backend, 0.02, cache=cache, backoff=fast_backoff())
    feed.start()
    try:
        assert wait_until(lambda: cache.card("GPU-0", "core_util_percent") is not None)
        reading = cache.card("GPU-0", "core_util_percent")
        assert reading is not None and reading.received == 1234.0
    finally:
        feed.stop()


def test_bad_interval_is_refused(backend: FakeBackend) -> None:
    with pytest.raises(ValueError, match="interval"):
        MetricsFeed(backend, 0)
