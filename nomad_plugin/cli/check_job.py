"""``nomad-device-lingjun check-job JOB.hcl``: dry-run a job's device blocks against this node.

Gets the live fingerprint by launching the real plugin as Nomad would
(against XDM, a socket directory, or an embedded simulator with
``--profile``), then decides every ``device`` block as Nomad does (decoding,
job validation, the scheduler's device checks) and says Nomad's outcome:
it would place the job, refuse it at submission, or not place it on this
node, with the group that would serve each block and why every other group
was rejected. Exit status: 0 Nomad would place every block (and the plugin
would serve it), 1 Nomad would not place one on this node or the plugin
would refuse it at task start, 2 Nomad would refuse the job file, or a
usage, fingerprint or plugin error.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from nomad_plugin.jobspec import JobParseError, evaluate_job, parse_job_text
from nomad_plugin.jobspec.evaluate import OUTCOME_TEXT, PLACE, REFUSE, UNKNOWN, job_outcome
from nomad_plugin.jobspec.parse import go_strings
from nomad_plugin.jobspec.report import verdicts_json, verdicts_text
from nomad_plugin.launcher import LauncherConfigError, LaunchError
from nomad_plugin.launcher.live import LiveNode
from nomad_plugin.nomad_view.render import Style
from nomad_plugin.nomad_view.types import DeviceGroup, group_from_json

EPILOG = """\
examples:
  nomad-device-lingjun check-job examples/jobs/whole-card.nomad.hcl --profile h800-8
  nomad-device-lingjun check-job examples/jobs/tdm-share.nomad.hcl --profile h800-8 --set default_mode='"tdm"'
  nomad-device-lingjun check-job job.hcl --plugin-config /etc/nomad.d/plugin.hcl      # on a node
  nomad-device-lingjun fingerprint --json > fp.json; nomad-device-lingjun check-job job.hcl --fingerprint fp.json
"""


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="nomad-device-lingjun check-job",
        description=__doc__.split("\n\n")[1].replace("\n", " ") if __doc__ else None,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("job", help="the job file: HCL2, or JSON as `nomad job run -output` prints it")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--profile", help="start an embedded XDM simulator with this profile (e.g. h800-8)")
    src.add_argument("--socket-dir", help="XDM socket directory (dp2mgr.sock, config-daemon.sock)")
    src.add_argument("--fingerprint", metavar="FILE", help="a saved `fingerprint --json` instead of a live plugin")
    p.add_argument("--plugin-config", help="agent file with the plugin block (e.g. plugin.hcl)")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help='override a config option (HCL literal, e.g. default_mode="tdm")',
    )
    p.add_argument("--plugin", help="plugin executable to launch (default: this program)")
    p.add_argument("--timeout", type=float, default=20.0, help="seconds to wait for devices (default 20)")
    p.add_argument("--json", action="store_true", help="print one JSON document")
    return p


def _saved_fingerprint(path: str) -> list[DeviceGroup]:
    """A file written by ``fingerprint --json`` (or its ``groups`` list); ValueError when it is not one."""
    try:
        data = go_strings(json.loads(Path(path).read_text(encoding="utf-8")))
        groups = data["groups"] if isinstance(data, dict) else data
        return [group_from_json(g) for g in groups]
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"cannot read {path}: {exc}") from None
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as exc:
        raise ValueError(f"{path} is not a saved `fingerprint --json` ({type(exc).__name__}: {exc})") from None


EXIT = {PLACE: 0, REFUSE: 2, UNKNOWN: 2}  # anything else (not placed on this node): 1


def verdict_line(outcome: str, warned: bool) -> str:
    if outcome == PLACE and warned:
        return f"{OUTCOME_TEXT[PLACE]}, but the plugin would refuse it at task start (WARNING above)"
    return OUTCOME_TEXT[outcome]


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    if hasattr(sys.stdout, "reconfigure"):
        sys.stdout.reconfigure(errors="backslashreplace")  # any text a job holds prints on any terminal
    style = Style(sys.stdout)
    try:
        requests = parse_job_text(Path(args.job).read_text(encoding="utf-8"), args.job)
    except (OSError, UnicodeDecodeError, JobParseError) as exc:
        sys.stderr.write(f"check-job: {exc}\n")
        return 2
    config = None
    try:
        if args.fingerprint:
            groups, source = _saved_fingerprint(args.fingerprint), f"saved fingerprint {args.fingerprint}"
        else:
            node = LiveNode(args.plugin_config, args.set, args.profile, args.socket_dir, args.plugin)
            node.device_timeout = args.timeout
            with node:
                groups, source = node.devices(), node.source
                config = dict(node.config)
    except (LaunchError, LauncherConfigError, ValueError, KeyError, OSError) as exc:
        sys.stderr.write(f"check-job: cannot get the fingerprint: {exc}\n")
        return 2
    verdicts = evaluate_job(requests, groups, config)
    outcome = job_outcome(verdicts)  # a job without device blocks needs nothing from this node: placed
    warned = any(v.warnings for v in verdicts)
    ok = outcome == PLACE and not warned
    code = EXIT.get(outcome, 1) if not (outcome == PLACE and warned) else 1
    if args.json:
        doc = {
            "job_file": args.job,
            "fingerprint": {"source": source, "groups": [g.to_json() for g in groups]},
            "requests": verdicts_json(verdicts),
            "outcome": outcome,
            "verdict": verdict_line(outcome, warned),
            "ok": ok,
        }
        sys.stdout.write(json.dumps(doc, indent=2) + "\n")
        return code
    devices = sum(len(g.devices) for g in groups)
    lines = [
        f"{args.job}: {len(requests)} device block(s); fingerprint: {len(groups)} group(s), {devices} devices ({source})",
        "",
    ]
    lines += verdicts_text(verdicts, style)
    verdict = verdict_line(outcome, warned)
    if not requests:
        verdict += ": the job has no device blocks, it asks nothing of this plugin"
    lines.append(style(verdict, "green" if ok else "red", "bold"))
    sys.stdout.write("\n".join(lines) + "\n")
    return code
