"""Grant verification (R3, R4): trust an Allocate answer only on positive evidence.

A success response ``{status: 0, message: ""}`` is zero bytes on the wire and
parses as "success" into any message, so a schema mismatch can make a refusal
look like success (R3); and "minor left empty" may be read as auto-assign
(R4). The rules, all pure:

1. evidence: granted devices, or envs / device nodes / mounts / CDI names, or
   annotations XDM added (echoed request annotations do not count);
2. the granted minors equal the requested ones (as a multiset);
3. per card, core / memory / slice equal the request;
4. an echoed grant id equals ours.

Unknown varint fields on the response are named in the problem text as a
possible error code (R3). The caller releases the grant at once on a problem.
"""

from __future__ import annotations

from collections.abc import Sequence

from nomad_plugin.model.grant import DeviceAsk, Grant, GrantedDevice, GrantRequest


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
