"""Exponential backoff with jitter: XDM's documented reconnect rule.

The XDM reference asks clients to resubscribe after 1 s, doubling, capped at
30 s. Jitter (full range ±``jitter`` of the delay) keeps many plugins from
reconnecting in lock-step after an XDM restart.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field


@dataclass
class Backoff:
    initial: float = 1.0
    factor: float = 2.0
    cap: float = 30.0
    jitter: float = 0.2
    rng: random.Random = field(default_factory=random.Random)
    attempt: int = 0

    def base_delay(self, attempt: int) -> float:
        """The un-jittered delay before retry number ``attempt`` (0-based)."""
        return float(min(self.cap, self.initial * (self.factor**attempt)))

    def next_delay(self) -> float:
        base = self.base_delay(self.attempt)
        self.attempt += 1
        spread = base * self.jitter
        return float(max(0.0, min(self.cap, base + self.rng.uniform(-spread, spread))))

    def reset(self) -> None:
        self.attempt = 0
