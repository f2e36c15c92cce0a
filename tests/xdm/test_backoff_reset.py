"""The ListAndWatch backoff starts over once XDM answers again.

After a long outage the watcher waits up to 30 s between tries; once a push
arrives the next break must be retried after ~1 s again, not after the
delay the old outage had grown to (a brief XDM restart would otherwise cost
the node its devices for half a minute).
"""

from __future__ import annotations

import random
from pathlib import Path

from nomad_plugin.config.model import PluginConfig
from nomad_plugin.sim import Simulator
from nomad_plugin.util.threads import Backoff
from nomad_plugin.xdm.backend import XdmBackend
from tests.waiting import wait_until


def test_backoff_is_reset_by_a_push(sockdir: Path) -> None:
    sim = Simulator(socket_dir=sockdir, profile="h800-8")  # initial_push: a push on every subscribe
    delays: list[float] = []

    def fake_sleep(delay: float) -> bool:
        delays.append(delay)
        if len(delays) == 4:  # 1, 2, 4, 8 s grown while XDM was absent: now it comes up
            sim.start()
        return len(delays) >= 5  # the delay after the next break is all we need

    config = PluginConfig(
        xdm_socket=str(sockdir / "dp2mgr.sock"),
        config_socket=str(sockdir / "config-daemon.sock"),
        xdm_call_timeout=2.0,
        inventory_resync_period=3600.0,
    )
    backend = XdmBackend(config, backoff=Backoff(rng=random.Random(3)), sleep=fake_sleep)
    backend.start()
    try:
        wait_until(lambda: len(delays) >= 4 and backend.inventory().reachable, "XDM to come up after 4 retries")
        wait_until(lambda: len(backend.inventory().cards) == 8, "the first push's 8 cards")
        sim.crash()  # the stream breaks
        wait_until(lambda: len(delays) >= 5, "the retry after the break")
    finally:
        backend.stop()
        sim.stop()
    grown, after_push = delays[3], delays[4]
    assert 8 * 0.8 <= grown <= 8 * 1.2, delays
    assert 0.8 <= after_push <= 1.2, (
        f"retry after a push waited {after_push:.1f} s: the backoff was not reset ({delays})"
    )
