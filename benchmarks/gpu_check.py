"""GPU check: the NVML backend and the plugin against the real NVIDIA cards of this machine.

Usage::

    .venv/bin/python benchmarks/gpu_check.py --out /tmp/gpu_check [--duration 30] [--budget 280]

Steps (each bounded; the whole run is capped by ``--budget`` seconds and a
watchdog writes what it has if anything hangs):

1. environment: ``nvidia-smi -L``, driver/CUDA, bindings version;
2. standalone: ``NvmlBackend`` directly: inventory (with MIG instances),
   snapshot latency, ``--duration`` seconds of the 1 Hz metrics stream, one
   whole-card grant (plus one MIG grant when MIG instances exist), whether
   the granted device nodes exist on the host;
3. plugin: the plugin executable with ``backend = "nvml"`` driven like Nomad
   drives it: through the Go conformance host (tests/conformance) when Go
   is installed and the host builds, else from Python over go-plugin's gRPC
   socket (handshake, PluginInfo, ConfigSchema, SetConfig, Fingerprint,
   Stats, Reserve, Shutdown). The report says which path ran.

Writes ``gpu_check.json`` and ``gpu_check.md`` into ``--out`` (a directory;
a path ending in .json names the JSON file and the markdown goes next to it).
Exit status: 0 all steps ran and passed, 1 a check failed, 2 NVML missing.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from nomad_plugin.model.grant import DeviceAsk, GrantRequest  # noqa: E402
from nomad_plugin.nvml.backend import NvmlBackend  # noqa: E402
from nomad_plugin.nvml.lib import nvml_unavailable_reason  # noqa: E402

PLUGIN_NAME = "nomad-device-lingjun"
COOKIE_KEY = "NOMAD_PLUGIN_MAGIC_COOKIE"
COOKIE_VALUE = "e4327c2e01eabfd75a8a67adb114fb34a757d57eee7728d857a8cec6e91a7255"


class Clock:
    """The run's deadline: every step asks how much time is left."""

    def __init__(self, budget: float) -> None:
        self.start = time.monotonic()
        self.deadline = self.start + budget

    def left(self, reserve: float = 0.0) -> float:
        return max(0.0, self.deadline - time.monotonic() - reserve)

    def elapsed(self) -> float:
        return time.monotonic() - self.start


def _run(cmd: list[str], timeout: float) -> dict[str, Any]:
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError:
        return {"ok": False, "error": f"{cmd[0]} not found"}
    except subprocess.TimeoutExpired:
        return {"ok": False, "error": f"{cmd[0]} timed out after {timeout:.0f} s"}
    return {
        "ok": proc.returncode == 0,
        "rc": proc.returncode,
        "stdout": proc.stdout[-4000:],
        "stderr": proc.stderr[-2000:],
    }


def environment() -> dict[str, Any]:
    env: dict[str, Any] = {"python": sys.version.split()[0], "platform": platform.platform(), "host": platform.node()}
    env["nvidia_smi"] = _run(["nvidia-smi", "-L"], 20)
    env["go"] = _run(["go", "version"], 10) if shutil.which("go") else {"ok": False, "error": "go not installed"}
    try:
        from importlib.metadata import version

        env["nvidia_ml_py"] = version("nvidia-ml-py")
    except Exception as exc:
        env["nvidia_ml_py"] = f"unknown ({exc})"
    return env


# --- step 2: the backend directly ---------------------------------------------------------


def _card_dict(card: Any) -> dict[str, Any]:
    data = dataclasses.asdict(card)
    data.pop("topology", None)
    return data


def _pct(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def standalone(duration: float, clock: Clock) -> dict[str, Any]:
    out: dict[str, Any] = {"ok": False, "checks": {}}
    checks = out["checks"]
    t0 = time.monotonic()
    backend = NvmlBackend()
    backend.start()
    try:
        ready = backend.wait_ready(min(60.0, clock.left(60)))
        out["ready_seconds"] = round(time.monotonic() - t0, 3)
        inv = backend.inventory()
        checks["inventory_ready"] = ready and inv.reachable
        if not checks["inventory_ready"]:
            out["error"] = inv.unreachable_reason or "NVML did not become ready"
            return out
        out["node"] = dict(inv.node)
        out["cards"] = [_card_dict(c) for c in inv.cards]
        checks["cards_found"] = len(inv.cards) > 0
        checks["pci_bus_ids_normalised"] = all(len(c.pci_bus_id) == 12 for c in inv.cards)
        checks["all_cards_healthy"] = all(c.healthy for c in inv.cards)
        checks["events_watched"] = all(c.extra.get("health_source") == "nvml-events" for c in inv.cards)

        latencies = []
        for _ in range(10):
            s = time.perf_counter()
            samples = backend.metrics_snapshot()
            latencies.append((time.perf_counter() - s) * 1000)
        out["snapshot_ms"] = {
            "min": round(min(latencies), 2),
            "median": round(statistics.median(latencies), 2),
            "p90": round(_pct(latencies, 0.9), 2),
            "max": round(max(latencies), 2),
        }
        out["samples_per_snapshot"] = len(samples)
        out["metric_names"] = sorted({s.name for s in samples})

        out["stream"] = _stream(backend, min(duration, clock.left(90)))
        checks["stream_rate_ok"] = out["stream"]["batches"] >= max(1, int(out["stream"]["seconds"] * 0.8))

        out["grants"] = _grants(backend, inv)
        checks["grant_ok"] = all(g.get("ok") for g in out["grants"])
        out["ok"] = all(checks.values())
        return out
    except Exception as exc:
        out["error"] = f"{type(exc).__name__}: {exc}"
        return out
    finally:
        s = time.monotonic()
        backend.stop()
        out["stop_seconds"] = round(time.monotonic() - s, 3)


def _stream(backend: NvmlBackend, seconds: float) -> dict[str, Any]:
    cancel = threading.Event()
    timer = threading.Timer(seconds, cancel.set)
    timer.start()
    per_card: dict[str, dict[str, list[float]]] = {}
    gaps: list[float] = []
    batches = 0
    last = time.monotonic()
    start = last
    try:
        for batch in backend.metrics_stream(cancel):
            now = time.monotonic()
            if batches:
                gaps.append(now - last)
            last = now
            batches += 1
            for s in batch:
                per_card.setdefault(s.device, {}).setdefault(s.name, []).append(s.value)
    finally:
        timer.cancel()
    summary = {
        dev: {name: {"min": min(v), "max": max(v), "last": v[-1]} for name, v in sorted(m.items())}
        for dev, m in per_card.items()
    }
    return {
        "seconds": round(time.monotonic() - start, 2),
        "batches": batches,
        "gap_seconds": {"median": round(statistics.median(gaps), 3), "max": round(max(gaps), 3)} if gaps else {},
        "readings": summary,
    }


def _grants(backend: NvmlBackend, inv: Any) -> list[dict[str, Any]]:
    results = []
    card = inv.cards[0]
    requests = [("whole card", GrantRequest("gpu-check-whole", (DeviceAsk(minor=card.minor),)))]
    mig_card = next((c for c in inv.cards if c.mig_instances), None)
    if mig_card is not None:
        mig = mig_card.mig_instances[0]
        requests.append(
            (
                f"MIG {mig.profile}",
                GrantRequest(
                    "gpu-check-mig",
                    (
                        DeviceAsk(
                            minor=mig_card.minor,
                            slices=mig.slices,
                            memory_gib=mig.memory_mib // 1024,
                            mig_uuid=mig.uuid,
                        ),
                    ),
                ),
            )
        )
    for label, request in requests:
        entry: dict[str, Any] = {"what": label}
        try:
            s = time.perf_counter()
            grant = backend.allocate(request)
            entry["ms"] = round((time.perf_counter() - s) * 1000, 2)
            entry["envs"] = dict(grant.envs)
            entry["device_nodes"] = [
                {"path": n.container_path, "host_path": n.host_path, "exists": os.path.exists(n.host_path)}
                for n in grant.device_nodes
            ]
            entry["ok"] = bool(grant.envs.get("NVIDIA_VISIBLE_DEVICES")) and all(
                n["exists"] for n in entry["device_nodes"]
            )
            backend.release(request.grant_id)
        except Exception as exc:
            entry["ok"] = False
            entry["error"] = f"{type(exc).__name__}: {exc}"
        results.append(entry)
    return results


# --- step 3: the plugin, driven like Nomad ----------------------------------------------------


def _plugin_wrapper(tmp: Path) -> Path:
    """An executable that runs this checkout's plugin with this interpreter."""
    wrapper = tmp / PLUGIN_NAME
    wrapper.write_text(
        f'#!/bin/sh\nPYTHONPATH="{REPO}${{PYTHONPATH:+:$PYTHONPATH}}" exec "{sys.executable}" -m nomad_plugin "$@"\n'
    )
    wrapper.chmod(0o755)
    return wrapper


def _plugin_hcl(tmp: Path) -> Path:
    path = tmp / "agent.hcl"
    path.write_text(
        f'plugin "{PLUGIN_NAME}" {{\n  config {{\n    backend = "nvml"\n'
        f'    data_dir = "{tmp / "data"}"\n    reconcile = false\n  }}\n}}\n'
    )
    return path


def plugin_conformance(duration: float, clock: Clock, tmp: Path) -> dict[str, Any]:
    """Build tests/conformance's Go host and run the plugin under it."""
    out: dict[str, Any] = {"path": "conformance-host", "ok": False}
    build_timeout = min(240.0, clock.left(duration + 60))
    if build_timeout < 20:
        out["error"] = "no time left to build the conformance host"
        return out
    s = time.monotonic()
    build = _run([sys.executable, str(REPO / "tests" / "conformance" / "build.py")], build_timeout)
    out["build_seconds"] = round(time.monotonic() - s, 1)
    binary = REPO / "tests" / "conformance" / "bin" / "conformance-host"
    if not build["ok"] or not binary.exists():
        out["error"] = "conformance host did not build: " + (build.get("error") or build.get("stderr", "")[-800:])
        return out
    args = [
        str(binary),
        "--plugin",
        str(_plugin_wrapper(tmp)),
        "--config",
        str(_plugin_hcl(tmp)),
        "--phase",
        "all",
        "--duration",
        str(duration),
        "--stats-interval",
        "1",
        "--reserve-count",
        "1",
        "--expect-reserve",
        "ok",
        "--first-fp-timeout",
        "60",
    ]
    env = {k: v for k, v in os.environ.items() if k != COOKIE_KEY}
    try:
        proc = subprocess.run(
            args, capture_output=True, text=True, timeout=min(duration + 120, clock.left(10)), env=env, cwd=REPO
        )
    except subprocess.TimeoutExpired:
        out["error"] = "conformance host timed out"
        return out
    events = [json.loads(line) for line in proc.stdout.splitlines() if line.strip().startswith("{")]
    fps = [e for e in events if e.get("event") == "fingerprint"]
    stats = [e for e in events if e.get("event") == "stats"]
    reserves = [e for e in events if e.get("event") == "reserve"]
    out.update(
        returncode=proc.returncode,
        fingerprints=len(fps),
        devices=fps[-1]["n_devices"] if fps else 0,
        groups=fps[-1].get("groups") if fps else None,
        stats_messages=len(stats),
        stats_instances=stats[-1].get("n_instances") if stats else 0,
        reserve=reserves[-1] if reserves else None,
        violations=[e for e in events if e.get("event") == "violation"],
        summary=next((e for e in reversed(events) if e.get("event") == "summary"), None),
        stderr_tail=proc.stderr[-3000:],
    )
    out["ok"] = proc.returncode == 0 and out["devices"] > 0 and bool(reserves and reserves[-1].get("ok"))
    return out


def plugin_grpc(duration: float, clock: Clock, tmp: Path, why: str) -> dict[str, Any]:
    """No Go: launch the plugin as go-plugin would (nomad_plugin.launcher) and call it over its socket."""
    from nomad_plugin.launcher.config import full_config, msgpack_config
    from nomad_plugin.launcher.process import LaunchError, PluginProcess

    out: dict[str, Any] = {"path": f"python-grpc ({why})", "ok": False}
    plugin = PluginProcess([str(_plugin_wrapper(tmp))], handshake_timeout=min(60.0, clock.left(30)))
    try:
        hs = plugin.start()
        out["handshake"] = f"1|2|unix|{hs.address}|grpc"
        out["handshake_seconds"] = round(hs.seconds, 3)
        info = plugin.plugin_info()
        out["plugin_info"] = {"name": info.name, "version": info.version, "api": list(info.api_versions)}
        plugin.config_schema()
        config = full_config({"backend": "nvml", "data_dir": str(tmp / "data"), "reconcile": False})
        plugin.set_config(msgpack_config(config))
        fingerprints = plugin.fingerprint()
        if fingerprints.wait_for(lambda groups: True, timeout=min(60.0, clock.left(20))) is None:
            out["error"] = "no first fingerprint within 60 s"
            return out
        stats = plugin.stats(interval=1.0)
        # Wait for a fingerprint with healthy devices (the backend may still be starting).
        fingerprints.wait_for(lambda groups: bool(_healthy_ids(groups)), timeout=min(20.0, clock.left(20)))
        last = fingerprints.latest or []
        out["fingerprints"] = len(fingerprints)
        out["groups"] = [
            {"name": g.full_name, "devices": len(g.devices), "healthy": sum(1 for d in g.devices if d.healthy)}
            for g in last
        ]
        out["devices"] = sum(len(g.devices) for g in last)
        ids = _healthy_ids(last)[:1]
        if ids:
            s = time.perf_counter()
            res = plugin.reserve(ids)
            out["reserve"] = {
                "ids": ids,
                "ms": round((time.perf_counter() - s) * 1000, 2),
                "envs": res.envs,
                "devices": [host for _, host, _ in res.devices],
                "ok": True,
            }
        else:
            out["reserve"] = {"ok": False, "error": "no healthy device fingerprinted"}
        time.sleep(min(duration, clock.left(15)))
        out["stats_messages"] = len(stats)
        out["ok"] = out["devices"] > 0 and out["reserve"].get("ok", False) and len(stats) > 0
        return out
    except LaunchError as exc:
        out["error"] = str(exc)
        return out
    except Exception as exc:
        out["error"] = f"{type(exc).__name__}: {exc}"
        return out
    finally:
        out["exit_code"] = plugin.shutdown()
        out["stderr_tail"] = "\n".join(plugin.stderr)[-3000:]


def _healthy_ids(groups: Any) -> list[str]:
    return [d.id for g in groups for d in g.devices if d.healthy]


# --- report ------------------------------------------------------------------------------------


def markdown(report: dict[str, Any]) -> str:
    lines = ["# GPU check", "", f"- host: {report['env'].get('host')} ({report['env'].get('platform')})"]
    smi = report["env"].get("nvidia_smi", {})
    lines.append(f"- nvidia-smi -L: {'ok' if smi.get('ok') else smi.get('error', 'failed')}")
    lines.append(f"- total seconds: {report.get('seconds')}; result: **{'PASS' if report.get('ok') else 'FAIL'}**")
    if report.get("error"):
        lines += ["", f"**Error:** {report['error']}"]
    sa = report.get("standalone") or {}
    if sa:
        lines += ["", "## Standalone NVML backend", ""]
        lines.append(f"- ready after {sa.get('ready_seconds')} s; node facts: {sa.get('node')}")
        lines += ["", "| minor | model | memory MiB | PCI | NUMA | MIG | healthy |", "|---|---|---|---|---|---|---|"]
        for c in sa.get("cards", []):
            migs = ", ".join(m["profile"] for m in c["mig_instances"]) or "-"
            lines.append(
                f"| {c['minor']} | {c['model']} | {c['memory_mib']} | {c['pci_bus_id']} | {c['numa_node']} | {migs} | "
                f"{c['healthy']} {c['health_reason']} |"
            )
        lines += ["", f"- snapshot latency ms: {sa.get('snapshot_ms')} ({sa.get('samples_per_snapshot')} samples)"]
        st = sa.get("stream", {})
        lines.append(f"- stream: {st.get('batches')} batches in {st.get('seconds')} s; gaps {st.get('gap_seconds')}")
        for g in sa.get("grants", []):
            lines.append(f"- grant {g['what']}: ok={g['ok']} envs={g.get('envs')} error={g.get('error', '')}")
            for n in g.get("device_nodes", []):
                lines.append(f"  - {n['path']} -> {n['host_path']} exists={n['exists']}")
        lines.append(f"- checks: {sa.get('checks')}")
        if sa.get("error"):
            lines.append(f"- error: {sa['error']}")
    pl = report.get("plugin") or {}
    if pl:
        lines += ["", f"## Plugin over go-plugin ({pl.get('path')})", ""]
        for key in (
            "ok",
            "returncode",
            "handshake",
            "fingerprints",
            "devices",
            "groups",
            "stats_messages",
            "reserve",
            "error",
        ):
            if key in pl:
                lines.append(f"- {key}: `{json.dumps(pl[key], default=str)[:600]}`")
        if pl.get("violations"):
            lines.append(f"- violations: `{json.dumps(pl['violations'])[:1500]}`")
    return "\n".join(lines) + "\n"


def write(report: dict[str, Any], out: Path) -> tuple[Path, Path]:
    if out.suffix == ".json":
        json_path, md_path = out, out.with_suffix(".md")
    else:
        out.mkdir(parents=True, exist_ok=True)
        json_path, md_path = out / "gpu_check.json", out / "gpu_check.md"
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(report, indent=2, default=str))
    md_path.write_text(markdown(report))
    return json_path, md_path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, type=Path, help="report directory (or a .json path)")
    parser.add_argument("--duration", type=float, default=30.0, help="seconds of stats per step (default 30)")
    parser.add_argument("--budget", type=float, default=280.0, help="hard cap on the whole run in seconds")
    parser.add_argument(
        "--plugin-path",
        choices=("auto", "conformance", "grpc", "none"),
        default="auto",
        help="how to drive the plugin: the Go conformance host, Python over gRPC, or skip",
    )
    args = parser.parse_args(argv)
    clock = Clock(args.budget)
    report: dict[str, Any] = {"ok": False, "started_unix": time.time(), "args": vars(args) | {"out": str(args.out)}}

    def watchdog() -> None:
        report["error"] = f"watchdog: the run exceeded its budget of {args.budget:.0f} s; partial report"
        report["seconds"] = round(clock.elapsed(), 1)
        write(report, args.out)
        print(report["error"], file=sys.stderr)
        os._exit(3)

    dog = threading.Timer(args.budget + 20, watchdog)
    dog.daemon = True
    dog.start()

    report["env"] = environment()
    why = nvml_unavailable_reason()
    if why:
        report["error"] = f"NVML is not usable on this machine: {why}"
        report["seconds"] = round(clock.elapsed(), 1)
        paths = write(report, args.out)
        print(f"gpu_check: {report['error']}\nreport: {paths[0]}", file=sys.stderr)
        return 2
    print(f"gpu_check: standalone NVML backend ({args.duration:.0f} s of stats)...", file=sys.stderr)
    report["standalone"] = standalone(args.duration, clock)
    ok = bool(report["standalone"].get("ok"))
    if args.plugin_path != "none":
        use_go = args.plugin_path == "conformance" or (args.plugin_path == "auto" and shutil.which("go"))
        with tempfile.TemporaryDirectory(prefix="gpuchk") as tmp:
            print(f"gpu_check: plugin via {'conformance host' if use_go else 'Python gRPC'}...", file=sys.stderr)
            if use_go:
                report["plugin"] = plugin_conformance(args.duration, clock, Path(tmp))
                if not report["plugin"]["ok"] and "did not build" in str(report["plugin"].get("error", "")):
                    failed_build = report["plugin"]
                    report["plugin"] = plugin_grpc(args.duration, clock, Path(tmp), "conformance host did not build")
                    report["plugin"]["conformance_attempt"] = failed_build
            else:
                why = "asked for" if args.plugin_path == "grpc" else "Go is not installed"
                report["plugin"] = plugin_grpc(args.duration, clock, Path(tmp), why)
        ok = ok and bool(report["plugin"].get("ok"))
    report["ok"] = ok
    report["seconds"] = round(clock.elapsed(), 1)
    dog.cancel()
    json_path, md_path = write(report, args.out)
    print(
        f"gpu_check: {'PASS' if ok else 'FAIL'} in {report['seconds']} s; report: {json_path} {md_path}",
        file=sys.stderr,
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
