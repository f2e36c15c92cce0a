"""Plausibility guards on decoded XDM data, whatever the schema source (R2).

A schema that is wrong but wire-compatible decodes *silently* into wrong
values: a PCI address where the UUID belongs, a minor where the memory size
belongs. These checks are the last line: each failure is phrased for the
"XDM schema mismatch: ..." finding (cards unhealthy with it, Reserve refused
with it). They are pure, and loose enough for any real card:

- a UUID looks like one (optionally prefixed: ``GPU-``, ``PPU-``, ``MIG-``),
  32 hex digits in the 8-4-4-4-12 or plain form;
- minors are unique and within 0..MAX_MINOR;
- memory is within MIN_MEMORY_MIB..MAX_MEMORY_MIB (1 GiB .. 4 TiB);
- the health word is known (an unreadable one is never defaulted);
- topology JSON parses (a failure on every card that has one is systematic,
  i.e. the schema; a single bad card only loses its topology, R9).

Grant verification (granted minors == requested ones) lives in ``verify.py``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from nomad_plugin.model.card import Card
from nomad_plugin.model.grant import DeviceAsk, Grant, GrantedDevice, GrantRequest
from nomad_plugin.xdm.adapter import HEALTH_UNREADABLE, GpuFacts

MAX_MINOR = 1023
MIN_MEMORY_MIB = 1024
MAX_MEMORY_MIB = 4 * 1024 * 1024
UUID = re.compile(
    r"^(?:[A-Za-z][A-Za-z0-9]{0,7}-)?"
    r"(?:[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}|[0-9a-fA-F]{32})$"
)
SHOWN = 3  # examples named per problem


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 48 else text[:45] + "...'"


def identity_problems(items: Sequence[tuple[int, str, int]], what: str) -> list[str]:
    """(minor, uuid, memory MiB) triples -> problems, each naming a few examples."""
    problems: list[str] = []
    bad_uuid = [u for _, u, _ in items if not UUID.match(u)]
    if bad_uuid:
        problems.append(
            f"{what}: {len(bad_uuid)} of {len(items)} UUIDs do not look like UUIDs "
            f"(e.g. {', '.join(_short(u) for u in bad_uuid[:SHOWN])})"
        )
    minors = [m for m, _, _ in items]
    out_of_range = [m for m in minors if not 0 <= m <= MAX_MINOR]
    if out_of_range:
        problems.append(f"{what}: minors out of range 0..{MAX_MINOR}: {out_of_range[:SHOWN]}")
    duplicates = sorted({m for m in minors if minors.count(m) > 1})
    if duplicates:
        problems.append(f"{what}: minors are not unique (repeated: {duplicates[:SHOWN]})")
    bad_memory = [mib for _, _, mib in items if not MIN_MEMORY_MIB <= mib <= MAX_MEMORY_MIB]
    if bad_memory:
        problems.append(f"{what}: memory sizes outside {MIN_MEMORY_MIB}..{MAX_MEMORY_MIB} MiB: {bad_memory[:SHOWN]}")
    return problems


def card_problems(cards: Sequence[Card]) -> list[str]:
    """What is implausible about one ListAndWatch push (empty = plausible)."""
    if not cards:
        return []
    problems = identity_problems([(c.minor, c.uuid, c.memory_mib) for c in cards], "ListAndWatch")
    unreadable = [c for c in cards if c.health_reason.startswith(HEALTH_UNREADABLE)]
    if unreadable:
        problems.append(
            f"ListAndWatch: {len(unreadable)} of {len(cards)} cards have no known health word "
            f"({unreadable[0].health_reason})"
        )
    with_topology = [c for c in cards if c.topology.error or c.topology.levels]
    broken = [c for c in with_topology if c.topology.error]
    if with_topology and len(broken) == len(with_topology) and len(broken) > 1:
        problems.append(f"ListAndWatch: no card's topology JSON parses ({broken[0].topology.error})")
    return problems


def facts_problems(facts: Sequence[GpuFacts]) -> list[str]:
    """What is implausible about one ListGpuInfo answer (empty = plausible)."""
    if not facts:
        return []
    return identity_problems([(f.minor, f.uuid, f.memory_mib) for f in facts], "ListGpuInfo")


def has_evidence(request: GrantRequest, grant: Grant) -> bool:
    if grant.devices or grant.envs or grant.device_nodes or grant.mounts or grant.cdi_devices:
        return True
    return any(request.annotations.get(key) != value for key, value in grant.annotations.items())


def grant_problem(request: GrantRequest, grant: Grant, unknown_varints: Sequence[str] = ()) -> str | None:
    """Why ``grant`` does not answer ``request``, or None when it does."""
    hint = (
        f"; unknown varint field(s) that may carry an error code: {', '.join(unknown_varints)}"
        if unknown_varints
        else ""
    )
    if grant.grant_id and grant.grant_id != request.grant_id:
        return f"XDM answered for allocation {grant.grant_id!r}, not {request.grant_id!r}{hint}"
    if not has_evidence(request, grant):
        return f"XDM reported success for allocation {request.grant_id} but granted nothing{hint}"
    if not grant.devices:
        return None  # annotation/env-only style: nothing per card to compare
    asked = sorted(ask.minor for ask in request.asks)
    got = sorted(dev.minor for dev in grant.devices)
    if asked != got:
        return f"XDM granted card(s) {got} but {asked} were requested{hint}"
    by_minor = {dev.minor: dev for dev in grant.devices}
    for ask in request.asks:
        problem = _amount_problem(ask, by_minor[ask.minor])
        if problem:
            return problem + hint
    return None


def _amount_problem(ask: DeviceAsk, dev: GrantedDevice) -> str | None:
    wanted = (ask.core, ask.memory_gib, ask.slices)
    granted = (dev.core, dev.memory_gib, dev.slices)
    if wanted == granted:
        return None
    return (
        f"card {ask.minor}: asked core={ask.core}% memory={ask.memory_gib}GiB slice={ask.slices}, "
        f"XDM granted core={dev.core}% memory={dev.memory_gib}GiB slice={dev.slices}"
    )
