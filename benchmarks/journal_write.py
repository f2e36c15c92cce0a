"""Cost of one durable journal write at 1, 16 and 160 live grants, against an older journal in the same run.

    .venv/bin/python benchmarks/journal_write.py [--writes 200] [--baseline-src DIR]

Each level: fill a fresh journal in /var/tmp (ext4) to N live entries, then
time ``--writes`` changes that keep it at N (put a new entry, remove the
oldest), each durable before it returns. ``--baseline-src DIR`` is a source
tree of another version (e.g. ``git archive f8c551c | tar -x -C DIR``): its
``nomad_plugin.journal`` is loaded from there and timed the same way, the
two alternating level by level, so a busy box slows both alike.
"""

from __future__ import annotations

import argparse
import importlib
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[1]
LEVELS = (1, 16, 160)  # 160: a realistic node, 16 cards x 10 shares


def load_journal(src: Path) -> ModuleType:
    """``nomad_plugin.journal.store`` of the tree at ``src`` (its own copy of the package)."""
    for name in [m for m in sys.modules if m == "nomad_plugin" or m.startswith("nomad_plugin.")]:
        del sys.modules[name]
    sys.path.insert(0, str(src))
    try:
        return importlib.import_module("nomad_plugin.journal.store")
    finally:
        sys.path.remove(str(src))


def entry(mod: ModuleType, n: int) -> object:
    entry_mod = sys.modules.get(mod.__name__.rsplit(".", 1)[0] + ".entry", mod)  # older trees: journal/entry.py
    grant = sys.modules["nomad_plugin.model.grant"]
    return entry_mod.JournalEntry(
        grant_id=f"grant-{n:06d}-7d55e706-fc03-4107-bed0",
        device_ids=(f"PPU-7d55e706-fc03-4107-bed0-{n:06d}-share-{n % 7}",),
        group="alibaba/ppu/PPU M890P share",
        kind="share",
        cards=(f"PPU-7d55e706-fc03-4107-bed0-{n // 7:06d}",),
        asks=(grant.DeviceAsk(minor=n // 7, core=14, memory_gib=20),),
        created_at=1.7e9 + n,
        state=entry_mod.EntryState.GRANTED,
        granted=(grant.GrantedDevice(minor=n // 7, uuid=f"PPU-{n // 7:06d}", core=14, memory_gib=20),),
    )


class Level:
    """One journal kept at ``live`` entries: each timed put of a new entry is followed by an untimed remove."""

    def __init__(self, mod: ModuleType, live: int, writes: int) -> None:
        self.dir = tempfile.mkdtemp(prefix="ljw-", dir="/var/tmp")
        self.journal = mod.Journal(self.dir)
        self.entries = [entry(mod, n) for n in range(live + writes)]
        for e in self.entries[:live]:
            self.journal.put(e)
        self.live = live
        self.done = 0
        self.ms: list[float] = []

    def write(self) -> None:
        new = self.entries[self.live + self.done]
        t0 = time.perf_counter()
        self.journal.put(new)
        self.ms.append((time.perf_counter() - t0) * 1000)
        self.journal.remove(self.entries[self.done].grant_id)
        self.done += 1

    def close(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--writes", type=int, default=200)
    parser.add_argument("--baseline-src", help="source tree of the version to compare with")
    args = parser.parse_args()
    subjects = {"this tree": load_journal(REPO)}
    if args.baseline_src:
        subjects["baseline"] = load_journal(Path(args.baseline_src))
    levels = {(name, live): Level(mod, live, args.writes) for name, mod in subjects.items() for live in LEVELS}
    try:
        # Interleaved in batches of 10 writes, so the disk's busy and quiet moments fall on every level alike.
        for _ in range(0, args.writes, 10):
            for level in levels.values():
                for _ in range(min(10, args.writes - level.done)):
                    level.write()
    finally:
        for level in levels.values():
            level.close()
    results = {key: level.ms for key, level in levels.items()}
    print(f"one durable journal write (put), {args.writes} per level, /var/tmp (ext4)")
    print("| journal | live grants | p50 | p99 |")
    print("|---|---|---|---|")
    for name in subjects:
        for live in LEVELS:
            ms = results[(name, live)]
            print(f"| {name} | {live} | {statistics.median(ms):.2f} ms | {pct(ms, 99):.2f} ms |")
    for name in subjects:
        p50s = [statistics.median(results[(name, live)]) for live in LEVELS]
        print(f"{name}: p50 at {LEVELS[-1]} / at {LEVELS[0]} = x{p50s[-1] / p50s[0]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
