"""The drop-in comparison on a real GPU node: nomad-device-nvidia, restated, against the plugin, on real NVML.

CI runs the same comparison on the NVML double (tests/nvml/test_dropin_compare.py).
Here the restated official plugin (tests/nvml/official_oracle.py) reads the node's
own NVML through ``pynvml``, the plugin (``--plugin``, e.g. the shipped
dist/nomad-device-lingjun) runs with ``backend = "nvml"`` under the Go conformance
host, and every item that differs is listed with the decision that explains it,
or as undocumented: those are the readings the double could not predict (for
example the deprecated ECC call answering NotSupported on a card whose
per-location counters work). Run by benchmarks/device_run.sh; writes
``dropin_compare.json`` and prints a summary.

    python3 benchmarks/dropin_compare.py --host tests/conformance/bin/conformance-host \\
        --plugin dist/nomad-device-lingjun --out /tmp/evidence
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.nvml.dropin import Scenario, compare, expected, run_plugin, summarize  # noqa: E402


def _groups_first(groups: list[dict]) -> list[str]:  # type: ignore[type-arg]
    """Every device of the largest group, last UUID first (Reserve keeps the order asked)."""
    return [d["id"] for d in max(groups, key=lambda g: len(g["devices"]))["devices"]][::-1] if groups else []


def main(argv: list[str] | None = None) -> int:
    args = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    args.add_argument("--host", required=True, help="the built conformance host")
    args.add_argument("--plugin", help="the plugin executable (default: the one next to this Python)")
    args.add_argument("--out", default=".", help="directory for dropin_compare.json")
    opts = args.parse_args(argv)
    import pynvml

    pynvml.nvmlInit()
    try:
        memory_is_host = False
        for index in range(pynvml.nvmlDeviceGetCount()):
            try:
                pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(index))
            except pynvml.NVMLError:
                memory_is_host = True
        scenario = Scenario("this node", [], reserves=[_groups_first, lambda g: _groups_first(g)[-1:]])
        want = expected(scenario, nvml=pynvml)
    finally:
        pynvml.nvmlShutdown()
    plugin = Path(opts.plugin).resolve() if opts.plugin else None
    got = run_plugin(scenario, Path(opts.host).resolve(), want, plugin=plugin, real_nvml=True)
    items = compare(scenario, want, got, host_memory=memory_is_host)
    summary = summarize(items)
    differing = [
        {"what": i.what, "official": i.expected, "ours": i.got, "decision": i.decision or "UNDOCUMENTED"}
        for i in items
        if not i.matches
    ]
    out = Path(opts.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "dropin_compare.json").write_text(
        json.dumps({"summary": summary, "differing": differing, "official_error": want.fingerprint.error}, indent=1)
    )
    print(f"items {summary['items']}, match {summary['match']}, documented {summary['documented']}")
    for entry in differing:
        print(f"  {entry['decision']}: {entry['what']}: official {entry['official']!r}, ours {entry['ours']!r}"[:400])
    return 1 if summary["undocumented"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
