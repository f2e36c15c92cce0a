"""Which Nomad check-job models, where an older release decides otherwise, and Nomad work not yet released.

The facts come from Nomad's CHANGELOG.md and sources: constraint targets are validated at submission
since 1.11.2 and 1.10.8 Enterprise (GH-27355, ``validateConstraintAttribute``). The feasibility check
sums a device block's count over several device groups since 1.11.0 and 1.10.6 Enterprise (GH-26649,
``DeviceChecker.hasDevices``, scheduler/feasible/feasible.go), but the offer still comes from one group
(``createOffer``), so the verdict is the same before and after; only the reason Nomad reports
differs (filtered for missing devices before, exhausted after). ``share_devices`` (a block
of ``device``) and the ``Shared`` state of a detected device exist only on Nomad's unmerged
GPU-sharing branch (``nmd_1234/gpu-sharing``: api/resources.go ``ShareDevices``,
plugins/device/proto/device.proto ``Shared``): released Nomad's HCL decoder refuses the block, its
JSON decoder drops the field, and the device protocol has no such state.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

MODELLED = "2.0.5"  # the newest release in Nomad's CHANGELOG.md
EDITION_NAMES = {"ce": "Community Edition", "ent": "Enterprise"}
OLDER_TARGETS = (
    "older Nomad: before 1.11.2 (1.10.8 Enterprise) Nomad accepted a constraint whose attribute is no "
    "target it resolves, and then never placed the job"
)
UNRELEASED = (
    "is Nomad's unreleased device-sharing work (not in any release up to {version}): released Nomad has no such {what}"
)
_TARGET_ERRORS = ("unsupported attribute", "is missing an opening brace", "is missing a closing brace")


def modelled(edition: str) -> str:
    return f"check-job models Nomad {MODELLED} {EDITION_NAMES.get(edition, edition)} (--nomad-edition ce|ent)"


def shared_state_notes(saved: Any) -> list[str]:
    """A saved fingerprint whose devices carry a ``shared`` state: named, never read as a verdict."""
    groups = saved.get("groups", []) if isinstance(saved, Mapping) else saved
    found = set()
    for group in groups if isinstance(groups, list) else []:
        devices = group.get("devices") if isinstance(group, Mapping) else None
        for device in devices if isinstance(devices, list) else []:
            if isinstance(device, Mapping) and device.get("shared") not in (None, "", "unset"):
                found.add(f"{group.get('vendor')}/{group.get('type')}/{group.get('name')}")
    if not found:
        return []
    what = "state; check-job ignores it"
    return [f"note: the Shared state of {', '.join(sorted(found))} " + UNRELEASED.format(version=MODELLED, what=what)]


def release_lines(problems: Iterable[str], text: str) -> list[str]:
    """One line for each way an older Nomad would have decided this job differently, and for each
    unreleased Nomad feature the job uses: HCL's decoder refused it above; Nomad's JSON decoder
    (``decodeBody``, command/agent/http.go) drops a field it does not know without a word."""
    problems = list(problems)
    if text.lstrip().startswith("{") and '"ShareDevices"' in text:
        problems.append('named "share_devices"')
    lines = [OLDER_TARGETS] if any(error in p for p in problems for error in _TARGET_ERRORS) else []
    if any('named "share_devices"' in p or '"share_devices" are not expected' in p for p in problems):
        lines.append("note: share_devices " + UNRELEASED.format(version=MODELLED, what="block"))
    return lines
