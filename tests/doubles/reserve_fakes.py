"""A fake Backend that keeps XDM's capacity rules, and hand-built catalogs."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Collection

from nomad_plugin.journal import EntryState, JournalEntry
from nomad_plugin.model.card import Inventory
from nomad_plugin.model.errors import BackendRefused, BackendUnavailable
from nomad_plugin.model.grant import DeviceNode, Grant, GrantedDevice, GrantRequest, MountSpec
from nomad_plugin.model.instances import (
    Catalog,
    GroupKey,
    Instance,
    InstanceGroup,
    Kind,
    mig_unit_id,
    share_id,
)
from nomad_plugin.nomad.reserve import Reserver


def card_uuid(minor: int, prefix: str = "PPU") -> str:
    return f"{prefix}-{minor:04d}-aaaa-bbbb"


def whole_group(n: int, vendor: str = "alibaba", name: str = "PPU 810E", prefix: str = "PPU") -> InstanceGroup:
    insts = tuple(Instance(card_uuid(m, prefix), Kind.WHOLE, card_uuid(m, prefix), m) for m in range(n))
    return InstanceGroup(GroupKey(vendor, "ppu" if vendor != "nvidia" else "gpu", name), insts)


def share_group(minors: list[int], shares: int = 10, mem: int = 9, prefix: str = "PPU") -> InstanceGroup:
    insts = tuple(
        Instance(share_id(card_uuid(m, prefix), i), Kind.SHARE, card_uuid(m, prefix), m, i, 100 // shares, mem)
        for m in minors
        for i in range(shares)
    )
    return InstanceGroup(GroupKey("alibaba", "ppu", "PPU 810E share"), insts)


def mig_group(minors: list[int], mem: int = 10) -> InstanceGroup:
    insts = tuple(
        Instance(mig_unit_id(card_uuid(m, "GPU"), i), Kind.MIG, card_uuid(m, "GPU"), m, i, 0, mem, 1)
        for m in minors
        for i in range(7)
    )
    return InstanceGroup(GroupKey("nvidia", "gpu", "H800 mig"), insts)


def catalog(*groups: InstanceGroup) -> Catalog:
    return Catalog(tuple(groups))


class Clock:
    """A monotonic clock the test moves by hand (``clock.now += 10``)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class FakeBackend:
    """Grants with whole-card exclusivity and per-card capacity; records calls."""

    name = "fake"

    def __init__(self, style: str = "env+devices", vendor_prefix: str = "PPU") -> None:
        self.style = style
        self.prefix = vendor_prefix
        self.lock = threading.Lock()
        self.grants: dict[str, GrantRequest] = {}
        self.released: list[str] = []
        self.allocate_calls = 0
        self.fail_allocate: Exception | None = None
        self.fail_release: Exception | None = None
        self.allocate_delay = 0.0
        self.mutate: Callable[[Grant], Grant] | None = None
        self.double_grants: list[str] = []

    def start(self) -> None: ...
    def stop(self) -> None: ...
    def inventory(self) -> Inventory:
        return Inventory()

    def subscribe(self, listener: object) -> Callable[[], None]:
        return lambda: None

    def metrics_snapshot(self) -> list[object]:
        return []

    def metrics_stream(self, cancel: threading.Event):  # type: ignore[no-untyped-def]
        return iter(())

    def allocate(self, request: GrantRequest) -> Grant:
        if self.allocate_delay:
            time.sleep(self.allocate_delay)
        with self.lock:
            self.allocate_calls += 1
            if self.fail_allocate is not None:
                raise self.fail_allocate
            if request.grant_id in self.grants:
                raise BackendRefused("duplicate id", 6)
            for ask in request.asks:
                used_core = sum(a.core or 100 for g in self.grants.values() for a in g.asks if a.minor == ask.minor)
                used_slices = sum(a.slices for g in self.grants.values() for a in g.asks if a.minor == ask.minor)
                if ask.slices:
                    if used_slices + ask.slices > 7:
                        self.double_grants.append(request.grant_id)
                        raise BackendRefused(f"card {ask.minor} has no room for {ask.slices} slices", 8)
                elif used_core + (ask.core or 100) > 100:
                    self.double_grants.append(request.grant_id)
                    raise BackendRefused(f"card {ask.minor} busy", 8)
            self.grants[request.grant_id] = request
        grant = Grant(
            grant_id=request.grant_id,
            devices=tuple(
                GrantedDevice(
                    a.minor,
                    card_uuid(a.minor, self.prefix),
                    a.core,
                    a.memory_gib,
                    a.slices,
                    f"MIG-{a.minor}-{request.grant_id[:8]}" if a.slices else "",
                )
                for a in request.asks
            ),
            envs={"XDM_GRANT": request.grant_id} if "env" in self.style else {},
            device_nodes=tuple(DeviceNode(f"/dev/alixpu{a.minor}", f"/dev/alixpu{a.minor}") for a in request.asks)
            if "devices" in self.style
            else (),
            mounts=(MountSpec("/usr/local/lj", "/opt/lj/lib"),) if "mounts" in self.style else (),
            annotations={"xdm.amp.com/allocation-id": request.grant_id} if "annotations" in self.style else {},
        )
        return self.mutate(grant) if self.mutate else grant

    def release(self, grant_id: str) -> None:
        with self.lock:
            if self.fail_release is not None:
                raise self.fail_release
            self.released.append(grant_id)
            self.grants.pop(grant_id, None)


UNAVAILABLE = BackendUnavailable("XDM socket missing", "socket-missing")


#: The points of a Reserve the crash tests stop at, in order: the intent is journalled (Allocate about to
#: be sent), Allocate answered, the grant journalled.
STEPS = ("before-allocate", "after-allocate", "after-journal")


def announce_steps(reserver: Reserver, hook: Callable[[str], None]) -> None:
    """Call ``hook`` at each of STEPS of ``reserver``'s Reserves, through its backend and journal (the seams
    it is built with), so a test can observe, or a crash driver stop, the flow there."""
    allocate, put = reserver.backend.allocate, reserver.journal.put

    def allocating(request: GrantRequest) -> Grant:
        hook("before-allocate")
        grant = allocate(request)
        hook("after-allocate")
        return grant

    def putting(entry: JournalEntry, remove: Collection[str] = ()) -> None:
        put(entry, remove)
        if entry.state is EntryState.GRANTED:
            hook("after-journal")

    reserver.backend.allocate = allocating  # type: ignore[method-assign]
    reserver.journal.put = putting  # type: ignore[method-assign]
