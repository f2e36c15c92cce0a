"""Health verdicts for Nomad: hysteresis, backend outages and mode conflicts.

Nomad never assigns an unhealthy instance but keeps it visible, so health is
how the plugin says "not now" without wiping the node (an error on the
Fingerprint stream would drop the plugin until the agent restarts):

- a card the backend calls unhealthy is unhealthy at once; it becomes
  eligible again only after ``recovery_checks`` consecutive healthy
  observations OR ``recovery_delay`` seconds of continuous health, so a
  flapping card does not attract and kill allocations;
- while the backend is unreachable every instance is unhealthy with a
  description that says why and since when; recovery is automatic;
- an instance blocked by grants in another mode (a whole card while shares
  of it are granted, shares of a card held whole, MIG units of a card used
  otherwise) is unhealthy with the reason, so Nomad cannot double-book it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone

from nomad_plugin.model.instances import Catalog, Kind

Clock = Callable[[], float]


@dataclass(frozen=True)
class Verdict:
    healthy: bool
    description: str = ""


HEALTHY = Verdict(True)


@dataclass
class _CardState:
    eligible: bool
    reason: str = ""
    ok_count: int = 0
    ok_since: float | None = None


class HealthTracker:
    """Per-card hysteresis over raw backend health (thread-safe).

    ``observe`` counts one observation per backend report; ``verdicts`` may be
    called any time (it applies time-based recovery without counting one).
    """

    def __init__(self, recovery_checks: int = 3, recovery_delay: float = 30.0, clock: Clock = time.monotonic) -> None:
        self.recovery_checks = max(1, recovery_checks)
        self.recovery_delay = max(0.0, recovery_delay)
        self._clock = clock
        self._states: dict[str, _CardState] = {}
        self._lock = threading.Lock()

    def observe(self, raw: Mapping[str, tuple[bool, str]]) -> None:
        """One backend report: card key -> (healthy, reason). Absent keys are forgotten."""
        now = self._clock()
        with self._lock:
            for key, (healthy, reason) in raw.items():
                state = self._states.get(key)
                if not healthy:
                    self._states[key] = _CardState(False, reason.strip() or "reported unhealthy")
                elif state is None or state.eligible:
                    self._states[key] = _CardState(True)
                else:
                    state.ok_count += 1
                    if state.ok_since is None:
                        state.ok_since = now
                    self._maybe_recover(state, now)
            for key in [k for k in self._states if k not in raw]:
                del self._states[key]

    def _maybe_recover(self, state: _CardState, now: float) -> None:
        if state.eligible or state.ok_since is None:
            return
        if state.ok_count >= self.recovery_checks or now - state.ok_since >= self.recovery_delay:
            state.eligible, state.reason, state.ok_count, state.ok_since = True, "", 0, None

    def _describe(self, state: _CardState) -> str:
        if state.ok_since is None:
            return state.reason
        return (
            f"recovering from: {state.reason} (healthy {state.ok_count}/{self.recovery_checks} checks; "
            f"eligible after {self.recovery_checks} checks or {self.recovery_delay:g}s healthy)"
        )

    def verdicts(self) -> dict[str, Verdict]:
        """Current verdict per card key, after time-based recovery."""
        now = self._clock()
        with self._lock:
            out: dict[str, Verdict] = {}
            for key, state in self._states.items():
                self._maybe_recover(state, now)
                out[key] = HEALTHY if state.eligible else Verdict(False, self._describe(state))
            return out

    def next_deadline(self) -> float | None:
        """Clock time at which a recovering card becomes eligible by delay (None if none)."""
        with self._lock:
            times = [s.ok_since + self.recovery_delay for s in self._states.values() if s.ok_since is not None]
        return min(times) if times else None


def iso_time(unix_seconds: float) -> str:
    """``2026-10-10T08:00:00Z``: how descriptions say *since when*."""
    stamp = datetime.fromtimestamp(unix_seconds, tz=timezone.utc).isoformat(timespec="seconds")
    return stamp.replace("+00:00", "Z")


def outage_verdict(backend: str, reason: str, since_unix: float) -> Verdict:
    detail = f": {reason.strip()}" if reason.strip() else ""
    return Verdict(False, f"{backend} unreachable since {iso_time(since_unix)}{detail}")


_KIND_USE = {
    Kind.WHOLE: "held whole",
    Kind.SHARE: "has tdm shares granted",
    Kind.MIG: "has MIG slices granted",
    Kind.MIG_INSTANCE: "has MIG instances granted",
}


def conflict_reasons(catalog: Catalog, grants: Mapping[str, frozenset[Kind]]) -> dict[str, str]:
    """Instance ID -> why grants in another mode block it (card uuid -> granted kinds)."""
    reasons: dict[str, str] = {}
    for card, granted in grants.items():
        instances, kinds = catalog.on_card(card)
        if len(granted) == 1 and kinds <= granted:
            continue  # one mode granted and every instance on the card is of it: the common case, O(1)
        for inst in instances:
            others = granted - {inst.kind}
            if others:
                uses = " and ".join(_KIND_USE[k] for k in sorted(others, key=lambda k: k.value))
                reasons[inst.id] = f"card {inst.minor} {uses} (another mode); unavailable as {inst.kind.value}"
    return reasons


def instance_verdicts(
    catalog: Catalog,
    card_verdicts: Mapping[str, Verdict],
    conflicts: Mapping[str, str],
    outage: Verdict | None = None,
) -> dict[str, Verdict]:
    """Combine outage, card health and conflicts into one verdict per instance ID."""
    out: dict[str, Verdict] = {}
    for group in catalog.groups:
        for inst in group.instances:
            reasons: list[str] = []
            if outage is not None and not outage.healthy:
                reasons.append(outage.description)
            card = card_verdicts.get(inst.card_uuid)
            if card is not None and not card.healthy:
                reasons.append(card.description)
            conflict = conflicts.get(inst.id)
            if conflict:
                reasons.append(conflict)
            out[inst.id] = Verdict(False, "; ".join(reasons)) if reasons else HEALTHY
    return out
