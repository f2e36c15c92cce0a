"""A reconciler wired to a real journal and a real NomadClient whose HTTP answers are scripted."""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

import httpx

from nomad_plugin.config.model import PluginConfig
from nomad_plugin.journal import EntryState, Journal, JournalEntry
from nomad_plugin.model.grant import DeviceAsk
from nomad_plugin.model.instances import Catalog, GroupKey, Instance, InstanceGroup, Kind
from nomad_plugin.nomad.reserve import Reserver
from nomad_plugin.reconcile.nomad_api import NomadApiSettings, NomadClient
from nomad_plugin.reconcile.reconciler import Reconciler

GROUP = GroupKey("nvidia", "gpu", "H800")
GRANT = "0d9c1a2b-1111-4222-8333-444455556666"


class RecordingBackend:
    """Only release() is reached by the reconciler; it records what it was asked to release."""

    name = "recording"

    def __init__(self) -> None:
        self.released: list[str] = []

    def release(self, grant_id: str) -> None:
        self.released.append(grant_id)


class ReconcileRig:
    def __init__(self, held_ids: tuple[str, ...]) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="rfz-", dir="/tmp"))
        self.backend = RecordingBackend()
        instances = tuple(Instance(i, Kind.WHOLE, i, n, 0, 100, 0) for n, i in enumerate(held_ids))
        catalog = Catalog((InstanceGroup(GROUP, instances),))
        journal = Journal(self.dir / "data")
        journal.put(
            JournalEntry(
                grant_id=GRANT,
                device_ids=held_ids,
                group=str(GROUP),
                kind=Kind.WHOLE.value,
                cards=held_ids,
                asks=tuple(DeviceAsk(minor=n) for n in range(len(held_ids))),
                created_at=time.time(),
                state=EntryState.GRANTED,
            )
        )
        self.reserver = Reserver(self.backend, lambda: catalog, journal, PluginConfig())  # type: ignore[arg-type]
        self.client = NomadClient(NomadApiSettings(address="http://127.0.0.1:1"))
        self._body = b"[]"
        self.client._client = httpx.Client(
            base_url="http://nomad", transport=httpx.MockTransport(self._answer), timeout=httpx.Timeout(1.0)
        )
        self.reconciler = Reconciler(self.reserver, self.client, lambda: catalog, grace=0.0, node_id="node-1")

    def _answer(self, request: httpx.Request) -> httpx.Response:
        return httpx.Response(
            200, content=self._body, headers={"X-Nomad-Index": "7", "Content-Type": "application/json"}
        )

    def round(self, body: bytes) -> None:
        self._body = body
        self.reconciler.round()
        self.reconciler.round()  # grace 0: a second observation releases anything orphaned

    @property
    def released(self) -> list[str]:
        return self.backend.released

    def __enter__(self) -> ReconcileRig:
        return self

    def __exit__(self, *exc: object) -> None:
        self.client.close()
        shutil.rmtree(self.dir, ignore_errors=True)
