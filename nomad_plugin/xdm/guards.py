"""Whether to trust what XDM answered: plausibility of decoded data (R2), evidence of a grant (R3, R4).

A schema that is wrong but wire-compatible decodes *silently* into wrong values: a PCI
address where the UUID belongs, a minor where the memory size belongs. The plausibility
checks are loose enough for any real card (a UUID with an optional short prefix, minors in
0..1023, 1 GiB..4 TiB of memory, a readable health word, topology JSON that parses on some
card) and each failure is phrased for the "XDM schema mismatch: ..." finding.

An Allocate success ``{status: 0, message: ""}`` is zero bytes on the wire and parses as
success into any message, so a grant counts only with positive evidence, matching the
request card for card; the caller releases it at once otherwise.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from nomad_plugin.model.card import Card
from nomad_plugin.model.grant import Grant, GrantRequest
from nomad_plugin.xdm.adapter import GpuFacts
from nomad_plugin.xdm.guesses import HEALTH_UNREADABLE

MAX_MINOR = 1023
MIN_MEMORY_MIB = 1024
MAX_MEMORY_MIB = 4 * 1024 * 1024
UUID = re.compile(
    r"^(?:[A-Za-z][A-Za-z0-9]{0,7}-)?"
    r"(?:[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}|[0-9a-fA-F]{32})$"
)
SHOWN = 3  # examples named per problem


def _short(value: object) -> str:
    shown = repr(value)
    return shown if len(shown) <= 48 else shown[:45] + "...'"


def _identity_problems(items: Sequence[tuple[int, str, int]], what: str) -> list[str]:
    """(minor, uuid, memory MiB) triples -> problems, each naming a few examples."""
    problems = []
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
    problems = _identity_problems([(c.minor, c.uuid, c.memory_mib) for c in cards], "ListAndWatch")
    unreadable = [c for c in cards if c.health_reason.startswith(HEALTH_UNREADABLE)]
    if unreadable:
        problems.append(
            f"ListAndWatch: {len(unreadable)} of {len(cards)} cards have no known health word "
            f"({unreadable[0].health_reason})"
        )
    with_topology = [c for c in cards if c.topology.error or c.topology.levels]
    broken = [c for c in with_topology if c.topology.error]
    if len(broken) == len(with_topology) > 1:  # one bad card only loses its topology (R9)
        problems.append(f"ListAndWatch: no card's topology JSON parses ({broken[0].topology.error})")
    return problems


def facts_problems(facts: Sequence[GpuFacts]) -> list[str]:
    """What is implausible about one ListGpuInfo answer (empty = plausible)."""
    return _identity_problems([(f.minor, f.uuid, f.memory_mib) for f in facts], "ListGpuInfo") if facts else []


def grant_problem(request: GrantRequest, grant: Grant, error_code_hints: Sequence[str] = ()) -> str | None:
    """Why ``grant`` does not answer ``request``, or None when it does.

    Evidence is granted devices, envs, device nodes, mounts, CDI names, or annotations XDM
    added (echoed request annotations do not count). Granted minors must equal the requested
    ones, each card's core/memory/slice the request's, an echoed id ours.
    """
    hint = f"; unknown varint field(s) that may carry an error code: {', '.join(error_code_hints)}"
    hint = hint if error_code_hints else ""
    if grant.grant_id and grant.grant_id != request.grant_id:
        return f"XDM answered for allocation {grant.grant_id!r}, not {request.grant_id!r}{hint}"
    added = any(request.annotations.get(key) != value for key, value in grant.annotations.items())
    if not (grant.devices or grant.envs or grant.device_nodes or grant.mounts or grant.cdi_devices or added):
        return f"XDM reported success for allocation {request.grant_id} but granted nothing{hint}"
    if not grant.devices:
        return None  # annotation/env-only style: nothing per card to compare
    asked = sorted(ask.minor for ask in request.asks)
    got = sorted(dev.minor for dev in grant.devices)
    if asked != got:
        return f"XDM granted card(s) {got} but {asked} were requested{hint}"
    by_minor = {dev.minor: dev for dev in grant.devices}
    for ask in request.asks:
        dev = by_minor[ask.minor]
        if (ask.core, ask.memory_gib, ask.slices) != (dev.core, dev.memory_gib, dev.slices):
            return (
                f"card {ask.minor}: asked core={ask.core}% memory={ask.memory_gib}GiB slice={ask.slices}, "
                f"XDM granted core={dev.core}% memory={dev.memory_gib}GiB slice={dev.slices}{hint}"
            )
    return None
