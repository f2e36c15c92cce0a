from __future__ import annotations

import threading
import time

import pytest

from nomad_plugin.config.model import PluginConfig
from nomad_plugin.nvml.backend import HealthBook, stamp
from tests.doubles.fake_pynvml import NVML_ERROR_UNKNOWN, FakeNvml, h100

# --- the pure state machine ---------------------------------------------------------


def test_book_critical_xid_holds_then_expires() -> None:
    book = HealthBook(xid_ignore=(13,), hold_s=60)
    assert book.record_xid("A", 79, now=1000.0)
    assert book.verdict("A") == (False, f"XID 79 at {stamp(1000.0)}")
    assert stamp(1000.0) == "1970-01-01T00:16:40Z"
    assert book.expire(1059.0) == [] and not book.verdict("A")[0]
    assert book.expire(1060.0) == ["A"] and book.verdict("A") == (True, "")
    assert book.xid_count("A") == 1


def test_book_ignored_xid_counts_but_does_not_change_health() -> None:
    book = HealthBook(xid_ignore=(13, 31, 43, 45, 68, 109), hold_s=60)
    for xid in (13, 31, 43, 45, 68, 109):
        assert not book.record_xid("A", xid, now=5.0)
    assert book.verdict("A") == (True, "") and book.xid_count("A") == 0


def test_book_new_fault_restarts_hold_and_lost_outranks() -> None:
    book = HealthBook(hold_s=10)
    book.record_xid("A", 48, now=0.0)
    book.record_dbe("A", now=8.0)
    assert book.verdict("A")[1].startswith("double-bit ECC error at")
    assert book.expire(17.9) == [] and book.xid_count("A") == 2, "the DBE at 8 s restarted the 10 s hold"
    assert book.record_lost("A", "GPU is lost (NVML error 15)", now=9.0)
    assert book.verdict("A")[1].startswith("GPU is lost")
    assert book.expire(18.0) == ["A"]
    assert not book.verdict("A")[0]  # still lost after the hold
    assert book.record_probe_ok("A") and book.verdict("A") == (True, "")


def test_book_loop_failure_covers_all_cards_until_cleared() -> None:
    book = HealthBook()
    assert book.record_loop_failure(["A", "B"], "Unknown Error (NVML error 999)", now=0.0)
    assert not book.verdict("A")[0] and "event loop failed" in book.verdict("B")[1]
    assert book.clear_loop_failure() and book.verdict("A")[0] and book.verdict("B")[0]
    assert not book.clear_loop_failure()


def test_book_rejects_negative_hold() -> None:
    with pytest.raises(ValueError, match="xid_hold"):
        HealthBook(hold_s=-1)


# --- through the backend and NVML events ------------------------------------------------


def _card(backend, minor):
    return backend.inventory().by_minor(minor)


def test_critical_xid_marks_card_unhealthy_and_notifies(fake: FakeNvml, make_backend, wait_for) -> None:
    backend = make_backend(fake, xid_hold_s=60)
    seen = []
    backend.subscribe(seen.append)
    assert fake.wait_registered([0, 1, 2])
    assert fake.inject_xid(1, 79) == 1
    assert wait_for(lambda: not _card(backend, 1).healthy)
    assert _card(backend, 1).health_reason.startswith("XID 79 at ")
    assert _card(backend, 0).healthy and _card(backend, 2).healthy
    assert seen and not seen[-1].by_minor(1).healthy
    assert _card(backend, 1).extra["health_source"] == "nvml-events"


def test_ignored_xids_neither_hold_the_card_nor_count(fake: FakeNvml, make_backend, wait_for) -> None:
    backend = make_backend(fake)
    assert fake.wait_registered([0])
    fake.inject_xid(0, 13)  # graphics engine exception: the application's fault
    fake.inject_xid(0, 43)
    fake.inject_xid(0, 79)  # events arrive in order: once this one counts, the two before it were seen
    assert wait_for(lambda: not _card(backend, 0).healthy)
    assert _card(backend, 0).health_reason.startswith("XID 79 at ")
    values = {s.name: s.value for s in backend.metrics_snapshot() if s.device == fake.gpus[0].uuid}
    assert values["xid_errors"] == 1, "the ignored XIDs were counted as faults"


def test_ignore_list_is_configurable(fake: FakeNvml, make_backend, wait_for) -> None:
    backend = make_backend(fake, PluginConfig(xid_ignore=(79,)))
    assert fake.wait_registered([0])
    fake.inject_xid(0, 79)
    fake.inject_xid(0, 13)  # no longer ignored
    assert wait_for(lambda: not _card(backend, 0).healthy)
    assert _card(backend, 0).health_reason.startswith("XID 13 at ")
    values = {s.name: s.value for s in backend.metrics_snapshot() if s.device == fake.gpus[0].uuid}
    assert values["xid_errors"] == 1, "XID 79 was ignored"


def test_double_bit_ecc_marks_card_unhealthy(fake: FakeNvml, make_backend, wait_for) -> None:
    backend = make_backend(fake)
    assert fake.wait_registered([2])
    fake.inject_dbe(2)
    assert wait_for(lambda: not _card(backend, 2).healthy)
    assert _card(backend, 2).health_reason.startswith("double-bit ECC error at ")


def test_xid_inside_mig_instance_names_it(fake: FakeNvml, make_backend, wait_for) -> None:
    backend = make_backend(fake)
    assert fake.wait_registered([2])
    fake.inject_xid(2, 94, gpu_instance=3, compute_instance=0)
    assert wait_for(lambda: not _card(backend, 2).healthy)
    assert "on MIG GPU instance 3/compute instance 0" in _card(backend, 2).health_reason


def test_hold_expires_back_to_healthy(fake: FakeNvml, make_backend, wait_for) -> None:
    backend = make_backend(fake, xid_hold_s=0.3)
    assert fake.wait_registered([0])
    t0 = time.monotonic()
    fake.inject_xid(0, 48)
    assert wait_for(lambda: not _card(backend, 0).healthy)
    assert wait_for(lambda: _card(backend, 0).healthy)
    assert time.monotonic() - t0 >= 0.3  # not before the hold ended


def test_card_lost_after_xid79_stays_unhealthy_past_the_hold(fake: FakeNvml, make_backend, wait_for) -> None:
    backend = make_backend(fake, xid_hold_s=0.2, probe_period_s=0.1)
    assert fake.wait_registered([0])
    fake.inject_xid(0, 79)
    fake.lose_gpu(0)
    assert wait_for(lambda: "GPU is lost" in _card(backend, 0).health_reason, timeout=30)
    time.sleep(0.3)
    assert not _card(backend, 0).healthy
    fake.lose_gpu(0, lost=False)  # e.g. after a GPU reset
    assert wait_for(lambda: _card(backend, 0).healthy, timeout=30)


def test_event_loop_failure_marks_cards_unhealthy_without_flapping(fake: FakeNvml, make_backend, wait_for) -> None:
    backend = make_backend(fake)
    seen = []
    lock = threading.Lock()

    def listener(inv):
        with lock:
            seen.append(inv)

    backend.subscribe(listener)
    assert fake.wait_registered([0, 1, 2])
    fake.fail_event_loop(NVML_ERROR_UNKNOWN)
    assert wait_for(lambda: all(not c.healthy for c in backend.inventory().cards))
    reason = _card(backend, 0).health_reason
    assert "NVML event loop failed" in reason and "Unknown Error (NVML error 999)" in reason
    with lock:
        mark = len(seen)
    time.sleep(0.4)  # several retries with the fake's backoff: never healthy meanwhile
    with lock:
        during = seen[mark:]
    assert all(not c.healthy for inv in during for c in inv.cards)
    fake.fail_event_loop(None)
    assert wait_for(lambda: all(c.healthy for c in backend.inventory().cards))


def test_card_without_event_support_is_reported_as_unwatched(make_backend, wait_for) -> None:
    fake = FakeNvml([h100(0), h100(1)])
    fake.gpus[1].events_supported = False
    backend = make_backend(fake)
    assert wait_for(lambda: _card(backend, 1).extra.get("health_source") == "none")
    assert _card(backend, 1).healthy and _card(backend, 0).extra["health_source"] == "nvml-events"


def test_unsubscribe_stops_notifications(fake: FakeNvml, make_backend, wait_for) -> None:
    backend = make_backend(fake)
    seen = []
    unsubscribe = backend.subscribe(seen.append)
    unsubscribe()
    unsubscribe()  # idempotent
    assert fake.wait_registered([0])
    fake.inject_xid(0, 79)
    assert wait_for(lambda: not _card(backend, 0).healthy)
    assert seen == []


def test_driver_unloaded_underneath_marks_cards_unhealthy_then_reinitialises(
    fake: FakeNvml, make_backend, wait_for
) -> None:
    from nomad_plugin.model.errors import BackendUnavailable
    from tests.doubles.fake_pynvml import NVML_ERROR_DRIVER_NOT_LOADED

    backend = make_backend(fake)
    assert fake.wait_registered([0, 1, 2])
    calls_before = fake.init_calls
    fake.driver_gone = NVML_ERROR_DRIVER_NOT_LOADED
    assert wait_for(lambda: all(not c.healthy for c in backend.inventory().cards))
    assert "Driver Not Loaded" in _card(backend, 0).health_reason
    with pytest.raises(BackendUnavailable, match="Driver Not Loaded"):
        backend.metrics_snapshot()
    fake.driver_gone = None
    assert wait_for(lambda: all(c.healthy for c in backend.inventory().cards))
    assert fake.init_calls > calls_before  # nvmlInit was called again
    assert backend.metrics_snapshot()
