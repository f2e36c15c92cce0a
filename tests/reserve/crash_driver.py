"""Driver process for the crash tests: Reserve against the simulator, or recover.

    python -m tests.reserve.crash_driver reserve <spec.json>
    python -m tests.reserve.crash_driver recover <spec.json>

``spec.json``: data_dir, socket_dir, cards [[minor, uuid], ...], device_ids,
nomad_address, and optionally allocate_timeout (``xdm_allocate_timeout``,
default 0.5 s: an intent left by a killed Reserve is kept two of them).
``recover`` releases what the journal holds, then waits (bounded) for the
windows in which XDM could still commit a killed Reserve's grant to close,
and retries the releases kept for them, as the reconciler's rounds would.
With ``LINGJUN_CRASH_STOP_AT=<step>`` the Reserve stops at
that step (``tests.doubles.reserve_fakes.STEPS``, announced through the reserver's backend and journal), prints ``STOPPED <step>``
and waits to be SIGKILLed.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

from nomad_plugin.config.model import PluginConfig
from nomad_plugin.journal import Journal
from nomad_plugin.model.instances import Catalog, GroupKey, Instance, InstanceGroup, Kind
from nomad_plugin.nomad.reserve import Reserver
from nomad_plugin.reconcile.nomad_api import NomadApiSettings, NomadClient
from nomad_plugin.reconcile.reconciler import Reconciler
from nomad_plugin.xdm.backend import XdmBackend
from tests.doubles.reserve_fakes import announce_steps


def make_backend(config: PluginConfig) -> XdmBackend:
    """The plugin's own XDM backend, started (what app.py hands the Reserver)."""
    backend = XdmBackend(config)
    backend.start()
    return backend


def catalog(cards: list[list[Any]]) -> Catalog:
    insts = tuple(Instance(uuid, Kind.WHOLE, uuid, minor) for minor, uuid in cards)
    return Catalog((InstanceGroup(GroupKey("alibaba", "ppu", "sim"), insts),))


def main(argv: list[str]) -> int:
    mode, spec_path = argv
    spec = json.loads(open(spec_path).read())
    config = PluginConfig(
        data_dir=spec["data_dir"],
        xdm_socket=os.path.join(spec["socket_dir"], "dp2mgr.sock"),
        config_socket=os.path.join(spec["socket_dir"], "config-daemon.sock"),
        release_grace_period=0.0,
        xdm_allocate_timeout=float(spec.get("allocate_timeout", 0.5)),
    )
    stop_at = os.environ.get("LINGJUN_CRASH_STOP_AT", "")

    def hook(step: str) -> None:
        if step == stop_at:
            print(f"STOPPED {step}", flush=True)
            while True:
                time.sleep(60)

    cat = catalog(spec["cards"])
    reserver = Reserver(make_backend(config), lambda: cat, Journal(config.data_dir), config)
    announce_steps(reserver, hook)
    if mode == "reserve":
        resp = reserver.reserve(spec["device_ids"])
        print("DONE", resp.container_res.envs["LINGJUN_GRANT_ID"], flush=True)
        return 0
    released = reserver.recover()
    settle = max((e.settle_until for e in reserver.entries()), default=0.0)
    time.sleep(max(0.0, min(10.0, settle - time.time())))
    released += reserver.retry_pending()
    client = NomadClient(NomadApiSettings(address=spec["nomad_address"], timeout=2.0))
    rec = Reconciler(reserver, client, lambda: cat, grace=0.0, max_wait=0.2)
    rec.round()
    rec.round()
    left = [{"grant_id": e.grant_id, "state": e.state.value} for e in reserver.entries()]
    print(json.dumps({"released_at_startup": released, "left": left}), flush=True)
    client.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
