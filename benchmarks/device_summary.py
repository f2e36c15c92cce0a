"""Summarise one conformance-host run (its JSON-lines events) for benchmarks/device_run.sh.

Prints what an operator would check on a real GPU node: the launches' handshake times, the last
fingerprint's groups with every attribute and each device's health and PCI locality, the
Reserve's result, the stat names of the last Stats message with one device's values, and every
violation the host found. Exit status 1 when the host saw a violation or the run found no device.

    python3 benchmarks/device_summary.py host.jsonl
"""

from __future__ import annotations

import json
import sys
from typing import Any


def _events(path: str) -> list[dict[str, Any]]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.startswith("{")]


def _flat(group: dict[str, Any]) -> str:
    return "/".join(str(group.get(k, "?")) for k in ("vendor", "type", "name"))


def summarise(events: list[dict[str, Any]]) -> int:
    """Print the summary; return the exit status."""
    bad = 0
    for e in events:
        kind = e.get("event")
        if kind == "launch":
            print(f"launch {e.get('launch')}: handshake {e.get('handshake_seconds', 0):.3f} s")
        elif kind in ("violation", "error"):
            bad += 1
            print("VIOLATION", json.dumps(e)[:600])
        elif kind == "reserve":
            print(
                "RESERVE", json.dumps({k: e.get(k) for k in ("called", "ok", "error", "ids", "envs", "devices")})[:1200]
            )
        elif kind == "summary":
            found = e.get("violations") or 0
            print("SUMMARY counts", e.get("event_counts"), "violations", found)
            bad += found if isinstance(found, int) else len(found)
    fps = [e for e in events if e.get("event") == "fingerprint" and e.get("groups")]
    if not fps:
        print("NO FINGERPRINT WITH DEVICES")
        return 1
    for g in fps[-1]["groups"]:
        print("GROUP", _flat(g))
        for name, value in sorted((g.get("attributes") or {}).items()):
            print(f"  attr {name} = {value}")
        for d in g.get("devices", []):
            print(
                f"  device {d.get('id')} healthy={d.get('healthy')} pci={d.get('pci_bus_id')} {d.get('health_desc', '')}"
            )
    stats = [e for e in events if e.get("event") == "stats" and e.get("groups")]
    print("stats messages with devices:", len(stats))
    if stats:
        print("LAST STATS", json.dumps(stats[-1]["groups"])[:3000])
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(summarise(_events(sys.argv[1])))
