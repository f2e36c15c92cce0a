"""``nomad-device-lingjun demo``: the plugin end to end on any machine, in under 30 seconds.

An in-process XDM simulator, the plugin launched as Nomad launches it, then what Nomad would show:
the device groups, a Reserve for examples/jobs/whole-card.nomad.hcl (on a node whose cards that job
does not ask for, the same job asking for one of this node's cards), live stats and a card's
health flip and recovery in the fingerprint stream.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from nomad_plugin.cli.common import command_parser, described, fail
from nomad_plugin.jobspec import evaluate_job, parse_job_text
from nomad_plugin.launcher.config import LauncherConfigError
from nomad_plugin.launcher.process import LaunchError, LiveNode, Session
from nomad_plugin.nomad_view.types import DeviceGroup, InstanceStats, Style, aligned, fingerprint_text, stats_text

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "jobs" / "whole-card.nomad.hcl"
# The device block of examples/jobs/whole-card.nomad.hcl, for installs without the examples.
FALLBACK_JOB = """
job "whole-card" {
  group "smi" {
    task "nvidia-smi" {
      driver = "docker"
      resources {
        device "nvidia/gpu" {
          count = 1
          constraint {
            attribute = "${device.attr.memory}"
            operator  = ">="
            value     = "79 GiB"
          }
        }
      }
    }
  }
}
"""
# The same job for a node whose cards the example does not ask for: one whole card of its first group.
NODE_JOB = """
job "whole-card" {
  group "one-card" {
    task "main" {
      driver = "docker"
      resources {
        device "%s" {
          count = 1
        }
      }
    }
  }
}
"""
RECOVERY_DELAY = "2s"
POWER_NOTE = (
    "Power usage is the draw in mW over the draw in W, as nomad-device-nvidia (1.1.0 on) sends it whatever its\n"
    "unit says; xdm.Power draw and xdm.Power limit are in W (docs/stats.md)."
)


def parser() -> argparse.ArgumentParser:
    p = command_parser("demo", __doc__ or "")
    p.add_argument("--profile", default="h800-8", help="simulated node (default h800-8; see xdm-sim --help)")
    p.add_argument("--seconds", type=float, default=3.0, help="seconds of live stats to collect (default 3)")
    p.add_argument("--plugin", help="plugin executable to launch (default: this program)")
    p.add_argument("--json", action="store_true", help="print one JSON document instead of the tour")
    return p


class Tour:
    """The JSON document, and unless --json the tour printed as it goes."""

    def __init__(self, as_json: bool) -> None:
        self.as_json = as_json
        self.style = Style(sys.stdout)
        self.doc: dict[str, Any] = {"ok": False}
        self.t0 = time.monotonic()

    def section(self, title: str) -> None:
        if not self.as_json:
            sys.stdout.write("\n" + self.style(f"== {title}", "cyan", "bold") + "\n")

    def say(self, *lines: str) -> None:
        if not self.as_json:
            sys.stdout.write("".join(f"{line}\n" for line in lines))
            sys.stdout.flush()


def _reserve(tour: Tour, session: Session, groups: list[DeviceGroup]) -> list[str]:
    requests = parse_job_text(EXAMPLE.read_text() if EXAMPLE.is_file() else FALLBACK_JOB, "whole-card.nomad.hcl")
    (verdict,) = evaluate_job(requests, groups)
    source = "examples/jobs/whole-card.nomad.hcl"
    if not verdict.ok and groups:  # another vendor or a smaller card: the example, asking for this node's card
        why = "; ".join(reason for g in verdict.groups for reason in g.reasons) or "no group fits"
        (verdict,) = evaluate_job(parse_job_text(NODE_JOB % f"{groups[0].vendor}/{groups[0].type}", "demo"), groups)
        source = f"whole-card.nomad.hcl for this node's cards; as written it does not fit here: {why}"
    req = verdict.request
    if not verdict.ok or verdict.chosen is None:
        why = "; ".join(reason for g in verdict.groups for reason in g.reasons) or "the node has no device group"
        raise LaunchError(f"the example job does not fit the simulated node: {why}")
    tour.section(f'Job "{req.job}": device "{req.name}" count {req.count} ({source})')
    rule = verdict.chosen.rules[0].describe() if verdict.chosen.rules else "no constraints"
    tour.say(
        f"scheduler: group {verdict.chosen.group.full_name}, {rule}", f"picked IDs: {', '.join(verdict.picked_ids)}"
    )
    t = time.monotonic()
    res = session.plugin.reserve(list(verdict.picked_ids))
    ms = (time.monotonic() - t) * 1000
    tour.say(f"Reserve({', '.join(verdict.picked_ids)}) -> {ms:.1f} ms; the task gets:")
    tour.say(*aligned(sorted(res.envs.items()), "  env    "))
    tour.say(*(f"  device {host} -> {task} ({perm})" for task, host, perm in res.devices))
    tour.doc["reservation"] = {
        "job": req.job,
        "device": req.name,
        "group": verdict.chosen.group.full_name,
        "ids": list(verdict.picked_ids),
        "job_source": source,
        "reserve_ms": round(ms, 2),
        **res.to_json(),
    }
    return list(verdict.picked_ids)


def _stats(tour: Tour, session: Session, ids: list[str], seconds: float) -> None:
    stream = session.plugin.stats(interval=1.0)
    tour.section(f"nomad alloc status -stats  ({seconds:g} s of live stats, 1 s interval)")
    deadline = time.monotonic() + max(seconds, 1.0)
    samples: list[list[InstanceStats]] = []
    while time.monotonic() < deadline or not samples:
        hit = stream.wait_for(lambda batch: any(i.device_id in ids for i in batch), 5.0, after=len(stream))
        if hit is None:
            break
        mine = [i for i in hit[1] if i.device_id in ids]
        samples.append(mine)
        for inst in mine:
            summary = inst.summary.render() if inst.summary else "<none>"
            util = inst.stats.get("GPU utilization")
            tour.say(
                f"  t+{time.monotonic() - tour.t0:5.1f}s {inst.device_id}: {summary}, GPU {util.render() if util else 'N/A'}"
            )
    if not samples:
        raise LaunchError(f"no stats for {ids} within 5 s ({stream.error or 'stream silent'})")
    tour.say("", "Device Stats (latest):", *stats_text(samples[-1], tour.style))
    if any("Power usage" in i.stats for i in samples[-1]):
        tour.say("", POWER_NOTE)
    tour.doc["stats"] = {"samples": len(samples), "instances": [i.to_json() for i in samples[-1]]}


def _health_flip(tour: Tour, session: Session, sim: Any, reserved: list[str]) -> None:
    stream = session.fingerprints
    card = next(c for c in sim.cards if c.uuid not in reserved)
    reason = "XID 79: GPU has fallen off the bus (demo)"

    def health_of(groups: list[DeviceGroup]) -> bool | None:
        return next((d.healthy for g in groups for d in g.devices if d.id == card.uuid), None)

    tour.section(f"Health flip: card {card.minor} ({card.uuid}) reported unhealthy by XDM, then healthy again")
    start = len(stream)
    t = time.monotonic()
    sim.set_health(card.minor, False, reason)
    down = stream.wait_for(lambda g: health_of(g) is False, 10.0, after=start)
    if down is None:
        raise LaunchError("the fingerprint stream never showed the card unhealthy")
    down_s = down[0] - t
    desc = next(d.health_description for g in down[1] for d in g.devices if d.id == card.uuid)
    tour.say(f"  +{down_s:.3f} s  fingerprint: {card.uuid} unhealthy: {desc}")
    t2 = time.monotonic()
    sim.set_health(card.minor, True)
    up = stream.wait_for(lambda g: health_of(g) is True, 15.0, after=start + 1)
    if up is None:
        raise LaunchError("the card never became healthy again in the fingerprint stream")
    up_s = up[0] - t2
    tour.say(
        f"  +{up_s:.3f} s  fingerprint: {card.uuid} healthy again "
        f"(XDM said healthy at +0 s; eligible after health_recovery_delay = {RECOVERY_DELAY})"
    )
    tour.doc["health"] = {
        "device_id": card.uuid,
        "minor": card.minor,
        "reason": reason,
        "unhealthy_description": desc,
        "unhealthy_after_s": round(down_s, 3),
        "healthy_again_after_s": round(up_s, 3),
        "sequence": ["healthy", "unhealthy", "healthy"],
    }


def run(tour: Tour, profile: str, seconds: float, plugin: str | None) -> None:
    node = LiveNode(profile=profile, plugin=plugin, overrides=[f'health_recovery_delay="{RECOVERY_DELAY}"'])
    try:
        node.start()
        assert node.session is not None and node.tmp is not None
        session, sim, tmp = node.session, node.sim, node.tmp
        tour.doc["profile"] = sim.profile
        tour.section(
            f"XDM simulator: profile {sim.profile}, {len(sim.cards)} x {sim.cards[0].model}, sockets in {tmp / 's'}"
        )
        groups = node.devices()
        info = session.info
        tour.section("Plugin launched the way Nomad launches it")
        tour.say(
            f"  exec {' '.join(session.plugin.command)}  (NOMAD_PLUGIN_MAGIC_COOKIE, PLUGIN_PROTOCOL_VERSIONS=2)",
            f"  handshake {session.timings['handshake'] * 1000:.0f} ms; PluginInfo: {info.type} {info.name} "
            f"{info.version} (API {', '.join(info.api_versions)}); ConfigSchema; SetConfig x2 (msgpack, all options)",
            f"  first fingerprint with devices after {session.timings['first_devices'] * 1000:.0f} ms",
        )
        tour.doc["plugin"] = {"name": info.name, "version": info.version, "api_versions": list(info.api_versions)}
        tour.doc["timings_ms"] = {k: round(v * 1000, 1) for k, v in session.timings.items()}
        tour.section("nomad node status -verbose")
        tour.say(*fingerprint_text(groups, tour.style, with_devices=True))
        tour.doc["groups"] = [g.to_json() for g in groups]
        reserved = _reserve(tour, session, groups)
        _stats(tour, session, reserved, seconds)
        _health_flip(tour, session, sim, reserved)
    finally:
        used = node.tmp
        code = node.close()
        tour.doc["shutdown"] = {"plugin_exit_code": code, "temp_dir_removed": used is not None and not used.exists()}
    tour.section("Shutdown")
    tour.say(f"  GRPCController.Shutdown -> plugin exited with {code}; simulator stopped; {used} removed")


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    tour = Tour(args.json)
    try:
        run(tour, args.profile, args.seconds, args.plugin)
        tour.doc["ok"] = True
    except BrokenPipeError:  # the reader of the tour went away (demo | head): main stops quietly
        raise
    except (LaunchError, LauncherConfigError, ValueError, OSError) as exc:
        tour.doc["error"] = described(exc)
        fail("demo", described(exc), 1)
    tour.doc["elapsed_s"] = round(time.monotonic() - tour.t0, 2)
    if args.json:
        sys.stdout.write(json.dumps(tour.doc, indent=2) + "\n")
    else:
        tour.say(f"\ndone in {tour.doc['elapsed_s']:.1f} s" + ("" if tour.doc["ok"] else " (FAILED)"))
    return 0 if tour.doc["ok"] else 1
