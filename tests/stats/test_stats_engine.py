"""StatsEngine.responses: immediate first answer, one per interval, never ends or raises before cancel."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

from nomad_plugin.model.card import Inventory
from nomad_plugin.model.instances import Catalog
from nomad_plugin.stats.engine import StatsEngine, effective_interval
from nomad_plugin.stats.feed import MetricsCache
from tests.doubles.stats_fakes import sample
from tests.waiting import wait_until


def test_zero_interval_means_one_second() -> None:
    assert effective_interval(0) == 1.0
    assert effective_interval(-3) == 1.0
    assert effective_interval(0.25) == 0.25


def test_first_response_at_once_then_per_interval(three_cards) -> None:  # type: ignore[no-untyped-def]
    catalog, inventory = three_cards
    cache = MetricsCache()
    cache.update([sample("GPU-0", "temperature_c", 44)])
    engine = StatsEngine(cache, lambda: catalog, lambda: inventory)
    # The first response does not wait for an interval: with 600 s it still comes within a minute.
    slow, got = threading.Event(), []
    threading.Thread(target=lambda: got.append(next(engine.responses(600.0, slow))), daemon=True).start()
    wait_until(lambda: got, "the first stats response of a 600 s-interval stream", timeout=60)
    slow.set()
    assert len(got[0].groups) == 3
    cancel = threading.Event()
    stream = engine.responses(0.05, cancel)
    first = next(stream)
    assert len(first.groups) == 3
    assert first.groups[0].instance_stats["GPU-0"].stats.attributes["Temperature"].int_numerator_val.value == 44
    cache.update([sample("GPU-0", "temperature_c", 45)])
    t0 = time.monotonic()
    second = next(stream)
    third = next(stream)
    elapsed = time.monotonic() - t0
    assert elapsed >= 0.05  # paced by the interval, no burst
    assert second.groups[0].instance_stats["GPU-0"].stats.attributes["Temperature"].int_numerator_val.value == 45
    assert len(third.groups) == 3
    cancel.set()
    assert list(stream) == []  # ends only after cancel


def test_cancel_while_waiting_ends_promptly(three_cards) -> None:  # type: ignore[no-untyped-def]
    catalog, inventory = three_cards
    engine = StatsEngine(MetricsCache(), lambda: catalog, lambda: inventory)
    cancel = threading.Event()
    stream = engine.responses(30.0, cancel)
    next(stream)
    threading.Timer(0.05, cancel.set).start()
    started = time.monotonic()
    assert list(stream) == []
    assert time.monotonic() - started < 10.0  # far below the 30 s interval it was waiting in


def test_layout_error_sends_na_values_not_an_exception(three_cards) -> None:  # type: ignore[no-untyped-def]
    catalog, inventory = three_cards
    cache = MetricsCache()
    cache.update([sample("GPU-0", "temperature_c", 44)])

    def broken_grants() -> None:
        raise RuntimeError("reserve layer bug")

    engine = StatsEngine(cache, lambda: catalog, lambda: inventory, broken_grants)  # type: ignore[arg-type]
    response = next(engine.responses(1.0, threading.Event()))
    assert sorted(k for g in response.groups for k in g.instance_stats) == sorted(catalog.all_ids())
    temp = response.groups[0].instance_stats["GPU-0"].stats.attributes["Temperature"]
    assert temp.string_val.value == "N/A"  # the fallback does not pretend to have readings


def test_catalog_error_sends_empty_response_and_keeps_going() -> None:
    calls = []

    def catalog() -> Catalog:
        calls.append(1)
        raise RuntimeError("catalog gone")

    engine = StatsEngine(MetricsCache(), catalog, Inventory)
    cancel = threading.Event()
    stream = engine.responses(0.01, cancel)
    assert len(next(stream).groups) == 0
    assert len(next(stream).groups) == 0
    cancel.set()
    assert len(calls) >= 2


def test_wall_clock_jump_neither_stales_readings_nor_breaks_timestamps(three_cards) -> None:  # type: ignore[no-untyped-def]
    """Ages run on the cache's monotonic clock; only timestamps follow the wall clock."""
    catalog, inventory = three_cards
    mono = [500.0]
    wall = [1_800_000_000.0]
    cache = MetricsCache(clock=lambda: mono[0])
    cache.update([sample("GPU-0", "temperature_c", 44)])
    engine = StatsEngine(cache, lambda: catalog, lambda: inventory, clock=lambda: mono[0], wall_clock=lambda: wall[0])
    mono[0] += 0.5
    wall[0] += 3600.0  # NTP steps the wall clock an hour forward
    stats = engine.build(1.0).groups[0].instance_stats["GPU-0"]
    temp = stats.stats.attributes["Temperature"]
    assert temp.int_numerator_val.value == 44 and not temp.desc.startswith("stale")
    assert stats.stats.attributes["Stats age"].float_numerator_val.value == 0.5
    assert stats.timestamp.seconds == int(wall[0] - 0.5)  # when the reading arrived, in wall time
    mono[0] += 10.0  # and a reading that really is old is still called stale
    assert engine.build(1.0).groups[0].instance_stats["GPU-0"].stats.attributes["Temperature"].desc.startswith("stale")


def test_share_stats_follow_the_reservers_journal_through_reserve_and_release(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Wired as the plugin wires it: the stats name the grant the journal holds now, never an older answer."""
    from nomad_plugin.app import PluginApp
    from nomad_plugin.config.model import PluginConfig
    from nomad_plugin.journal import Journal
    from nomad_plugin.nomad.reserve import Reserver
    from tests.doubles.reserve_fakes import FakeBackend, card_uuid, catalog, share_group

    cat = catalog(share_group([0], shares=4))
    app = PluginApp()
    reserver = Reserver(FakeBackend(), lambda: cat, Journal(tmp_path), PluginConfig(), path_exists=lambda p: False)
    app._owner = SimpleNamespace(reserver=reserver)  # the part of the owner record the stats read
    engine = StatsEngine(MetricsCache(), lambda: cat, Inventory, app._grants)
    share = f"{card_uuid(0)}-share-1"

    def shown() -> str:
        stats = next(s for g in engine.build(1.0).groups for i, s in g.instance_stats.items() if i == share)
        return stats.stats.nested["share"].attributes["Grant"].string_val.value

    assert shown() == "none"
    grant = reserver.reserve([share]).container_res.envs["LINGJUN_GRANT_ID"]
    assert shown() == grant
    assert reserver.release_grant(grant, "test")
    assert shown() == "none"
