"""Storm against the simulator: 100 concurrent Reserves on a 16-card 810E node, no double grant."""

from __future__ import annotations

import tempfile
import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

from nomad_plugin import sim as sim_mod
from nomad_plugin.config.model import PluginConfig
from nomad_plugin.journal import Journal
from nomad_plugin.model.instances import Catalog, GroupKey, Instance, InstanceGroup, Kind, share_id
from nomad_plugin.nomad.reserve import Reserver
from tests.reserve.crash_driver import make_backend


def test_storm_100_reserves_on_810e_16(tmp_path):
    sockets = tempfile.mkdtemp(prefix="ljs-", dir="/tmp")
    sim = sim_mod.Simulator(sockets, profile="810e-16").start()
    try:
        config = PluginConfig(
            data_dir=str(tmp_path / "data"),
            xdm_socket=f"{sockets}/dp2mgr.sock",
            config_socket=f"{sockets}/config-daemon.sock",
        )
        insts = tuple(
            Instance(share_id(c.uuid, i), Kind.SHARE, c.uuid, c.minor, i, 10, 9) for c in sim.cards for i in range(10)
        )
        cat = Catalog((InstanceGroup(GroupKey("alibaba", "ppu", "PPU 810E share"), insts),))
        reserver = Reserver(make_backend(config), lambda: cat, Journal(config.data_dir), config)
        cards = sim.cards
        requests = [[share_id(cards[n % 16].uuid, (n // 16) % 10)] for n in range(100)]
        # 10 requests reuse IDs of earlier ones: the earlier grant must be released (route a).
        for n in range(90, 100):
            requests[n] = list(requests[n - 90])
        barrier = threading.Barrier(25)

        def go(ids):
            try:
                barrier.wait(timeout=5)
            except threading.BrokenBarrierError:
                pass
            return reserver.reserve(ids).container_res.envs["LINGJUN_GRANT_ID"]

        with ThreadPoolExecutor(max_workers=25) as pool:
            gids = list(pool.map(go, requests))
        assert len(set(gids)) == 100
        at_xdm = sim.grants()
        journal = {e.grant_id: e for e in Journal(config.data_dir).entries()}
        assert set(at_xdm) == set(journal)
        assert len(at_xdm) == 90
        held = Counter(d for e in journal.values() for d in e.device_ids)
        assert max(held.values()) == 1
        per_card = Counter()
        for rec in at_xdm.values():
            for minor in rec.minors:
                per_card[minor] += rec.core
        assert max(per_card.values()) <= 100
    finally:
        sim.stop()
