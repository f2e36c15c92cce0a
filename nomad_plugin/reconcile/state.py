"""``<data_dir>/reconciler-state.json``: what the running reconciler knows, for ``grants``.

Written atomically (temp file + rename) after each observation. It holds the
claims (grant -> allocation last seen live holding it), the wall time at
which each orphaned grant will be released, the view's completeness and the
last allocation list. A restarted plugin reads the claims back: they are the
evidence that lets it release a grant whose allocation ended while it was
down, even with an incomplete view. It is a cache, never the source of
truth: a missing or unreadable file means "nothing known".
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nomad_plugin.reconcile.decide import Claim
from nomad_plugin.reconcile.nomad_api import AllocView

FILE_NAME = "reconciler-state.json"
VERSION = 1


@dataclass
class ReconcilerState:
    updated_at: float  # unix seconds
    grace: float
    view_complete: bool
    view_reason: str
    claims: dict[str, Claim] = field(default_factory=dict)
    release_at: dict[str, float] = field(default_factory=dict)  # grant id -> unix seconds
    unverifiable: list[str] = field(default_factory=list)
    allocs: list[AllocView] = field(default_factory=list)
    leaked: list[str] = field(default_factory=list)  # live allocation ids using our devices without a grant
    pid: int = field(default_factory=os.getpid)

    def to_json(self) -> dict[str, Any]:
        return {
            "version": VERSION,
            "pid": self.pid,
            "updated_at": self.updated_at,
            "grace": self.grace,
            "view_complete": self.view_complete,
            "view_reason": self.view_reason,
            "claims": {
                g: {"alloc_id": c.alloc_id, "namespace": c.namespace, "job": c.job} for g, c in self.claims.items()
            },
            "release_at": self.release_at,
            "unverifiable": self.unverifiable,
            "leaked": self.leaked,
            "allocs": [
                {
                    "id": a.id,
                    "namespace": a.namespace,
                    "job": a.job,
                    "client_status": a.client_status,
                    "modify_time": a.modify_time,
                    "device_ids": sorted(a.device_ids),
                }
                for a in self.allocs
            ],
        }

    @classmethod
    def from_json(cls, raw: Any) -> ReconcilerState:
        if not isinstance(raw, dict) or raw.get("version") != VERSION:
            raise ValueError("not a reconciler state of version 1")
        return cls(
            pid=int(raw["pid"]),
            updated_at=float(raw["updated_at"]),
            grace=float(raw["grace"]),
            view_complete=bool(raw["view_complete"]),
            view_reason=str(raw["view_reason"]),
            claims={
                str(g): Claim(str(c["alloc_id"]), str(c["namespace"]), str(c["job"]))
                for g, c in dict(raw["claims"]).items()
            },
            release_at={str(g): float(t) for g, t in dict(raw["release_at"]).items()},
            unverifiable=[str(g) for g in raw["unverifiable"]],
            leaked=[str(a) for a in raw.get("leaked", [])],
            allocs=[
                AllocView(
                    id=str(a["id"]),
                    client_status=str(a["client_status"]),
                    device_ids=frozenset(str(d) for d in a["device_ids"]),
                    namespace=str(a["namespace"]),
                    job=str(a["job"]),
                    modify_time=float(a["modify_time"]),
                )
                for a in raw["allocs"]
            ],
        )


def state_path(data_dir: str | os.PathLike[str]) -> Path:
    return Path(data_dir) / FILE_NAME


def save_state(path: Path, state: ReconcilerState) -> None:
    data = json.dumps(state.to_json(), sort_keys=True).encode()
    tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def load_state(path: Path) -> ReconcilerState | None:
    """The saved state, or None when there is none or it cannot be read."""
    try:
        return ReconcilerState.from_json(json.loads(path.read_bytes()))
    except (OSError, ValueError, KeyError, TypeError):
        return None
